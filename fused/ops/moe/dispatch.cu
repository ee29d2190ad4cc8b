// ncclMoeDispatchGemm: the dispatch kernel and the call's host side.
//
// One dispatch kernel per rank (grid sized from the rank's SM budget), every rank of the comm
// in this process on one GPU, so a kernel reads and writes its peers' buffers directly
// (fused/core/clique_block.h). Per call (number `seq`, the op's device-resident counter):
//   1. CTA 0 counts this rank's routed slots per expert and publishes the counts with its
//      receive buffers in its clique slot (release of slot.seq = seq);
//   2. every CTA waits for every rank's slot, then derives the packed layout of every rank
//      from the counts (moe_layout.h): where its rows start at each destination, and whether
//      a destination would overflow its bound (then nothing is sent there);
//   3. warp 0 of CTA 0 gives every routed slot its row at the destination, in slot order
//      (stable: the layout is deterministic), and CTA 0 writes this rank's counts, offsets
//      and padding entries;
//   4. all CTAs copy token rows into the destinations' xRecv (with source and weight);
//   5. the last CTA to finish releases done[dst][me] for every destination, then waits for
//      done[me][src] of every source: when the kernel ends, every row of this rank's layout
//      has arrived, and the grouped GEMM that follows on the stream reads them.
// A destination publishes its slot for call seq only from its kernel of call seq, which is
// stream-ordered after its previous GEMM, so no row of call seq overwrites rows still read.
// Counts of call seq are read before a rank releases its done flags, and a source writes its
// next counts only after every rank released done for it: no count is overwritten early.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cuda_runtime.h>

#include "base/checks.h"
#include "base/cudawrap.h"
#include "base/debug.h"
#include "base/param.h"
#include "base/scratch.h"
#include "comm/comm.h"
#include "device/rt/wait.cuh"
#include "fused/core/clique_block.h"
#include "fused/core/fused_comm.h"
#include "fused/core/fused_dev.cuh"
#include "fused/gemm/gemm.h"
#include "fused/ops/gemm_coll/gemm_coll.h"
#include "fused/ops/gemm_coll/gemm_coll_util.h"
#include "fused/ops/moe/moe.h"
#include "fused/ops/moe/moe_layout.h"
#include "fused/ops/moe/moe_rank.cuh"

namespace mk {
namespace fused {

namespace {

constexpr int kMoeMaxLocal = 32;
constexpr int kMoeThreads = 512;
constexpr int kMoeWarps = kMoeThreads / 32;
static_assert(NCCL_MOE_ROW_ALIGN == gemm::kTileM, "experts start on the grouped GEMM's row tiles");

struct MoeSlot {
  uint64_t seq;  // released (system scope) after the fields below and the counts
  void* xRecv;
  int32_t* rowSource;
  float* rowWeight;
  int64_t maxRows;
  uint64_t pad[3];
};

struct MoeClique {
  MoeSlot slot[kMoeMaxLocal];
  uint64_t done[kMoeMaxLocal][kMoeMaxLocal];  // [dst][src] = seq: src's rows for dst are in place
  uint64_t rowsReady[kMoeMaxLocal];           // = seq: slotRow of this call is written (GPU scope)
  uint32_t ctaDone[kMoeMaxLocal];             // last-CTA detection per rank
  // This call's first bad expert id per rank: slot + 1 (~0: none). Reported by
  // the last CTA once the exchange is complete (a failure recorded earlier would make this
  // rank leave the protocol and its peers time out).
  unsigned long long badSlot[kMoeMaxLocal];
  int32_t counts[kMoeMaxLocal][NCCL_MOE_MAX_EXPERTS];  // [src][expert]: slots src routes there
};

struct MoeParams {
  FusedComm f;
  MoeClique* q;
  const uint8_t* x;  // [T, H] rows of rowBytes
  const int32_t* topkIdx;
  const float* topkWeights;
  ncclMoeRecv_t recv;
  int32_t* slotRow;  // [T * k] scratch: the slot's row at its destination, -1 if not sent
  int64_t rowBytes;  // H * element size
  MoeShape s;
};

// Shared state of one CTA. Counts live in dynamic shared memory: tot[E], dstRow[E].
struct MoeShared {
  uint64_t seq;
  int ok;
  int last;
  int ovf[kMoeMaxLocal];  // destination would overflow its bound: nothing is sent there
  int64_t span[kMoeMaxLocal];
};

__device__ __forceinline__ rt::ErrSite moeSite(const MoeParams& p, int peer, int slot, int wait) {
  return rt::ErrSite{p.f.c.w.op, peer, (int32_t)blockIdx.x, slot, wait, 0};
}

// 1. CTA 0: counts per expert (shared-memory histogram), bad ids reported, slot published.
__device__ void moeCountAndPublish(const MoeParams& p, MoeShared& sh, int32_t* hist) {
  const MoeShape& s = p.s;
  const int me = p.f.rank;
  for (int e = threadIdx.x; e < s.experts; e += blockDim.x) hist[e] = 0;
  if (threadIdx.x == 0) p.q->badSlot[me] = ~0ull;
  __syncthreads();
  const int64_t slots = (int64_t)s.tokens * s.topk;
  moeCountSlots(p.topkIdx, slots, s.experts, hist, &p.q->badSlot[me]);
  __syncthreads();
  for (int e = threadIdx.x; e < s.experts; e += blockDim.x) p.q->counts[me][e] = hist[e];
  __syncthreads();
  if (threadIdx.x == 0) {
    MoeSlot& sl = p.q->slot[me];
    sl.xRecv = p.recv.xRecv;
    sl.rowSource = p.recv.rowSource;
    sl.rowWeight = p.recv.rowWeight;
    sl.maxRows = (int64_t)p.recv.maxRows;
    __threadfence_system();
    ptx::stReleaseSys(&sl.seq, sh.seq);
  }
}

// 2. Every rank's counts -> tot[e] (rows expert e receives) and dstRow[e] (first row of this
// rank's rows of expert e at its owner); per destination its span and overflow verdict.
__device__ void moeLayout(const MoeParams& p, MoeShared& sh, int32_t* tot, int32_t* dstRow) {
  const MoeShape& s = p.s;
  const int me = p.f.rank, n = s.nRanks, epr = s.expertsPerRank;
  for (int e = threadIdx.x; e < s.experts; e += blockDim.x) {
    int32_t before = 0, all = 0;
    for (int src = 0; src < n; ++src) {
      const int32_t c = ((volatile int32_t*)p.q->counts[src])[e];
      all += c;
      if (src < me) before += c;
    }
    tot[e] = all;
    dstRow[e] = before;  // + the expert's start, below
  }
  __syncthreads();
  for (int d = threadIdx.x; d < n; d += blockDim.x) {
    int64_t row = 0;
    for (int le = 0; le < epr; ++le) {
      const int e = d * epr + le;
      dstRow[e] += (int32_t)row;
      row += (tot[e] + NCCL_MOE_ROW_ALIGN - 1) / NCCL_MOE_ROW_ALIGN * NCCL_MOE_ROW_ALIGN;
    }
    sh.span[d] = row;
    sh.ovf[d] = row > ((volatile MoeSlot*)&p.q->slot[d])->maxRows;
  }
  __syncthreads();
}

// 3a. Warp 0 of CTA 0: each routed slot's row at its destination, in slot order. Lanes take
// 32 consecutive slots; lanes with the same expert rank themselves by lane (match.any).
__device__ void moeSlotRows(const MoeParams& p, const MoeShared& sh, const int32_t* dstRow,
                            int32_t* seen) {
  const MoeShape& s = p.s;
  for (int e = threadIdx.x & 31; e < s.experts; e += 32) seen[e] = 0;
  __syncwarp();
  const int64_t slots = (int64_t)s.tokens * s.topk;
  moeRankSlots(p.topkIdx, slots, s.experts, seen, p.slotRow, [&](int32_t e, int32_t k) {
    return sh.ovf[e / s.expertsPerRank] ? -1 : dstRow[e] + k;
  });
}

// 3b. CTA 0: this rank's outputs: counts, offsets (last entry: rows spanned), -1 sources on
// padding rows; an overflow is reported and leaves counts and offsets 0.
__device__ void moeOutputs(const MoeParams& p, const MoeShared& sh, const int32_t* tot) {
  const MoeShape& s = p.s;
  const int me = p.f.rank, epr = s.expertsPerRank;
  const bool ovf = sh.ovf[me] != 0;
  for (int le = threadIdx.x; le <= epr; le += blockDim.x) {
    int64_t start = 0;
    for (int j = 0; j < le; ++j)
      start +=
          (tot[me * epr + j] + NCCL_MOE_ROW_ALIGN - 1) / NCCL_MOE_ROW_ALIGN * NCCL_MOE_ROW_ALIGN;
    p.recv.expertOffset[le] = ovf ? 0 : (int32_t)start;
    if (le < epr) p.recv.expertCount[le] = ovf ? 0 : tot[me * epr + le];
    if (ovf || le == epr || p.recv.rowSource == nullptr) continue;
    const int64_t end = start + tot[me * epr + le];
    const int64_t padEnd = start + (tot[me * epr + le] + NCCL_MOE_ROW_ALIGN - 1) /
                                       NCCL_MOE_ROW_ALIGN * NCCL_MOE_ROW_ALIGN;
    for (int64_t r = end; r < padEnd; ++r)
      for (int c = 0; c < 3; ++c) p.recv.rowSource[r * 3 + c] = -1;
  }
}

// 4. Token rows into the destinations' packed layouts: one warp per slot, 16-byte vectors.
__device__ void moeCopyRows(const MoeParams& p) {
  const MoeShape& s = p.s;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t)blockIdx.x * kMoeWarps + (threadIdx.x >> 5);
  const int64_t warps = (int64_t)gridDim.x * kMoeWarps;
  const int64_t slots = (int64_t)s.tokens * s.topk;
  const int64_t vecs = p.rowBytes / 16;
  for (int64_t i = warp; i < slots; i += warps) {
    const int32_t row = p.slotRow[i];
    if (row < 0) continue;
    const int d = p.topkIdx[i] / s.expertsPerRank;
    const MoeSlot& dst = p.q->slot[d];
    const int64_t t = i / s.topk;
    const int4* from = reinterpret_cast<const int4*>(p.x + t * p.rowBytes);
    int4* to =
        reinterpret_cast<int4*>(static_cast<uint8_t*>(dst.xRecv) + (int64_t)row * p.rowBytes);
    for (int64_t v = lane; v < vecs; v += 32) to[v] = from[v];
    if (lane == 0) {
      if (dst.rowSource != nullptr) {
        dst.rowSource[(int64_t)row * 3 + 0] = p.f.rank;
        dst.rowSource[(int64_t)row * 3 + 1] = (int32_t)t;
        dst.rowSource[(int64_t)row * 3 + 2] = (int32_t)(i - t * s.topk);
      }
      if (dst.rowWeight != nullptr) dst.rowWeight[row] = p.topkWeights[i];
    }
  }
}

__global__ void __launch_bounds__(kMoeThreads, 1)
    moeDispatchKernel(const __grid_constant__ MoeParams p) {
  extern __shared__ int32_t dyn[];  // tot[E], dstRow[E], seen[E]
  __shared__ MoeShared sh;
  int32_t* tot = dyn;
  int32_t* dstRow = dyn + p.s.experts;
  int32_t* seen = dyn + 2 * p.s.experts;
  const int me = p.f.rank, n = p.s.nRanks;
  // Empty layout until step 3 writes the real one: when the call fails early (abort, a peer's
  // timeout), the grouped GEMM queued behind this kernel must find no rows rather than the
  // previous call's counts or uninitialised memory (which could ask for billions of tiles).
  if (blockIdx.x == 0)
    for (int le = threadIdx.x; le <= p.s.expertsPerRank; le += blockDim.x) {
      p.recv.expertOffset[le] = 0;
      if (le < p.s.expertsPerRank) p.recv.expertCount[le] = 0;
    }
  if (threadIdx.x == 0) {
    sh.seq = callSeq(p.f);
    sh.ok = !rt::failed(p.f.c.w);
  }
  __syncthreads();
  const uint64_t seq = sh.seq;
  if (sh.ok && blockIdx.x == 0) moeCountAndPublish(p, sh, seen);
  // 2. Every rank's slot of this call (its counts and buffers).
  if (threadIdx.x == 0)
    for (int q = 0; q < n && sh.ok; ++q)
      if (!rt::waitGe(p.f.c.w, &p.q->slot[q].seq, seq, moeSite(p, q, -1, rt::kWaitData),
                      rt::kScopeSys))
        sh.ok = 0;
  __syncthreads();
  if (sh.ok) moeLayout(p, sh, tot, dstRow);
  // 3. Rows per slot (warp 0 of CTA 0) and this rank's outputs (the rest of CTA 0).
  if (sh.ok && blockIdx.x == 0) {
    if (threadIdx.x < 32) moeSlotRows(p, sh, dstRow, seen);
    moeOutputs(p, sh, tot);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      ptx::stReleaseGpu(&p.q->rowsReady[me], seq);
    }
  }
  if (sh.ok && threadIdx.x == 0 &&
      !rt::waitGe(p.f.c.w, &p.q->rowsReady[me], seq, moeSite(p, -1, -1, rt::kWaitFlag),
                  rt::kScopeGpu))
    sh.ok = 0;
  __syncthreads();
  // 4. Rows.
  if (sh.ok) moeCopyRows(p);
  __syncthreads();
  // 5. The last CTA: done for every destination, then every source's done for this rank.
  if (threadIdx.x == 0) {
    __threadfence_system();
    const uint32_t prev = atomicAdd(&p.q->ctaDone[me], 1u);
    sh.last = prev == gridDim.x - 1;
    if (sh.last) {
      __threadfence();  // acquire side of the other CTAs' fence + count: their writes are seen
      p.q->ctaDone[me] = 0;
      if (sh.ok) {
        for (int d = 0; d < n; ++d) ptx::stReleaseSys(&p.q->done[d][me], seq);
        for (int src = 0; src < n && sh.ok; ++src)
          if (!rt::waitGe(p.f.c.w, &p.q->done[me][src], seq, moeSite(p, src, -1, rt::kWaitData),
                          rt::kScopeSys))
            sh.ok = 0;
      }
      // The caller's errors, once the exchange is complete: the first bad expert id, then an
      // overflow of this rank's bound (the first recorded one is what the comm reports).
      const unsigned long long bad = *(volatile unsigned long long*)&p.q->badSlot[me];
      if (sh.ok && bad != ~0ull && bad != 0)
        rt::recordError(p.f.c.w, rt::kErrArgs, moeSite(p, -1, -1, rt::kWaitNone), bad - 1,
                        (uint64_t)(uint32_t)p.topkIdx[bad - 1]);
      if (sh.ok && sh.ovf[me])
        rt::recordError(p.f.c.w, rt::kErrOverflow, moeSite(p, -1, -1, rt::kWaitNone),
                        (uint64_t)sh.span[me], (uint64_t)p.recv.maxRows);
    }
    finishCall(p.f, seq);
  }
}

}  // namespace

int moeCommGrid(const MoeCall& c, int smBudget, int64_t units, int unitsPerCta) {
  const int64_t want = c.cfg.commSms > 0 ? c.cfg.commSms : smBudget;
  const int64_t work = (units + unitsPerCta - 1) / unitsPerCta;
  return (int)std::min<int64_t>(std::max<int64_t>(1, std::min(want, work)), std::max(1, smBudget));
}

bool moeSwigluInGemm(const MoeCall& c) {
  return c.ffn && c.cfg.wLayout == ncclFusedLayoutNK && MK_PARAM_INT(MoeSwigluEpilogue) != 0;
}

ncclResult_t moeGemm(const MoeCall& c, const void* a, const void* w, size_t N, size_t K, void* d,
                     ncclDataType_t dType, gemm::GemmArgs* out, bool swiglu) {
  FusedComm f;  // for the sequential GEMMs' SM budget
  NCCLCHECK(fusedCommView(c.comm, rt::kOpMoe, &f));
  gemm::GemmArgs g;
  g.M = (int32_t)c.recv.maxRows;
  g.N = (int32_t)N;
  g.K = (int32_t)K;
  g.A = a;
  g.B = w;
  g.bLayout = c.cfg.wLayout == ncclFusedLayoutKN ? gemm::BLayout::kKN : gemm::BLayout::kNK;
  g.abType = gemmType(c.inType);
  g.D = d;
  g.dType = gemmType(dType);
  g.smBudget = seqGemmBudget(f);
  g.groups.num = c.E / c.comm->nRanks;
  g.groups.rowStart = c.recv.expertOffset;
  g.groups.rowCount = c.recv.expertCount;
  g.groups.strideB = (int64_t)N * (int64_t)K;
  g.swiglu = swiglu;
  std::string why;
  if (!gemm::canImplement(g, &why)) {
    MK_WARN("%s: the experts' GEMM (N=%zu, K=%zu) cannot run: %s", moeApi(c), N, K, why.c_str());
    return ncclInvalidArgument;
  }
  // Loaded before the first launch: a lazy load can wait for the device, where a peer's
  // dispatch kernel may wait for this thread.
  NCCLCHECK(gemm::preload(g));
  *out = g;
  return ncclSuccess;
}

ncclResult_t moeDispatch(const MoeCall& c, int32_t** slotRow) {
  ncclComm* comm = c.comm;
  *slotRow = nullptr;
  FusedComm f;
  NCCLCHECK(fusedCommView(comm, rt::kOpMoe, &f));
  void* block = nullptr;
  NCCLCHECK(cliqueBlockForCall(comm, kCliqueMoe, sizeof(MoeClique), c.stream, moeApi(c), &block));

  MoeParams p{};
  p.f = f;
  p.q = static_cast<MoeClique*>(block);
  p.x = static_cast<const uint8_t*>(c.x);
  p.topkIdx = c.topkIdx;
  p.topkWeights = c.topkWeights;
  p.recv = c.recv;
  p.rowBytes = (int64_t)c.H * (int64_t)fusedTypeSize(c.inType);
  p.s.tokens = (int32_t)c.T;
  p.s.topk = c.k;
  p.s.experts = c.E;
  p.s.nRanks = comm->nRanks;
  p.s.expertsPerRank = c.E / comm->nRanks;
  const int64_t slots = (int64_t)c.T * c.k;
  const int grid = moeCommGrid(c, f.smBudget, slots, kMoeWarps);
  const size_t smem = 3 * (size_t)c.E * sizeof(int32_t);
  cudaFuncAttributes attr;
  CUDACHECK(cudaFuncGetAttributes(&attr, moeDispatchKernel));  // loads it now (see moeGemm)
  // The slot rows of this call: stream-ordered scratch (a memory node under capture).
  if (slots > 0)
    NCCLCHECK(
        scratchAlloc((void**)slotRow, (size_t)slots * sizeof(int32_t), c.comm->cudaDev, c.stream));
  p.slotRow = *slotRow;
  return fusedEnqueue(comm, c.stream, moeApi(c), [&](cudaStream_t s) -> ncclResult_t {
    moeDispatchKernel<<<grid, kMoeThreads, smem, s>>>(p);
    CUDACHECK(cudaGetLastError());
    return ncclSuccess;
  });
}

ncclResult_t moeRun(const MoeCall& c) {
  DeviceGuard guard;
  NCCLCHECK(guard.set(c.comm->cudaDev));
  if (!cliqueEligible(c.comm, kMoeMaxLocal)) return moeA2aRun(c);
  if (c.ffn) return moeFfnRun(c);
  if (c.cfg.algo == ncclFusedFused) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      MK_INFO(kFused,
              "ncclMoeDispatchGemm: no fused dispatch + GEMM kernel yet; running the dispatch "
              "kernel, then the grouped GEMM");
  }
  gemm::GemmArgs g;
  NCCLCHECK(moeGemm(c, c.recv.xRecv, c.w1, c.N, c.H, c.recv.y, c.cfg.outType, &g));
  int32_t* slotRow = nullptr;
  ncclResult_t res = moeDispatch(c, &slotRow);
  // The GEMM waits for this rank's dispatch kernel, which spins until its peers' run: it is
  // queued only now, after the enqueue has seen every in-process peer's dispatch launched
  // (coll/rendezvous.h, rdvLaunched), so it cannot hold a hardware queue a peer's dispatch
  // kernel still has to pass.
  if (res == ncclSuccess) res = gemm::launch(g, c.stream);
  return fusedFreeScratch(slotRow, c.stream, res, moeApi(c));
}

}  // namespace fused
}  // namespace mk
