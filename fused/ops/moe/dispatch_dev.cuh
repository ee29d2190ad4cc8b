// The dispatch half of ncclMoeDispatchGemm on the clique layout (device only), shared by the
// dispatch kernel (dispatch.cu) and the fused dispatch + grouped GEMM kernel (fused_moe.cuh):
// the clique block, the parameters and the dispatch CTAs' body (moeDispatchBody). The protocol
// is described at the top of dispatch.cu.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "device/rt/wait.cuh"
#include "fused/core/fused_comm.h"
#include "fused/core/fused_dev.cuh"
#include "fused/gemm/gemm.h"
#include "fused/ops/gemm_coll/gemm_coll.h"
#include "fused/ops/moe/moe.h"
#include "fused/ops/moe/moe_layout.h"
#include "fused/ops/moe/moe_rank.cuh"
#include "mkernel/fused.h"

namespace mk {
namespace fused {
namespace moedev {

constexpr int kMoeMaxLocal = 32;
constexpr int kMoeThreads = 512;
constexpr int kMoeWarps = kMoeThreads / 32;
static_assert(NCCL_MOE_ROW_ALIGN == gemm::kTileM, "experts start on the grouped GEMM's row tiles");

struct MoeSlot {
  uint64_t seq;  // released (system scope) after the fields below and the counts
  // Processes layout: the owner's data window base in its own address space (the pointers
  // below point into it); null in the clique.
  const uint8_t* base;
  void* xRecv;
  int32_t* rowSource;
  float* rowWeight;
  int64_t maxRows;
  // Fused kernel only (else null): the receiver's per-tile row counters over its packed rows,
  // zeroed before its kernel; a source adds 1 per row it lands in tile row / kTileM once the
  // row is written, the receiver adds its padding rows, so a tile is complete at kTileM.
  uint64_t* tileReady;
  // Fused layer only (else null): this rank's experts' outputs (buf.out, fp32 [maxRows, H])
  // and its GEMM2's row-block counters (a row block of out is complete at GEMM2's column tile
  // count), which the peers' combine CTAs wait on before reading rows of out.
  const float* out;
  uint64_t* rowDone;
};

// One rank's part of the MoE state its peers read and write: what it publishes (slot, counts,
// flags) and what its peers signal to it (done). The clique block holds every rank's, side by
// side; in the processes layout each rank's lives in its own control window, mapped by every
// peer (fused/core/proc_windows.h). MoeParams::ctl[r] is rank r's, as mapped in this process.
struct MoeRankCtl {
  MoeSlot slot;
  uint64_t done[kMoeMaxLocal];  // [src] = seq: src's rows for this rank are in place
  uint64_t rowsReady;           // = seq: slotRow of this call is written (GPU scope)
  // This call's first bad expert id: slot + 1 (~0: none). Reported by the last CTA once the
  // exchange is complete (a failure recorded earlier would make this rank leave the protocol
  // and its peers time out).
  unsigned long long badSlot;
  // Fused layer only. combDone = seq: this rank's combine of this call has read every row and
  // counter it needed from its peers (each rank's kernel ends only once all have: the
  // counters live in per-call scratch). combFailed = seq: this rank failed this call
  // (released before combDone). ovfSpan: rows this rank's layout needed when they exceeded
  // its bound this call, else 0 (the error the layer records at its end).
  uint64_t combDone;
  uint64_t combFailed;
  int64_t ovfSpan;
  uint32_t ctaDone;                      // last-CTA detection
  int32_t counts[NCCL_MOE_MAX_EXPERTS];  // [expert]: slots this rank routes there
};

struct MoeClique {
  MoeRankCtl rank[kMoeMaxLocal];
};

struct MoeParams {
  FusedComm f;
  MoeRankCtl* ctl[kMoeMaxLocal];  // every rank's, valid in this process
  // Processes layout: every rank's data window as mapped here (null in the clique, where a
  // slot's pointers are valid as published). A peer's published pointer p is used as
  // peerData[d] + (p - slot.base) (moePeerPtr); dataBase is this rank's own window.
  uint8_t* peerData[kMoeMaxLocal];
  uint8_t* dataBase;
  // Processes layout: rows and counters may land from another GPU of the node, so the row
  // counters are added and fenced at system scope (GPU scope in the clique, one GPU).
  bool sysScope;
  const uint8_t* x;  // [T, H] rows of rowBytes
  const int32_t* topkIdx;
  const float* topkWeights;
  ncclMoeRecv_t recv;
  int32_t* slotRow;     // [T * k] scratch: the slot's row at its destination, -1 if not sent
  uint64_t* tileReady;  // fused kernel: this rank's tile counters (MoeSlot::tileReady), else null
  // Fused kernel: [T * k] scratch, the slots in copy order (below), -1 past the sent ones;
  // null: slot order.
  int32_t* order;
  const float* ffnOut;  // fused layer: MoeSlot::out, else null
  uint64_t* rowDone;    // fused layer: MoeSlot::rowDone, else null
  // Fused layer: the last dispatch CTA leaves the call's bad id (badSlot) and overflow
  // (ovfSpan) in the clique instead of recording them, and the layer records them at its
  // end. A recorded error fails the comm's waits, and this rank's GEMMs and counters must
  // still serve its peers' combines (the sequential path's later kernels run regardless).
  bool deferErrors;
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

// A pointer rank d published in its slot, as usable here (see MoeParams::peerData).
template <class T>
__device__ __forceinline__ T* moePeerPtr(const MoeParams& p, int d, T* ptr) {
  if (p.peerData[d] == nullptr || ptr == nullptr) return ptr;
  const uint8_t* base = p.ctl[d]->slot.base;
  return reinterpret_cast<T*>(p.peerData[d] + (reinterpret_cast<const uint8_t*>(ptr) - base));
}

// 1. CTA 0: counts per expert (shared-memory histogram), bad ids reported, slot published.
__device__ inline void moeCountAndPublish(const MoeParams& p, MoeShared& sh, int32_t* hist) {
  const MoeShape& s = p.s;
  const int me = p.f.rank;
  for (int e = threadIdx.x; e < s.experts; e += blockDim.x) hist[e] = 0;
  MoeRankCtl& mine = *p.ctl[me];
  if (threadIdx.x == 0) mine.badSlot = ~0ull;
  __syncthreads();
  const int64_t slots = (int64_t)s.tokens * s.topk;
  moeCountSlots(p.topkIdx, slots, s.experts, hist, &mine.badSlot);
  __syncthreads();
  for (int e = threadIdx.x; e < s.experts; e += blockDim.x) mine.counts[e] = hist[e];
  __syncthreads();
  if (threadIdx.x == 0) {
    MoeSlot& sl = mine.slot;
    sl.base = p.dataBase;
    sl.xRecv = p.recv.xRecv;
    sl.rowSource = p.recv.rowSource;
    sl.rowWeight = p.recv.rowWeight;
    sl.maxRows = (int64_t)p.recv.maxRows;
    sl.tileReady = p.tileReady;
    sl.out = p.ffnOut;
    sl.rowDone = p.rowDone;
    __threadfence_system();
    ptx::stReleaseSys(&sl.seq, sh.seq);
  }
}

// 2. Every rank's counts -> tot[e] (rows expert e receives) and dstRow[e] (first row of this
// rank's rows of expert e at its owner); per destination its span and overflow verdict.
__device__ inline void moeLayout(const MoeParams& p, MoeShared& sh, int32_t* tot, int32_t* dstRow) {
  const MoeShape& s = p.s;
  const int me = p.f.rank, n = s.nRanks, epr = s.expertsPerRank;
  for (int e = threadIdx.x; e < s.experts; e += blockDim.x) {
    int32_t before = 0, all = 0;
    for (int src = 0; src < n; ++src) {
      const int32_t c = ((volatile int32_t*)p.ctl[src]->counts)[e];
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
    sh.ovf[d] = row > ((volatile MoeSlot*)&p.ctl[d]->slot)->maxRows;
  }
  __syncthreads();
}

// 3a. Warp 0 of CTA 0: each routed slot's row at its destination, in slot order. Lanes take
// 32 consecutive slots; lanes with the same expert rank themselves by lane (match.any).
__device__ inline void moeSlotRows(const MoeParams& p, const MoeShared& sh, const int32_t* dstRow,
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
__device__ inline void moeOutputs(const MoeParams& p, const MoeShared& sh, const int32_t* tot) {
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
    if (ovf || le == epr) continue;
    const int64_t end = start + tot[me * epr + le];
    const int64_t padEnd = start + (tot[me * epr + le] + NCCL_MOE_ROW_ALIGN - 1) /
                                       NCCL_MOE_ROW_ALIGN * NCCL_MOE_ROW_ALIGN;
    // The padding rows of the expert's last tile count as landed: the fused GEMM loads the
    // tile once every source's rows and these make kTileM (they hold unspecified values, as
    // in the sequential path; their products are padding rows of y).
    if (p.tileReady != nullptr && padEnd > end) {
      // At the senders' scope (processes layout: system, peers may be other GPUs).
      unsigned long long* ctr =
          reinterpret_cast<unsigned long long*>(&p.tileReady[(padEnd - 1) / gemm::kTileM]);
      if (p.sysScope) {
        atomicAdd_system(ctr, (unsigned long long)(padEnd - end));
      } else {
        atomicAdd(ctr, (unsigned long long)(padEnd - end));
      }
    }
    if (p.recv.rowSource == nullptr) continue;
    for (int64_t r = end; r < padEnd; ++r)
      for (int c = 0; c < 3; ++c) p.recv.rowSource[r * 3 + c] = -1;
  }
}

// 3c. CTA 0 of the fused kernel (after 3a, 3b and a CTA barrier): the order in which this
// rank's rows are copied: local expert by local expert, each over every destination (le, d),
// each destination's rows of the expert in row order. Every source walks the same order, so
// every receiver's first expert's tiles fill first, and the grouped GEMM, whose raster walks
// groups in order, finds its first tiles complete while later experts' rows still travel.
// seen[e]: this rank's slots of expert e (moeSlotRows); base: E ints of shared memory.
__device__ inline void moeCopyOrder(const MoeParams& p, const MoeShared& sh, const int32_t* dstRow,
                                    const int32_t* seen, int32_t* base) {
  const MoeShape& s = p.s;
  const int64_t slots = (int64_t)s.tokens * s.topk;
  for (int64_t j = threadIdx.x; j < slots; j += blockDim.x) p.order[j] = -1;
  if (threadIdx.x == 0) {
    int32_t at = 0;
    for (int le = 0; le < s.expertsPerRank; ++le)
      for (int d = 0; d < s.nRanks; ++d) {
        const int e = d * s.expertsPerRank + le;
        base[e] = at;
        if (!sh.ovf[d]) at += seen[e];
      }
  }
  __syncthreads();  // the -1 fill and base before the scatter
  for (int64_t i = threadIdx.x; i < slots; i += blockDim.x) {
    const int32_t row = p.slotRow[i];
    if (row < 0) continue;
    const int32_t e = p.topkIdx[i];
    p.order[base[e] + (row - dstRow[e])] = (int32_t)i;
  }
  __syncthreads();  // before the release of rowsReady that publishes the order
}

// 4. Token rows into the destinations' packed layouts: one warp per slot, 16-byte vectors;
// CTA `cta` of the `nCtas` that copy.
__device__ inline void moeCopyRows(const MoeParams& p, int cta, int nCtas) {
  const MoeShape& s = p.s;
  const int lane = threadIdx.x & 31;
  const int ctaWarps = (int)(blockDim.x >> 5);
  const int64_t warp = (int64_t)cta * ctaWarps + (threadIdx.x >> 5);
  const int64_t warps = (int64_t)nCtas * ctaWarps;
  const int64_t slots = (int64_t)s.tokens * s.topk;
  const int64_t vecs = p.rowBytes / 16;
  for (int64_t j = warp; j < slots; j += warps) {
    const int64_t i = p.order != nullptr ? p.order[j] : j;
    if (i < 0) continue;  // the order's tail (slots not sent)
    const int32_t row = p.slotRow[i];
    if (row < 0) continue;
    const int d = p.topkIdx[i] / s.expertsPerRank;
    const MoeSlot& dst = p.ctl[d]->slot;
    const int64_t t = i / s.topk;
    const int4* from = reinterpret_cast<const int4*>(p.x + t * p.rowBytes);
    int4* to = reinterpret_cast<int4*>(static_cast<uint8_t*>(moePeerPtr(p, d, dst.xRecv)) +
                                       (int64_t)row * p.rowBytes);
    for (int64_t v = lane; v < vecs; v += 32) to[v] = from[v];
    if (lane == 0) {
      int32_t* rowSource = moePeerPtr(p, d, dst.rowSource);
      float* rowWeight = moePeerPtr(p, d, dst.rowWeight);
      if (rowSource != nullptr) {
        rowSource[(int64_t)row * 3 + 0] = p.f.rank;
        rowSource[(int64_t)row * 3 + 1] = (int32_t)t;
        rowSource[(int64_t)row * 3 + 2] = (int32_t)(i - t * s.topk);
      }
      if (rowWeight != nullptr) rowWeight[row] = p.topkWeights[i];
    }
    if (dst.tileReady != nullptr) {
      // Fused kernel: the row counts for its tile once every lane's stores are done (warp
      // barrier, then a fence before the count: the receiver's GEMM producer acquires the
      // counter and reads the row through TMA). System scope where the receiver may be
      // another GPU (processes layout).
      __syncwarp();
      if (lane == 0) {
        unsigned long long* ctr = reinterpret_cast<unsigned long long*>(
            moePeerPtr(p, d, dst.tileReady) + row / gemm::kTileM);
        if (p.sysScope) {
          __threadfence_system();
          atomicAdd_system(ctr, 1ull);
        } else {
          __threadfence();
          atomicAdd(ctr, 1ull);
        }
      }
    }
  }
}

// The call's errors on this rank: the first bad expert id (badSlot: slot + 1, ~0 none), then
// an overflow of its bound (ovfSpan: the rows its layout needed, 0 none); the first recorded
// one is what the comm reports.
__device__ inline void moeRecordCallErrors(const MoeParams& p, unsigned long long bad,
                                           int64_t ovfSpan) {
  if (bad != ~0ull && bad != 0)
    rt::recordError(p.f.c.w, rt::kErrArgs, moeSite(p, -1, -1, rt::kWaitNone), bad - 1,
                    (uint64_t)(uint32_t)p.topkIdx[bad - 1]);
  if (ovfSpan > 0)
    rt::recordError(p.f.c.w, rt::kErrOverflow, moeSite(p, -1, -1, rt::kWaitNone), (uint64_t)ovfSpan,
                    (uint64_t)p.recv.maxRows);
}

// The dispatch, run by CTA `cta` of `nCtas` dispatch CTAs (CTA 0 counts, publishes and ranks
// the slots). dyn: 3 * E ints of shared memory (tot, dstRow, seen), 4 * E with p.order (base).
// Thread 0 calls finishCall at the end (every CTA of the grid, whatever its role, must call it
// once), unless `finish` is false: a caller whose CTA goes on with other work calls it then.
__device__ inline void moeDispatchBody(const MoeParams& p, int32_t* dyn, MoeShared& sh, int cta,
                                       int nCtas, bool finish = true) {
  int32_t* tot = dyn;
  int32_t* dstRow = dyn + p.s.experts;
  int32_t* seen = dyn + 2 * p.s.experts;
  const int me = p.f.rank, n = p.s.nRanks;
  // Empty layout until step 3 writes the real one: when the call fails early (abort, a peer's
  // timeout), the grouped GEMM queued behind this kernel must find no rows rather than the
  // previous call's counts or uninitialised memory (which could ask for billions of tiles).
  if (cta == 0)
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
  if (sh.ok && cta == 0) moeCountAndPublish(p, sh, seen);
  // 2. Every rank's slot of this call (its counts and buffers).
  if (threadIdx.x == 0)
    for (int q = 0; q < n && sh.ok; ++q)
      if (!rt::waitGe(p.f.c.w, &p.ctl[q]->slot.seq, seq, moeSite(p, q, -1, rt::kWaitData),
                      rt::kScopeSys))
        sh.ok = 0;
  __syncthreads();
  if (sh.ok) moeLayout(p, sh, tot, dstRow);
  // 3. Rows per slot (warp 0 of CTA 0) and this rank's outputs (the rest of CTA 0).
  if (sh.ok && cta == 0) {
    if (threadIdx.x < 32) moeSlotRows(p, sh, dstRow, seen);
    moeOutputs(p, sh, tot);
    __syncthreads();
    if (p.order != nullptr) moeCopyOrder(p, sh, dstRow, seen, dyn + 3 * p.s.experts);
    if (threadIdx.x == 0) {
      __threadfence();
      ptx::stReleaseGpu(&p.ctl[me]->rowsReady, seq);
    }
  }
  if (sh.ok && threadIdx.x == 0 &&
      !rt::waitGe(p.f.c.w, &p.ctl[me]->rowsReady, seq, moeSite(p, -1, -1, rt::kWaitFlag),
                  rt::kScopeGpu))
    sh.ok = 0;
  __syncthreads();
  // 4. Rows.
  if (sh.ok) moeCopyRows(p, cta, nCtas);
  __syncthreads();
  // 5. The last CTA: done for every destination, then every source's done for this rank.
  if (threadIdx.x == 0) {
    __threadfence_system();
    MoeRankCtl& mine = *p.ctl[me];
    const uint32_t prev = atomicAdd(&mine.ctaDone, 1u);
    sh.last = prev == (uint32_t)nCtas - 1;
    if (sh.last) {
      __threadfence();  // acquire side of the other CTAs' fence + count: their writes are seen
      mine.ctaDone = 0;
      if (sh.ok) {
        for (int d = 0; d < n; ++d) ptx::stReleaseSys(&p.ctl[d]->done[me], seq);
        for (int src = 0; src < n && sh.ok; ++src)
          if (!rt::waitGe(p.f.c.w, &mine.done[src], seq, moeSite(p, src, -1, rt::kWaitData),
                          rt::kScopeSys))
            sh.ok = 0;
      }
      // The caller's errors, once the exchange is complete (recorded earlier, they would make
      // this rank leave the protocol and its peers time out).
      const unsigned long long bad = *(volatile unsigned long long*)&mine.badSlot;
      const int64_t ovfSpan = sh.ok && sh.ovf[me] ? sh.span[me] : 0;
      if (p.deferErrors) {
        mine.ovfSpan = ovfSpan;
      } else if (sh.ok) {
        moeRecordCallErrors(p, bad, ovfSpan);
      }
    }
    if (finish) finishCall(p.f, seq);
  }
}

// The dispatch's parameters for call c on comm view f with the MoE clique block `block`
// (slotRow and tileReady left null: the caller's scratch). A null block leaves ctl to the
// caller (the processes layout: moeProcsView).
inline MoeParams moeDispatchParamsOf(const MoeCall& c, const FusedComm& f, void* block) {
  MoeParams p{};
  p.f = f;
  for (int r = 0; block != nullptr && r < f.nRanks && r < kMoeMaxLocal; ++r)
    p.ctl[r] = &static_cast<MoeClique*>(block)->rank[r];
  p.x = static_cast<const uint8_t*>(c.x);
  p.topkIdx = c.topkIdx;
  p.topkWeights = c.topkWeights;
  p.recv = c.recv;
  p.rowBytes = (int64_t)c.H * (int64_t)fusedTypeSize(c.inType);
  p.s.tokens = (int32_t)c.T;
  p.s.topk = c.k;
  p.s.experts = c.E;
  p.s.nRanks = f.nRanks;
  p.s.expertsPerRank = c.E / f.nRanks;
  return p;
}

}  // namespace moedev
}  // namespace fused
}  // namespace mk
