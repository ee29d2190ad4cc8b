// Planning of kernel launches: from an NCCL call to ReduceArgs / CopyArgs.
#include <cstdint>
#include <vector>
#include <algorithm>
#include <atomic>
#include <cstring>

#include "coll/algo.h"
#include "coll/coll_state.h"
#include "coll/launch_plan.h"
#include "coll/redop.h"
#include "coll/zc_plan.h"
#include "base/checks.h"
#include "comm/comm.h"
#include "base/param.h"
#include "base/scratch.h"
#include "transport/peer_mem.h"

namespace mk {

cudaError_t launchReduceKernel(const ReduceArgs& a, int grid, cudaStream_t s) {
  switch (dtFamily(a.dtype)) {
    case kFamInt:
      return launchReduceInt(a, grid, s);
    case kFamFloat:
      return launchReduceFloat(a, grid, s);
    case kFamLowp:
      return launchReduceLowp(a, grid, s);
    default:
      return cudaErrorInvalidValue;
  }
}

namespace {

constexpr size_t kStreamStateBytes = 16;  // dev::StreamState

int localOf(ncclComm* comm, int rank) {
  const auto& m = comm->topo.rankToLocalRank;
  return rank >= 0 && rank < (int)m.size() ? m[rank] : rank;
}

}  // namespace

Algo collForcedAlgo() {
  static std::atomic<bool> warned{false};
  bool ok = true;
  const char* s = MK_PARAM_STR(Algo);
  Algo a = parseAlgo(s, &ok);
  if (!ok && !warned.exchange(true))
    MK_WARN(
        "MKERNEL_ALGO=%s is not one of oneshot, twoshot, ring, zerocopy; choosing automatically",
        s);
  return a;
}

namespace {

struct Xfer {
  int dir;   // CopyDir
  int peer;  // local index (send/recv)
  const void* src;
  void* dst;
  uint64_t bytes;
};

// The device-sized blocks of AlltoAll `a` (CollArgs::sized), for the copy kernel.
void copyUnits(ncclComm* comm, const CollArgs& a, CopyUnits* u) {
  *u = CopyUnits{};
  if (a.type != CollType::kAlltoAll || !a.sized.on()) return;
  u->s = a.sized;
  u->meRank = (int16_t)comm->rank;
  for (int q = 0; q < comm->nRanks; q++) {
    const int l = localOf(comm, q);
    if (l >= 0 && l < kMaxLocalRanks) u->rankOf[l] = (int16_t)q;
  }
}

template <typename Args>
void fillCopy(ncclComm* comm, CollType coll, const std::vector<CopyOp>& ops,
              const std::vector<uint32_t>& streams, const CollArgs* sized, Args* a) {
  a->c = collCommDev(comm);
  a->coll = (int)coll;
  a->nOps = (int)ops.size();
  a->nStreams = (int)streams.size();
  std::copy(ops.begin(), ops.end(), a->ops);
  std::copy(streams.begin(), streams.end(), a->streams);
  if (sized) copyUnits(comm, *sized, &a->u);
}

ncclResult_t buildCopy(ncclComm* comm, CollType coll, const std::vector<Xfer>& xf,
                       KernelLaunch* out, bool* empty, const CollArgs* sized = nullptr) {
  CollState* cs = comm->coll;
  const WsLayout& ws = cs->ws;
  std::vector<CopyOp> ops;
  uint64_t localBytes = 0;
  for (const Xfer& x : xf) {
    if (x.bytes == 0) continue;
    CopyOp op{};
    op.src = x.src;
    op.dst = x.dst;
    op.bytes = x.bytes;
    op.dir = (int16_t)x.dir;
    op.peer = (int16_t)(x.dir == kDirLocal ? -1 : x.peer);
    if (x.dir == kDirLocal) {
      if (x.src == x.dst) continue;  // in place
      localBytes += x.bytes;
    } else {
      op.chunkBytes = copyChunkBytes(x.bytes, ws);
      uint64_t nc = (x.bytes + op.chunkBytes - 1) / op.chunkBytes;
      if (nc > 0xffffffffull) {
        MK_WARN("nccl%s: transfer of %llu bytes is too large", collName(coll),
                (unsigned long long)x.bytes);
        return ncclInvalidArgument;
      }
      op.nChunks = (uint32_t)nc;
    }
    ops.push_back(op);
  }
  *empty = ops.empty();
  if (*empty) return ncclSuccess;
  if ((int)ops.size() > kCopyLargeOps) {
    MK_WARN(
        "nccl%s: %zu transfers of one comm in one group; at most %d are supported per "
        "ncclGroupStart/End",
        collName(coll), ops.size(), kCopyLargeOps);
    return ncclInvalidUsage;
  }
  // One stream per (peer, direction, lane) that has at least one chunk.
  std::vector<int> lanes(2 * (size_t)ws.nLocal, 0);
  for (const CopyOp& op : ops) {
    if (op.dir == kDirLocal) continue;
    int& l = lanes[(size_t)op.dir * ws.nLocal + op.peer];
    l = std::max<int>(l, (int)std::min<uint64_t>(ws.p2pLanes, op.nChunks));
  }
  std::vector<uint32_t> streams;
  for (int lane = 0; lane < ws.p2pLanes; lane++)  // lane-major: spreads peers over CTAs
    for (int dir = 0; dir < 2; dir++)
      for (int p = 0; p < ws.nLocal; p++)
        if (lanes[(size_t)dir * ws.nLocal + p] > lane) streams.push_back(packStream(p, dir, lane));
  if ((int)streams.size() > kCopyLargeStreams) {
    MK_WARN("nccl%s: %zu transfer streams exceed the limit of %d", collName(coll), streams.size(),
            kCopyLargeStreams);
    return ncclInternalError;
  }
  int work = (int)streams.size();
  if (localBytes > 0)
    work =
        std::max<int>(work, (int)std::min<uint64_t>(cs->budget.hi, localBytes / (512 << 10) + 1));
  out->coll = coll;
  out->grid = ctaGrid(cs->budget, std::max(work, 1));
  size_t perCta = (streams.size() + out->grid - 1) / out->grid;
  out->smem = std::max<size_t>(perCta, 1) * kStreamStateBytes;
  if ((int)ops.size() <= kCopySmallOps && (int)streams.size() <= kCopySmallStreams) {
    out->kind = KernelLaunch::kCopySmall;
    out->small.reset(new CopyArgsSmall());
    fillCopy(comm, coll, ops, streams, sized, out->small.get());
  } else {
    out->kind = KernelLaunch::kCopyLarge;
    out->large.reset(new CopyArgsLarge());
    fillCopy(comm, coll, ops, streams, sized, out->large.get());
  }
  return ncclSuccess;
}

ncclResult_t planReduction(ncclComm* comm, const CollArgs& a, KernelLaunch* out, bool* empty) {
  CollState* cs = comm->coll;
  const char* api = collName(a.type);
  const size_t es = dtypeSize(a.dtype);
  const int n = cs->ws.nLocal;
  const RedOpInfo& info = a.red;  // resolved at call time (the op may be destroyed by now)
  bool needRecv = a.type != CollType::kReduce || comm->rank == a.root;
  MK_ARGCHECK((uintptr_t)a.sendbuff % es == 0,
              "nccl%s: sendbuff %p is not aligned to its %zu-byte elements", api, a.sendbuff, es);
  MK_ARGCHECK(!needRecv || (uintptr_t)a.recvbuff % es == 0,
              "nccl%s: recvbuff %p is not aligned to its %zu-byte elements", api, a.recvbuff, es);
  Algo algo = Algo::kDirect;
  // One process, one GPU: the AllReduce reads and writes the peers' buffers directly,
  // registered or not (the model decides); otherwise registered buffers and windows.
  if (a.type == CollType::kAllReduce)
    algo = allReduceAlgo(a.count * es, n, collForcedAlgo(), cs->zeroCopy);
  ZcPlan zc;
  if (algo != Algo::kZeroCopy) NCCLCHECK(zcPlan(comm, a, &zc));
  if (zc.on) algo = Algo::kZeroCopy;
  ReducePlan p = planReduce(a.type, algo, a.count, es, n, cs->ws);
  *empty = p.nChunks == 0;
  if (*empty) return ncclSuccess;
  if (p.algo == Algo::kZeroCopy) zcCount(a.type);
  ReduceArgs& r = out->red;
  r = ReduceArgs{};
  r.c = collCommDev(comm);
  r.coll = (int)a.type;
  r.algo = (int)p.algo;
  r.dtype = (int)a.dtype;
  r.send = a.sendbuff;
  r.recv = a.recvbuff;
  r.count = a.count;
  r.segElems = p.segElems;
  r.chunkElems = p.chunkElems;
  r.nChunks = p.nChunks;
  r.lanes = p.lanes;
  r.root = a.type == CollType::kReduce ? localOf(comm, a.root) : -1;
  r.zc = zc.bufs;  // kZcRaw unless zcPlan found the buffers (the AllReduce of one process)
  switch (info.builtin) {
    case ncclSum:
      r.red = kRedSum;
      break;
    case ncclProd:
      r.red = kRedProd;
      break;
    case ncclMax:
      r.red = kRedMax;
      break;
    case ncclMin:
      r.red = kRedMin;
      break;
    case ncclAvg:
      r.red = kRedSum;
      r.postDiv = comm->nRanks;
      break;
    default:  // PreMulSum: the op's description is copied now; destroying it later is safe
      r.red = kRedSum;
      r.premul = 1;
      r.scalarOnDevice = info.scalarOnDevice ? 1 : 0;
      r.scalarPtr = info.scalarPtr;
      r.scalarBits = info.scalarBits;
      break;
  }
  out->kind = KernelLaunch::kReduce;
  out->coll = a.type;
  out->grid = ctaGrid(cs->budget, p.lanes);
  if (p.algo == Algo::kZeroCopy) {
    // One CTA per 256 KiB this rank reads and writes, within the budget. Sized by my share
    // alone (what I write), a 2 MiB ReduceScatter got 3 CTAs for 2.5 MB of traffic and took
    // 1.3x the staged path's time (session 20, coll_bench --reg 2). Reduce: the root reduces
    // everything, the others only take part in the handshake.
    const uint64_t share = a.type != CollType::kReduce ? p.segElems * es
                           : comm->rank == a.root      ? a.count * es
                                                       : 0;
    const uint64_t writes = a.type == CollType::kAllReduce ? (uint64_t)n : 1;
    const uint64_t moved = share * ((uint64_t)n + writes);
    out->grid = ctaGrid(cs->budget, (int)std::min<uint64_t>(1 << 20, moved / (256 << 10) + 1));
  }
  MK_INFO(kColl,
          "nccl%s: rank %d count %zu dtype %d op %d root %d algo %s%s chunk %llu x %llu lanes "
          "%d grid %d",
          api, comm->rank, a.count, (int)a.dtype, (int)a.op, a.root, algoName(p.algo),
          p.algo == Algo::kZeroCopy ? zcModeName(r.zc.mode) : "", (unsigned long long)p.chunkElems,
          (unsigned long long)p.nChunks, p.lanes, out->grid);
  return ncclSuccess;
}

}  // namespace

// One rank: the result is the input (sum/prod/max/min/avg of one value is that value).
// Returns false for PreMulSum (it scales): the reduction kernel does that one.
static bool planOneRank(const CollArgs& a, const CtaBudget& budget, KernelLaunch* out,
                        bool* empty) {
  const bool reduces = a.type == CollType::kAllReduce || a.type == CollType::kReduce ||
                       a.type == CollType::kReduceScatter;
  if (reduces && a.red.builtin >= ncclNumOps) return false;
  out->kind = KernelLaunch::kMemcpy;
  out->coll = a.type;
  out->mcSrc = a.sendbuff;
  out->mcDst = a.recvbuff;
  out->mcBytes = a.count * dtypeSize(a.dtype);
  out->grid = ctaGrid(budget, (int)std::min<uint64_t>(1 << 20, out->mcBytes / (256 << 10) + 1));
  *empty = out->mcBytes == 0 || out->mcSrc == out->mcDst;
  return true;
}

// A copy collective on zero-copy buffers (coll/zc_plan.h: registered buffers, windows, or in
// one process on one GPU any AllGather buffers): one kernel that copies between this rank's
// and its peers' buffers, no staging.
static void planZcCopy(ncclComm* comm, const CollArgs& a, const ZcPlan& zc, KernelLaunch* out) {
  CollState* cs = comm->coll;
  const int n = cs->ws.nLocal;
  const uint64_t B = (uint64_t)a.count * dtypeSize(a.dtype);
  const bool rooted = a.type != CollType::kAllGather && a.type != CollType::kAlltoAll;
  ZcCopyArgs& z = out->zc;
  z = ZcCopyArgs{};
  z.c = collCommDev(comm);
  z.coll = (int)a.type;
  z.root = rooted ? localOf(comm, a.root) : -1;
  z.bytes = B;
  z.send = a.sendbuff;
  z.recv = a.recvbuff;
  z.zc = zc.bufs;
  // Bytes this rank copies: all n blocks (AllGather, AlltoAll, the root), or none.
  const uint64_t mine = !rooted || comm->rank == a.root ? (uint64_t)n * B : 0;
  out->kind = KernelLaunch::kZcCopy;
  out->coll = a.type;
  out->grid = ctaGrid(cs->budget, (int)std::min<uint64_t>(1 << 20, mine / (256 << 10) + 1));
  zcCount(a.type);
  MK_INFO(kColl, "nccl%s: rank %d count %zu bytes %llu root %d algo zerocopy%s grid %d",
          collName(a.type), comm->rank, a.count, (unsigned long long)B, a.root,
          zcModeName(zc.bufs.mode), out->grid);
}

ncclResult_t planColl(ncclComm* comm, const CollArgs& a, KernelLaunch* out, bool* empty) {
  if (comm->nRanks == 1 && planOneRank(a, comm->coll->budget, out, empty)) return ncclSuccess;
  if (a.type == CollType::kAllReduce || a.type == CollType::kReduce ||
      a.type == CollType::kReduceScatter)
    return planReduction(comm, a, out, empty);
  const int n = comm->nRanks, me = comm->rank;
  const uint64_t B = (uint64_t)a.count * dtypeSize(a.dtype);
  if (B > 0) {
    ZcPlan zc;
    NCCLCHECK(zcPlan(comm, a, &zc));
    if (zc.on) {
      planZcCopy(comm, a, zc, out);
      *empty = false;
      return ncclSuccess;
    }
  }
  const char* sb = (const char*)a.sendbuff;
  char* rb = (char*)a.recvbuff;
  std::vector<Xfer> x;
  auto send = [&](int q, const void* p) {
    x.push_back({kDirSend, localOf(comm, q), p, nullptr, B});
  };
  auto recv = [&](int q, void* p) { x.push_back({kDirRecv, localOf(comm, q), nullptr, p, B}); };
  auto local = [&](void* d, const void* s) { x.push_back({kDirLocal, -1, s, d, B}); };
  const int R = a.root;
  switch (a.type) {
    case CollType::kBroadcast:
      if (me == R) {
        for (int q = 0; q < n; q++)
          if (q != R) send(q, sb);
        local(rb, sb);
      } else {
        recv(R, rb);
      }
      break;
    case CollType::kAllGather:
      for (int q = 0; q < n; q++)
        if (q != me) {
          send(q, sb);
          recv(q, rb + q * B);
        }
      local(rb + me * B, sb);
      break;
    case CollType::kAlltoAll:
      for (int q = 0; q < n; q++)
        if (q != me) {
          send(q, sb + q * B);
          recv(q, rb + q * B);
        }
      local(rb + me * B, sb + me * B);
      // Receives land in blocks that may still be being sent: stage the input first.
      if (n > 1 && B > 0 && sb < rb + n * B && rb < sb + n * B) {
        out->stageBase = sb;
        out->stageBytes = n * B;
      }
      break;
    case CollType::kGather:
      if (me == R) {
        for (int q = 0; q < n; q++)
          if (q != R) recv(q, rb + q * B);
        local(rb + R * B, sb);
      } else {
        send(R, sb);
      }
      break;
    case CollType::kScatter:
      if (me == R) {
        for (int q = 0; q < n; q++)
          if (q != R) send(q, sb + q * B);
        local(rb, sb + R * B);
      } else {
        recv(R, rb);
      }
      break;
    default:
      MK_WARN("planColl: unexpected operation %s", collName(a.type));
      return ncclInternalError;
  }
  NCCLCHECK(buildCopy(comm, a.type, x, out, empty, &a));
  if (!*empty)
    MK_INFO(kColl, "nccl%s: rank %d count %zu bytes %llu root %d grid %d", collName(a.type),
            comm->rank, a.count, (unsigned long long)B, a.root, out->grid);
  return ncclSuccess;
}

ncclResult_t planP2p(ncclComm* comm, const std::vector<CollArgs>& ops, KernelLaunch* out,
                     bool* empty) {
  std::vector<Xfer> x;
  std::vector<const CollArgs*> selfSend, selfRecv;
  for (const CollArgs& a : ops) {
    uint64_t B = (uint64_t)a.count * dtypeSize(a.dtype);
    if (B == 0) continue;
    if (a.root == comm->rank) {
      (a.type == CollType::kSend ? selfSend : selfRecv).push_back(&a);
      continue;
    }
    if (a.type == CollType::kSend)
      x.push_back({kDirSend, localOf(comm, a.root), a.sendbuff, nullptr, B});
    else
      x.push_back({kDirRecv, localOf(comm, a.root), nullptr, a.recvbuff, B});
  }
  // Send/receive to self: the i-th send pairs with the i-th receive.
  if (selfSend.size() != selfRecv.size()) {
    MK_WARN("ncclSend/ncclRecv: rank %d posted %zu sends to itself but %zu receives from itself",
            comm->rank, selfSend.size(), selfRecv.size());
    return ncclInvalidUsage;
  }
  for (size_t i = 0; i < selfSend.size(); i++) {
    uint64_t bs = (uint64_t)selfSend[i]->count * dtypeSize(selfSend[i]->dtype);
    uint64_t br = (uint64_t)selfRecv[i]->count * dtypeSize(selfRecv[i]->dtype);
    if (bs != br) {
      MK_WARN("ncclSend/ncclRecv: rank %d sends %llu bytes to itself but receives %llu", comm->rank,
              (unsigned long long)bs, (unsigned long long)br);
      return ncclInvalidUsage;
    }
    x.push_back({kDirLocal, -1, selfSend[i]->sendbuff, selfRecv[i]->recvbuff, bs});
  }
  NCCLCHECK(buildCopy(comm, CollType::kSend, x, out, empty));
  if (!*empty)
    MK_INFO(kColl | kP2p, "ncclSend/Recv: rank %d %zu operations grid %d", comm->rank, x.size(),
            out->grid);
  return ncclSuccess;
}

namespace {
template <typename Args>
void rebase(Args* a, const char* base, size_t bytes, const char* tmp) {
  for (int i = 0; i < a->nOps; i++) {
    const char* s = (const char*)a->ops[i].src;
    if (s && s >= base && s < base + bytes) a->ops[i].src = tmp + (s - base);
  }
}
}  // namespace

ncclResult_t runLaunch(ncclComm* comm, KernelLaunch& l, cudaStream_t s) {
  cudaError_t err = cudaSuccess;
  void* tmp = nullptr;
  if (l.stageBytes > 0) {
    NCCLCHECK(scratchAlloc(&tmp, l.stageBytes, comm->cudaDev, s));
    const cudaError_t ce =
        cudaMemcpyAsync(tmp, l.stageBase, l.stageBytes, cudaMemcpyDeviceToDevice, s);
    if (ce != cudaSuccess) {
      MK_WARN("nccl%s: rank %d: staging copy failed: %s", collName(l.coll), comm->rank,
              cudaGetErrorString(ce));
      (void)scratchFree(tmp, s);
      return ncclUnhandledCudaError;
    }
    if (l.small) rebase(l.small.get(), l.stageBase, l.stageBytes, (const char*)tmp);
    if (l.large) rebase(l.large.get(), l.stageBase, l.stageBytes, (const char*)tmp);
  }
  switch (l.kind) {
    case KernelLaunch::kReduce:
      err = launchReduceKernel(l.red, l.grid, s);
      break;
    case KernelLaunch::kCopySmall:
      err = launchCopySmall(*l.small, l.grid, l.smem, s);
      break;
    case KernelLaunch::kCopyLarge:
      err = launchCopyLarge(*l.large, l.grid, l.smem, s);
      break;
    case KernelLaunch::kMemcpy:
      err = launchOneRankCopy(l.mcDst, l.mcSrc, l.mcBytes, l.grid, s);
      break;
    case KernelLaunch::kZcCopy:
      err = launchZcCopy(l.zc, l.grid, s);
      break;
  }
  const ncclResult_t freed = tmp ? scratchFree(tmp, s) : ncclSuccess;
  if (err != cudaSuccess) {
    MK_WARN("nccl%s: rank %d: kernel launch failed: %s", collName(l.coll), comm->rank,
            cudaGetErrorString(err));
    return ncclUnhandledCudaError;
  }
  return freed;
}

}  // namespace mk
