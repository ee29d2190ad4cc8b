// Host side of the fused MoE kernel on a comm spanning (virtual) nodes (xnode_kernel.cuh; the
// stream layout in moe_xnode.h): eligibility, the AllToAll path's first steps, the layout
// kernel, the GEMMs' parameters with their row hooks, the scratch and the launch through the
// comm's enqueue path.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <cuda_runtime.h>

#include "base/checks.h"
#include "base/debug.h"
#include "base/param.h"
#include "base/scratch.h"
#include "comm/comm.h"
#include "fused/core/fused_comm.h"
#include "fused/core/trace.h"
#include "fused/gemm/dtype_built.h"
#include "fused/gemm/gemm.h"
#include "fused/ops/gemm_coll/gemm_coll_util.h"
#include "fused/ops/moe/a2a.h"
#include "fused/ops/moe/moe.h"
#include "fused/ops/moe/xnode_launch.cuh"

namespace mk {
namespace fused {

namespace {

std::atomic<uint64_t> gXnLaunches{0};

// ---- MKERNEL_FUSED_TRACE: per role, when its parts ended and where its time went ------------
struct MxTrace {
  uint64_t* stamps;  // [grid][kTraceMaxWords] (mxdev::TraceWord)
  const char* api;
  int rank, grid, nComm, nSend, nUnpack;
};

void CUDART_CB mxTracePrint(void* arg) {
  std::unique_ptr<MxTrace> t(static_cast<MxTrace*>(arg));
  const volatile uint64_t* st = t->stamps;
  const int w = kTraceMaxWords;
  uint64_t t0 = ~0ull;
  for (int b = 0; b < t->grid; ++b) t0 = std::min(t0, (uint64_t)st[w * b + mxdev::kTwStart]);
  // Row `grid`: the front's start and the layout kernel's (xnode.cu), before t0.
  const uint64_t fr = st[w * t->grid], lay = st[w * t->grid + 1];
  auto before = [&](uint64_t v) { return v != 0 && v < t0 ? (double)(t0 - v) * 1e-3 : 0.0; };
  // Per role (send, land, unpack, compute): the last stamp of each part and the end, the sums
  // of the wait words and of the bytes word.
  struct Role {
    int ctas = 0;
    uint64_t last[4] = {0, 0, 0, 0};  // parts 1-3, end (ns after t0)
    uint64_t wait = 0, wait2 = 0, bytes = 0;
  } r[4];
  for (int b = 0; b < t->grid; ++b) {
    const int k = b < t->nSend ? 0 : b < t->nComm ? 1 : b < t->nComm + t->nUnpack ? 2 : 3;
    Role& x = r[k];
    ++x.ctas;
    for (int i = 0; i < 4; ++i) {
      const uint64_t v = st[w * b + mxdev::kTwPart1 + i];
      if (v > t0) x.last[i] = std::max(x.last[i], v - t0);
    }
    x.wait += st[w * b + mxdev::kTwWait];
    x.wait2 += st[w * b + mxdev::kTwWait2];
    x.bytes += st[w * b + mxdev::kTwBytes];
  }
  auto us = [](uint64_t ns) { return (double)ns * 1e-3; };
  fprintf(stderr,
          "[mkernel fused trace] %s rank %d (%d CTAs; us after the first CTA's start, "
          "%.1f us mod 1 s; the front started %.1f us before it, the layout kernel %.1f):\n"
          "  send %d: dispatch %.1f fan %.1f return %.1f end %.1f; in puts %.1f, waiting for "
          "GEMM2 rows %.1f (sums over CTAs); %.1f MB put\n"
          "  land %d: dispatch %.1f fan %.1f return %.1f end %.1f; waiting for data %.1f, "
          "copying %.1f; %.1f MB landed\n"
          "  unpack %d: units %.1f GEMMs %.1f combine %.1f end %.1f; waiting for landing %.1f; "
          "%llu records\n"
          "  compute %d: GEMMs %.1f combine %.1f end %.1f\n",
          t->api, t->rank, t->grid, (double)(t0 % 1000000000ull) * 1e-3, before(fr), before(lay),
          r[0].ctas, us(r[0].last[0]), us(r[0].last[1]), us(r[0].last[2]), us(r[0].last[3]),
          us(r[0].wait), us(r[0].wait2), r[0].bytes * 1e-6, r[1].ctas, us(r[1].last[0]),
          us(r[1].last[1]), us(r[1].last[2]), us(r[1].last[3]), us(r[1].wait), us(r[1].wait2),
          r[1].bytes * 1e-6, r[2].ctas, us(r[2].last[0]), us(r[2].last[1]), us(r[2].last[2]),
          us(r[2].last[3]), us(r[2].wait), (unsigned long long)r[2].bytes, r[3].ctas,
          us(r[3].last[0]), us(r[3].last[2]), us(r[3].last[3]));
  traceRelease(t->stamps);
}

void sayOnce(std::atomic<bool>* said, const char* api, const char* why) {
  if (!said->exchange(true))
    MK_INFO(kFused,
            "%s: no fused kernel across nodes for this call (%s); running the AllToAll path", api,
            why);
}

// One CTA, after the counts' AllToAll: the packed layout from the received counts (the
// AllToAll path's recvLayout), its tables for the fused kernel, the caller's counts and offsets
// (0 on overflow), -1 sources on padding rows, and each expert's padding rows counted on its
// last tile (the fused GEMM loads a tile once its counter reaches kTileM; each expert's last
// tile is its own, so one thread per expert adds without atomics).
__global__ void __launch_bounds__(kA2aThreads)
    moeXnLayoutKernel(const __grid_constant__ A2aParams p, int32_t* srcRowOut, int32_t* recvOut,
                      MxLayout* lay, uint64_t* tileReady, uint64_t* stamp) {
  if (stamp != nullptr && threadIdx.x == 0) *stamp = ptx::globalTimerNs();
  extern __shared__ int32_t dyn[];  // srcRow[n*epr], recv[n*epr]
  __shared__ RecvLayout L;
  const int n = p.s.nRanks, epr = p.s.expertsPerRank;
  recvLayout(p, L, dyn, dyn + n * epr);
  for (int i = threadIdx.x; i < n * epr; i += blockDim.x) {
    srcRowOut[i] = dyn[i];
    recvOut[i] = dyn[n * epr + i];
  }
  for (int le = threadIdx.x; le <= epr; le += blockDim.x) {
    p.recv.expertOffset[le] = L.ovf ? 0 : L.start[le];
    if (le == epr) continue;
    p.recv.expertCount[le] = L.ovf ? 0 : L.count[le];
    const int64_t end = (int64_t)L.start[le] + L.count[le], padEnd = L.start[le + 1];
    if (!L.ovf && padEnd > end) tileReady[(padEnd - 1) / gemm::kTileM] += (uint64_t)(padEnd - end);
  }
  if (!L.ovf && p.recv.rowSource != nullptr)
    for (int le = 0; le < epr; ++le)
      for (int64_t r = L.start[le] + L.count[le] + threadIdx.x; r < L.start[le + 1];
           r += blockDim.x)
        for (int c = 0; c < 3; ++c) p.recv.rowSource[r * 3 + c] = -1;
  // The node dedup: the fan records every local rank should forward, unclamped, which the
  // call's report compares with what this rank's receive CTAs counted (a2aReportErrors).
  const MoeNodeMap& m = p.node;
  for (int q = threadIdx.x; m.rail && q < n; q += blockDim.x) {
    const bool local = m.nodeOf[q] == m.nodeOf[m.me];
    const int64_t raw = local ? moeFanOut(m, p.recvCnt, epr, m.localOf[q], INT64_MAX) : 0;
    p.fanUnits[2 * n + q] = raw > INT32_MAX ? INT32_MAX : raw < 0 ? -1 : (int32_t)raw;
  }
  if (threadIdx.x == 0) {
    lay->span = L.span;
    lay->ovf = L.ovf;
    lay->otherMax = L.otherMax;
  }
}

// MKERNEL_FUSED_TRACE: when the call's first step (the AllToAll path's pack) may start.
__global__ void moeXnStampKernel(uint64_t* stamp) {
  *stamp = ptx::globalTimerNs();
}

// The verdict every rank shares (the layout, the agreed parameters and window size, the call's
// shape and config): the plan, or !ok with the reason.
MxPlan planOf(const MoeCall& c, const FusedComm& f, bool rail, const char** why) {
  const ncclComm* comm = c.comm;
  const int n = comm->nRanks;
  *why = nullptr;
  if (MK_PARAM_INT(FusedXnode) == 0) {
    *why = "MKERNEL_FUSED_XNODE=0";
  } else if (!f.hasNet) {
    *why = "the comm has no net view";
  } else if (n > kGxMaxRanks) {
    *why = "more ranks than the xnode protocol's signal slots";
  } else if (fusedLeastShare(comm) < 3) {
    *why = "fewer than 3 SMs a rank (a send, a receive and a GEMM CTA)";
  } else if (c.ffn && !moeSwigluInGemm(c)) {
    *why =
        "the layer's GEMM1 applies SwiGLU in its epilogue only with w1 in the [N,K] layout and "
        "MKERNEL_MOE_SWIGLU_EPILOGUE=1";
  } else if ((2 * (size_t)c.E + kMoeNodeMaxLocal + 2 * (size_t)n) * sizeof(int32_t) >
             (size_t)gemm::GroupPipe::kSmemBytes) {
    *why = "the layout tables of this many experts exceed the shared memory";
  }
  if (*why != nullptr) return MxPlan{};
  const MxPlan pl = mxPlan(f.net.windowBytes, n, (int64_t)c.H * fusedTypeSize(c.inType), c.k,
                           (int64_t)c.H, c.ffn, rail);
  if (!pl.ok) *why = "a record or return row does not fit half a window area (MKERNEL_NET_WINDOW)";
  return pl;
}

}  // namespace

uint64_t moeXnodeLaunches() {
  return gXnLaunches.load();
}

ncclResult_t moeXnodeRun(const MoeCall& c, bool* ran) {
  *ran = false;
  ncclComm* comm = c.comm;
  const char* api = moeApi(c);
  if (comm->topo.nNodes < 2) return ncclSuccess;
  FusedComm f;
  NCCLCHECK(fusedCommView(comm, rt::kOpMoe, &f));
  // The node dedup as on the AllToAll path (MKERNEL_MOE_NODE_DEDUP, the comm's nodes: every
  // rank alike).
  MoeXnParams p{};
  NCCLCHECK(moeA2aParams(c, &p.a));
  A2aParams& a = p.a;
  const bool rail = a.node.rail != 0;
  const char* why = nullptr;
  const MxPlan pl = planOf(c, f, rail, &why);
  if (!pl.ok) {
    static std::atomic<bool> said{false};
    sayOnce(&said, api, why);
    return ncclSuccess;
  }
  const int n = comm->nRanks, epr = c.E / n;
  // The grid is private to the rank (its share of the GPU among this process's live comms).
  // At least 3 CTAs (a send, a receive and a GEMM CTA) even where sibling comms leave this one
  // less (more than SMs / 3 ranks of this process on the GPU): the verdict above is shared by
  // the ranks and may not depend on that private count.
  const int budget = std::max(3, std::min(fusedOwnShare(comm), (int)fusedGpuShare(comm)));
  const int nComm = mxCommCtas(budget, n, c.cfg.commSms);
  const int nUnpack = mxUnpackCtas(budget, nComm);

  a.recBytes = pl.recBytes;
  a.out = c.buf.out;
  a.y = c.yOut;
  p.plan = pl;
  p.net = f.net;
  p.net.w = f.c.w;  // failures land in the operator's domain: its GEMM waits see them
  p.xcalls = f.net.sigLocal + kGxSigSeq;
  p.nComm = nComm;
  p.nUnpack = nUnpack;
  p.outType = (int32_t)gemmType(c.cfg.outType);

  // The GEMMs as the AllToAll path builds them (canImplement, kernels preloaded), with the
  // row hooks: GEMM1 waits for landed rows; the layer's GEMM2 for GEMM1's row blocks.
  gemm::GemmArgs g1, g2;
  if (c.ffn) {
    NCCLCHECK(moeGemm(c, c.recv.xRecv, c.w1, 2 * c.I, c.H, c.buf.act, c.inType, &g1, true));
    NCCLCHECK(moeGemm(c, c.buf.act, c.w2, c.H, c.I, c.buf.out, ncclFloat32, &g2));
    moeRowHooks(&g1, f, gemm::kTileM, false, false);
    moeRowHooks(&g2, f, (uint64_t)gemm::tilesN(g1), false, false);
    p.tilesN2 = gemm::tilesN(g2);
  } else {
    NCCLCHECK(moeGemm(c, c.recv.xRecv, c.w1, c.N, c.H, c.recv.y, c.cfg.outType, &g1));
    moeRowHooks(&g1, f, gemm::kTileM, false, false);
    g1.hooks.tileDoneRows = false;  // nothing reads the dispatch GEMM's tiles
  }
  g1.smBudget = g2.smBudget = budget - nComm;
  const bool kn = c.cfg.wLayout == ncclFusedLayoutKN;
  auto launch = [&](int grid, cudaStream_t s) -> ncclResult_t {
    const gemm::DType out = gemmType(c.cfg.outType);
    return gemm::byInType(gemmType(c.inType), api, [&](auto in) {
      constexpr gemm::DType kIn = decltype(in)::value;
      return c.ffn ? moeXnodeLaunchFfn<kIn>(p, grid, s)
                   : moeXnodeLaunchDispatch<kIn>(p, out, kn, grid, s);
    });
  };
  // Every kernel loaded before the first launch: a lazy load can wait behind running kernels,
  // and peers' kernels (ranks of this process on emulated nodes) wait for this rank's.
  NCCLCHECK(moeA2aFrontPreload());
  {
    cudaFuncAttributes attr;
    CUDACHECK(cudaFuncGetAttributes(&attr, moeXnLayoutKernel));
  }
  NCCLCHECK(launch(0, nullptr));
  // Refused here, before the counts' AllToAll its peers' kernels depend on, rather than at the
  // launch (a cooperative grid the device cannot hold at once: e.g. an MPS thread limit).
  NCCLCHECK(launch(-budget, nullptr));

  // Scratch, stream-ordered (graph memory nodes under capture): the AllToAll path's routing
  // state and records, the layout tables, then the counters zeroed per call, then the return
  // rows (the layer).
  const int64_t tiles =
      std::max<int64_t>(1, ((int64_t)c.recv.maxRows + gemm::kTileM - 1) / gemm::kTileM);
  const size_t slots = c.T * (size_t)c.k;
  const size_t cntBytes = (size_t)n * a.stride * sizeof(int32_t);
  const size_t retRowsBytes = c.ffn ? (size_t)n * a.pairRows * pl.retBytes : 0;
  MoeCarve k;
  const size_t oSlotPos = k.take((slots + 1) * sizeof(int32_t));
  const size_t oSendCnt = k.take(cntBytes);
  const size_t oRecvCnt = k.take(cntBytes);
  const size_t oBad = k.take(sizeof(unsigned long long));
  const size_t oRec = k.take((size_t)n * a.pairRows * pl.recBytes);
  const size_t oSlotTok = k.take((slots + 1) * sizeof(int32_t));
  const size_t oTabs = k.take(2 * (size_t)n * epr * sizeof(int32_t));
  const size_t oLay = k.take(sizeof(MxLayout));
  const size_t oFan = k.take(rail ? (kMoeNodeMaxLocal + 3 * (size_t)n) * sizeof(int32_t) : 0);
  const size_t oFanSend = k.take(rail ? (size_t)a.node.nLocal * a.pairRows * pl.recBytes : 0);
  p.landRows = (int32_t)(rail ? 2 * a.pairRows : a.pairRows);
  const size_t oLand = k.take((size_t)n * p.landRows * pl.recBytes);
  p.fanChunks = (int32_t)mxChunks(a.pairRows, pl.dispRows);
  // Zeroed: tileReady, rowDone1, rowDone2 [tiles]; retReady [n]; recvDone, combClaim, the two
  // GEMMs' tile claims and dispDone; landed [n]; the zero chunk (the layer); the fan chunks'
  // counters (the dedup); the send and land groups' counters.
  const size_t oZero = k.take(0);
  const size_t oCtr = k.take((3 * (size_t)tiles + 2 * (size_t)n + 5) * sizeof(uint64_t));
  const size_t oZeroChunk = k.take(c.ffn ? (size_t)pl.retRows * pl.retBytes : 0);
  const size_t oFanChunk =
      k.take(rail ? (size_t)a.node.nLocal * p.fanChunks * sizeof(uint64_t) : 0);
  const size_t oGroupCnt = k.take(2 * (size_t)n * pl.slots * sizeof(uint64_t));
  const size_t zeroBytes = k.at - oZero;
  const size_t oRetSend = k.take(retRowsBytes);
  const size_t oRetRecv = k.take(retRowsBytes);
  uint8_t* base = nullptr;
  NCCLCHECK(scratchAlloc(reinterpret_cast<void**>(&base), k.at, comm->cudaDev, c.stream));
  a.slotPos = reinterpret_cast<int32_t*>(base + oSlotPos);
  a.sendCnt = reinterpret_cast<int32_t*>(base + oSendCnt);
  a.recvCnt = reinterpret_cast<const int32_t*>(base + oRecvCnt);
  a.badSlot = reinterpret_cast<unsigned long long*>(base + oBad);
  a.sendRows = base + oRec;
  a.slotTok = reinterpret_cast<int32_t*>(base + oSlotTok);
  int32_t* tabs = reinterpret_cast<int32_t*>(base + oTabs);
  p.srcRow = tabs;
  p.recvTab = tabs + (size_t)n * epr;
  MxLayout* lay = reinterpret_cast<MxLayout*>(base + oLay);
  p.lay = lay;
  uint64_t* ctr = reinterpret_cast<uint64_t*>(base + oCtr);
  p.tileReady = ctr;
  uint64_t* rowDone1 = ctr + tiles;
  p.rowDone2 = ctr + 2 * tiles;
  p.retReady = ctr + 3 * tiles;
  uint64_t* tail = p.retReady + n;
  p.recvDone = reinterpret_cast<uint32_t*>(tail);
  p.combClaim = reinterpret_cast<int32_t*>(tail + 1);
  p.dispDone = tail + 4;
  p.landed = tail + 5;
  p.landRec = base + oLand;
  p.pushCnt = reinterpret_cast<uint64_t*>(base + oGroupCnt);
  p.copyCnt = p.pushCnt + (size_t)n * pl.slots;
  p.zeroRow = base + oZeroChunk;
  if (rail) {
    a.fanCnt = reinterpret_cast<int32_t*>(base + oFan);  // zeroed by the pack kernel
    a.fanUnits = a.fanCnt + kMoeNodeMaxLocal;
    p.fanSend = base + oFanSend;
    p.fanChunk = reinterpret_cast<uint64_t*>(base + oFanChunk);
  }
  p.retSend = c.ffn ? base + oRetSend : nullptr;
  p.retRecv = c.ffn ? base + oRetRecv : nullptr;

  g1.hooks.rowReady = p.tileReady;
  g1.tileClaim = reinterpret_cast<int32_t*>(tail + 2);
  if (c.ffn) {
    g1.hooks.tileDone = rowDone1;
    g2.hooks.rowReady = rowDone1;
    g2.hooks.tileDone = p.rowDone2;
    g2.tileClaim = reinterpret_cast<int32_t*>(tail + 3);
  }
  ncclResult_t res = ncclSuccess;
  {
    int32_t gridUnused = 0;
    NCCLCHECKGOTO(gemm::buildParams(g1, &p.g1, &gridUnused), res, done);
    if (c.ffn) NCCLCHECKGOTO(gemm::buildParams(g2, &p.g2, &gridUnused), res, done);
    CUDACHECKGOTO(cudaMemsetAsync(base + oZero, 0, zeroBytes, c.stream), res, done);
    // The trace's row `budget`: when the front and the layout kernel started.
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CUDACHECKGOTO(cudaStreamIsCapturing(c.stream, &cap), res, done);
    p.trace = traceAcquire(budget + 1, cap != cudaStreamCaptureStatusNone);
    uint64_t* front = p.trace != nullptr ? p.trace + (size_t)budget * kTraceMaxWords : nullptr;
    if (front != nullptr) moeXnStampKernel<<<1, 1, 0, c.stream>>>(front);
    const int grid = std::max(1, std::min<int>(4 * std::max(1, f.smBudget), 65535));
    NCCLCHECKGOTO(moeA2aFront(c, a, grid), res, done);
    moeXnLayoutKernel<<<1, kA2aThreads, moeA2aLayoutSmem(a), c.stream>>>(
        a, tabs, tabs + (size_t)n * epr, lay, p.tileReady, front != nullptr ? front + 1 : nullptr);
    CUDACHECKGOTO(cudaGetLastError(), res, done);
    MK_INFO(kFused,
            "%s rank %d T=%zu k=%d E=%d H=%zu fused across nodes%s: %d CTAs, %d comm, %d unpack, "
            "chunks of %d records / %d rows, %d slots",
            api, f.rank, c.T, c.k, c.E, c.H, rail ? " (node dedup)" : "", budget, nComm, nUnpack,
            pl.dispRows, pl.retRows, pl.slots);
    res = fusedEnqueue(comm, c.stream, api, [&](cudaStream_t s) -> ncclResult_t {
      const ncclResult_t r = launch(budget, s);
      if (p.trace != nullptr) {
        if (r != ncclSuccess) {
          traceReleaseAfter(s, p.trace);  // the front's kernels may still stamp it
        } else {
          auto* t = new MxTrace{p.trace, api, f.rank, budget, nComm, mxSendCtas(nComm), nUnpack};
          if (!traceQueue(s, mxTracePrint, t, p.trace)) delete t;
        }
        p.trace = nullptr;
      }
      return r;
    });
    if (res != ncclSuccess) goto done;
    *ran = true;
  }
done:
  if (p.trace != nullptr) traceReleaseAfter(c.stream, p.trace);  // not launched
  res = fusedFreeScratch(base, c.stream, res, api);
  if (res == ncclSuccess && *ran) gXnLaunches.fetch_add(1);
  return res;
}

}  // namespace fused
}  // namespace mk
