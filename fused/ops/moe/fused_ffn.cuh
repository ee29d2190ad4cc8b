// The fused ncclMoeDispatchFfnCombine kernel (clique layout: every rank in this process on one
// GPU): the whole layer as one persistent cooperative kernel per rank. Every CTA walks the
// phases in order, each phase's work claimed dynamically, and waits only for rows, never for
// a phase of the whole grid:
//
//  1. Dispatch (CTAs [0, nDisp)): the dispatch kernel's body (dispatch_dev.cuh) with the fused
//     dispatch + GEMM kernel's per-tile row counters (fused_moe.cuh): rows land in the owners'
//     xRecv, each 128-row tile's counter reaching kTileM once every row of it is in place.
//  2. GEMM1 (every CTA, the dispatch CTAs once their copies are done): xRecv x w1 with the
//     SwiGLU epilogue -> act [rows, I]; a tile is loaded once its rows' counter is complete;
//     each stored tile adds 1 to its row block's counter rowDone1 (GemmHooks::tileDoneRows).
//  3. GEMM2: act x w2 -> out (fp32 [rows, H]); a row block is loaded once rowDone1 reaches
//     GEMM1's column tile count (every act column of those rows stored); each stored tile adds
//     1 to rowDone2 of its row block, which the peers read.
//  4. Combine: warps claim this rank's tokens; for each routed slot, the slot's row at its
//     owner is read once the owner's rowDone2 of that row block reaches GEMM2's column tile
//     count; the sum is the sequential combine's (combine_dev.cuh), so y is bit for bit the
//     sequential path's.
//  5. End: the last CTA publishes combDone (and, if this rank failed, combFailed first) and
//     waits for every rank's (peers read this rank's out and per-call counters until then; a
//     peer's failure fails this rank's call too: its rows may never have been computed),
//     records the call's deferred errors (a bad expert id, an overflow: recorded earlier they
//     would fail this rank's waits while its peers still need its GEMMs), and finishCall
//     counts the call.
//
// Why it cannot deadlock: every CTA claims GEMM1 tiles until none is left before it claims a
// GEMM2 tile, and publishes its last GEMM1 tile before it waits for any GEMM2 stage (the
// chain's phase word, gemm_chain.cuh), so a GEMM2 tile only waits for GEMM1 tiles already held
// by running CTAs, which wait only for dispatched rows; a CTA combines only once it found no
// GEMM2 tile left of its rank, and the peers' kernels are resident (each rank's grid is at most
// its share of the GPU, launched cooperatively). Every wait is bounded and abortable (the
// comm's WaitCtx).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "device/rt/wait.cuh"
#include "fused/core/fused_dev.cuh"
#include "fused/gemm/gemm_chain.cuh"
#include "fused/ops/moe/combine_dev.cuh"
#include "fused/ops/moe/dispatch_dev.cuh"
#include "fused/ops/moe/fused_moe.cuh"  // kMoeFusedShOff, moeFusedDispatchSmem

namespace mk {
namespace fused {

struct MoeFfnFusedParams {
  gemm::GemmParams g1;  // first: the tensor maps' 64-byte alignment
  gemm::GemmParams g2;
  moedev::MoeParams d;   // d.ffnOut, d.rowDone (= rowDone2), d.deferErrors set
  void* y;               // [T, H] outType
  int32_t* combClaim;    // per-call scratch, zeroed: tokens claimed by combine warps
  uint32_t* ctaDone;     // per-call scratch, zeroed: CTAs through the combine
  int64_t hidden;        // H
  int32_t tilesN2;       // GEMM2's column tiles: a row block of out is complete at this count
  int32_t outType;       // gemm::DType of y
  int32_t nDisp;         // CTAs [0, nDisp) dispatch first
  uint32_t testDelayUs;  // MKERNEL_MOE_FFN_TEST_DELAY_US (tests: late tiles, gemm_chain.cuh)
};

// ErrSite::slot of the protocol error "a peer runs the sequential path" (err_host.cc).
constexpr int32_t kFfnMixedPathsSlot = -4;

// Phase 4 for one warp: claim tokens, wait for each slot's row at its owner, sum. False once a
// wait failed (recorded by the lane that waited): the warp stops.
template <typename O, typename In>
__device__ __forceinline__ bool ffnCombineToken(const MoeFfnFusedParams& p, int64_t t) {
  const moedev::MoeParams& d = p.d;
  const int lane = threadIdx.x & 31;
  const int topk = d.s.topk, epr = d.s.expertsPerRank;
  const float* src = nullptr;
  float w = 0.f;
  bool ok = true;
  if (lane < topk) {
    const int64_t i = t * topk + lane;
    const int32_t e = d.topkIdx[i];
    const int32_t row = d.slotRow[i];
    if (e >= 0 && e < d.s.experts && row >= 0) {
      const int owner = e / epr;
      // Written before the owner's slot.seq release, which thread 0 acquired before the barrier.
      const moedev::MoeSlot& s = d.ctl[owner]->slot;
      const float* base = moedev::moePeerPtr(d, owner, *(const float* const volatile*)&s.out);
      const uint64_t* done = moedev::moePeerPtr(d, owner, *(uint64_t* const volatile*)&s.rowDone);
      const int32_t blk = row / gemm::kTileM;
      if (done == nullptr || base == nullptr) {
        // The owner runs the sequential path of this call (ranks passed different algos,
        // layouts or MKERNEL_MOE_SWIGLU_EPILOGUE): an error naming it, not a fault.
        rt::recordError(d.f.c.w, rt::kErrProtocol,
                        rt::ErrSite{rt::kOpMoeCombine, owner, (int32_t)blockIdx.x,
                                    kFfnMixedPathsSlot, rt::kWaitNone, 0},
                        0, 0);
        ok = false;
      } else {
        ok = rt::waitGe(
            d.f.c.w, done + blk, (uint64_t)p.tilesN2,
            rt::ErrSite{rt::kOpMoeCombine, owner, (int32_t)blockIdx.x, blk, rt::kWaitData, 0},
            d.sysScope ? rt::kScopeSys : rt::kScopeGpu, 32);
        src = base + (int64_t)row * p.hidden;
        w = d.topkWeights[i];
      }
    }
  }
  if (!__all_sync(0xffffffffu, ok)) return false;
  __syncwarp();  // orders each lane's acquire before every lane's reads of its row
  moedev::combineToken<O, In>(src, false, w, topk, p.hidden, static_cast<O*>(p.y) + t * p.hidden);
  return true;
}

template <typename O, typename In>
__device__ void ffnCombine(const MoeFfnFusedParams& p) {
  moedev::claimTokens(p.combClaim, p.d.s.tokens, moedev::kCombineChunk,
                      [&](int64_t t) { return ffnCombineToken<O, In>(p, t); });
}

template <class Tr1, class Tr2>
__global__ void __launch_bounds__(gemm::kThreads, 1)
    moeFfnFusedKernel(const __grid_constant__ MoeFfnFusedParams p) {
  static_assert(Tr1::Pipe::kSmemBytes == Tr2::Pipe::kSmemBytes, "one dynamic smem size");
  extern __shared__ uint8_t smem[];
  const moedev::MoeParams& d = p.d;
  const int me = d.f.rank;
  if ((int32_t)blockIdx.x < p.nDisp) {
    // As in moeFusedKernel: the dispatch state in the dynamic shared memory the GEMMs reuse.
    moedev::MoeShared& sh = *reinterpret_cast<moedev::MoeShared*>(smem);
    moedev::moeDispatchBody(d, reinterpret_cast<int32_t*>(smem + kMoeFusedShOff), sh,
                            (int)blockIdx.x, p.nDisp, /*finish=*/false);
    __syncthreads();
  }
  __shared__ uint64_t seqSh;
  __shared__ int okSh;
  if (threadIdx.x == 0) {
    const uint64_t seq = callSeq(d.f);
    seqSh = seq;
    okSh = !rt::failed(d.f.c.w) &&
           rt::waitGe(d.f.c.w, &d.ctl[me]->rowsReady, seq,
                      moedev::moeSite(d, -1, -1, rt::kWaitFlag), rt::kScopeGpu);
  }
  __syncthreads();
  const uint64_t seq = seqSh;
  if (okSh) {
    // Both GEMMs through one ring and one main loop (gemm_chain.cuh), then every warp back at
    // the launch's registers for the combine.
    gemm::gemmChainCta<Tr1, Tr2>(p.g1, p.g2, smem, p.testDelayUs);
    gemm::gemmCtaHandBack<Tr1>(smem);
  }
  // Every rank's slot of this call (its out and rowDone), acquired by this CTA.
  if (threadIdx.x == 0)
    for (int q = 0; q < d.s.nRanks && okSh; ++q)
      if (!rt::waitGe(d.f.c.w, &d.ctl[q]->slot.seq, seq, moedev::moeSite(d, q, -1, rt::kWaitData),
                      rt::kScopeSys))
        okSh = 0;
  __syncthreads();
  if (okSh) {
    using In = moedev::InElem<Tr1::kF16In>;
    if (p.outType == (int32_t)gemm::DType::kBF16) {
      ffnCombine<__nv_bfloat16, In>(p);
    } else if (p.outType == (int32_t)gemm::DType::kF16) {
      ffnCombine<__half, In>(p);
    } else {
      ffnCombine<float, In>(p);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(p.ctaDone, 1u) == gridDim.x - 1) {
      __threadfence();  // the other CTAs' combines (their fence + count) happened before
      // Published whatever this rank's verdict, so that a peer does not time out for it; a
      // failed rank (abort, timeout) marks the call first: its GEMMs may not have run and its
      // counters are freed behind this kernel, so a peer that read them must not end clean.
      if (rt::failed(d.f.c.w)) ptx::stReleaseSys(&d.ctl[me]->combFailed, seq);
      ptx::stReleaseSys(&d.ctl[me]->combDone, seq);
      bool ok = true;
      for (int q = 0; q < d.s.nRanks && ok; ++q) {
        const rt::ErrSite site{rt::kOpMoeCombine, q, (int32_t)blockIdx.x, -1, rt::kWaitData, 0};
        ok = rt::waitGe(d.f.c.w, &d.ctl[q]->combDone, seq, site, rt::kScopeSys);
        if (ok && rt::ldAcquire(&d.ctl[q]->combFailed, rt::kScopeSys) == seq) {
          rt::recordError(d.f.c.w, rt::kErrPeerFailed, site, seq, 0);
          ok = false;
        }
      }
      if (ok && !rt::failed(d.f.c.w))
        moedev::moeRecordCallErrors(d, *(volatile unsigned long long*)&d.ctl[me]->badSlot,
                                    *(volatile int64_t*)&d.ctl[me]->ovfSpan);
    }
    finishCall(d.f, seq);
  }
}

}  // namespace fused
}  // namespace mk
