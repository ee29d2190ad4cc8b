// ncclMoeDispatchFfnCombine: the whole MoE layer on the sequential path.
//
// Per call, on the caller's stream: the dispatch kernel (dispatch.cu: rows into the experts'
// owners' packed buffers, each routed slot's row kept in slotRow), grouped GEMM1 (xRecv x w1
// -> h, [rows, 2I]), the SwiGLU kernel (h -> act, [rows, I]), grouped GEMM2 (act x w2 -> out,
// fp32 [rows, H]), then the combine kernel: every rank publishes its `out` in its combine
// clique slot (release of slot.seq = seq, from the combine kernel, which starts only after
// this rank's GEMM2 has completed), waits for every rank's slot, and sums each of its tokens'
// slots from the owners' `out` rows, weighted, in slot order.
//
// Why no rank overwrites `out` while a peer still reads it: a rank's next GEMM2 runs after
// its next dispatch kernel, which ends only when every rank's next dispatch kernel has
// released its rows (dispatch.cu, step 5), and a rank's next dispatch is stream-ordered after
// its combine of this call.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "base/checks.h"
#include "base/cudawrap.h"
#include "base/debug.h"
#include "comm/comm.h"
#include "device/rt/wait.cuh"
#include "fused/core/clique_block.h"
#include "fused/core/elem.cuh"
#include "fused/core/fused_comm.h"
#include "fused/core/fused_dev.cuh"
#include "fused/ops/moe/combine_dev.cuh"
#include "fused/ops/gemm_coll/gemm_coll.h"
#include "fused/ops/moe/moe.h"

namespace mk {
namespace fused {

namespace {

constexpr int kCombineMaxLocal = 32;  // as the dispatch's clique (kMoeMaxLocal)
constexpr int kFfnThreads = 256;
constexpr int kFfnWarps = kFfnThreads / 32;

struct CombineSlot {
  uint64_t seq;      // released (system scope) after `out`: this rank's GEMM2 has completed
  const float* out;  // [maxRows, H] fp32 of this call
  uint64_t pad[6];
};
struct CombineClique {
  CombineSlot slot[kCombineMaxLocal];
};

// ---- SwiGLU: act[r][c] = silu(h[r][c]) * h[r][I + c], rows below the layout's span -------

template <typename T>
struct Vec8 {
  T v[8];
};

struct SwigluParams {
  const void* h;        // [maxRows, 2I]
  void* act;            // [maxRows, I]
  const int32_t* span;  // expertOffset + E/n: rows the layout spans this call (device)
  int64_t inter;        // I (a multiple of 8)
};

template <typename T>
__global__ void __launch_bounds__(kFfnThreads) moeSwigluKernel(const SwigluParams p) {
  const int64_t rows = *p.span;
  const int64_t vecsPerRow = p.inter / 8;
  const int64_t total = rows * vecsPerRow;
  const T* h = static_cast<const T*>(p.h);
  T* act = static_cast<T*>(p.act);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / vecsPerRow, c = (i - r * vecsPerRow) * 8;
    const Vec8<T> g = *reinterpret_cast<const Vec8<T>*>(h + r * 2 * p.inter + c);
    const Vec8<T> u = *reinterpret_cast<const Vec8<T>*>(h + r * 2 * p.inter + p.inter + c);
    Vec8<T> o;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float gf = toF(g.v[j]);
      o.v[j] = fromF<T>(gf / (1.0f + __expf(-gf)) * toF(u.v[j]));
    }
    *reinterpret_cast<Vec8<T>*>(act + r * p.inter + c) = o;
  }
}

// ---- Combine: y[t] = sum_j w[t][j] * out_{owner(e_tj)}[slotRow[t][j]] ---------------------

struct CombineParams {
  FusedComm f;
  CombineClique* q;
  const float* out;  // this rank's [maxRows, H]
  const int32_t* slotRow;
  const int32_t* topkIdx;
  const float* topkWeights;
  void* y;  // [T, H] outType
  int64_t tokens, hidden;
  int32_t topk, expertsPerRank, experts, nRanks;
};

// One warp per token: lane j < k fetches slot j's source row (the owner's fp32 out), then the
// warp sums them (combine_dev.cuh: slot order, the arithmetic of every combine of the layer).
template <typename O, typename In>
__device__ void combineRows(const CombineParams& p) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t)blockIdx.x * kFfnWarps + (threadIdx.x >> 5);
  const int64_t warps = (int64_t)gridDim.x * kFfnWarps;
  for (int64_t t = warp; t < p.tokens; t += warps) {
    const float* src = nullptr;
    float w = 0.f;
    if (lane < p.topk) {
      const int64_t i = t * p.topk + lane;
      const int32_t e = p.topkIdx[i];
      const int32_t row = p.slotRow[i];
      if (e >= 0 && e < p.experts && row >= 0) {
        // Written by the peer's kernel: read after thread 0's acquire and the barrier.
        const float* base = *(const float* const volatile*)&p.q->slot[e / p.expertsPerRank].out;
        src = base + (int64_t)row * p.hidden;
        w = p.topkWeights[i];
      }
    }
    moedev::combineToken<O, In>(src, false, w, p.topk, p.hidden,
                                static_cast<O*>(p.y) + t * p.hidden);
  }
}

template <typename O, typename In>
__global__ void __launch_bounds__(kFfnThreads, 1)
    moeCombineKernel(const __grid_constant__ CombineParams p) {
  __shared__ uint64_t seqSh;
  __shared__ int ok;
  const int me = p.f.rank;
  if (threadIdx.x == 0) {
    seqSh = callSeq(p.f);
    ok = 1;
    // Published even when this rank's comm failed earlier in the call (an overflow or a bad
    // id the dispatch reported): its peers must not time out for it.
    if (blockIdx.x == 0) {
      CombineSlot& s = p.q->slot[me];
      s.out = p.out;
      __threadfence_system();
      ptx::stReleaseSys(&s.seq, seqSh);
    }
    for (int q = 0; q < p.nRanks && ok; ++q)
      if (!rt::waitGe(p.f.c.w, &p.q->slot[q].seq, seqSh,
                      rt::ErrSite{p.f.c.w.op, q, (int32_t)blockIdx.x, -1, rt::kWaitData, 0},
                      rt::kScopeSys))
        ok = 0;
  }
  __syncthreads();
  if (ok) combineRows<O, In>(p);
  __syncthreads();
  if (threadIdx.x == 0) finishCall(p.f, seqSh);
}

using CombineKernel = void (*)(CombineParams);

// The combine kernel of the layer's types (y in outType, the experts' outputs rounded to inType).
CombineKernel combineKernelOf(ncclDataType_t inType, ncclDataType_t outType) {
  return moedev::byLayerTypes(inType, outType, [](auto o, auto in) -> CombineKernel {
    return moeCombineKernel<typename decltype(o)::type, typename decltype(in)::type>;
  });
}

template <typename T>
cudaError_t launchSwiglu(const SwigluParams& p, int grid, cudaStream_t s) {
  moeSwigluKernel<T><<<grid, kFfnThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t launchCombine(const MoeCall& c, const CombineParams& p, int grid, cudaStream_t s) {
  combineKernelOf(c.inType, c.cfg.outType)<<<grid, kFfnThreads, 0, s>>>(p);
  return cudaGetLastError();
}

// Loads every kernel of the call before the first launch (see moeGemm).
ncclResult_t preloadFfnKernels(ncclDataType_t inType, ncclDataType_t outType) {
  cudaFuncAttributes a;
  if (inType == ncclBfloat16)
    CUDACHECK(cudaFuncGetAttributes(&a, moeSwigluKernel<__nv_bfloat16>));
  else
    CUDACHECK(cudaFuncGetAttributes(&a, moeSwigluKernel<__half>));
  CUDACHECK(cudaFuncGetAttributes(&a, combineKernelOf(inType, outType)));
  return ncclSuccess;
}

}  // namespace

ncclResult_t moeSwiglu(const MoeCall& c, int smBudget) {
  SwigluParams sp;
  sp.h = c.buf.h;
  sp.act = c.buf.act;
  sp.span = c.buf.expertOffset + c.E / c.comm->nRanks;
  sp.inter = (int64_t)c.I;
  // Not persistent and never waiting: any grid is safe; the rank's share of the SMs suffices
  // for an elementwise pass.
  const int grid = std::max(1, smBudget) * 4;
  const cudaError_t e = c.inType == ncclBfloat16 ? launchSwiglu<__nv_bfloat16>(sp, grid, c.stream)
                                                 : launchSwiglu<__half>(sp, grid, c.stream);
  if (e != cudaSuccess) {
    MK_WARN("%s: SwiGLU launch: %s", moeApi(c), cudaGetErrorString(e));
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

ncclResult_t moeSwigluPreload(const MoeCall& c) {
  cudaFuncAttributes a;
  if (c.inType == ncclBfloat16)
    CUDACHECK(cudaFuncGetAttributes(&a, moeSwigluKernel<__nv_bfloat16>));
  else
    CUDACHECK(cudaFuncGetAttributes(&a, moeSwigluKernel<__half>));
  return ncclSuccess;
}

ncclResult_t moeFfnRun(const MoeCall& c) {
  ncclComm* comm = c.comm;
  const char* api = moeApi(c);
  if (c.cfg.algo == ncclFusedFused) {
    // ncclFusedAuto keeps the sequential path until the fused kernel is measured faster
    // (bench_moe_threads_bench --ffn).
    bool ran = false;
    NCCLCHECK(moeFfnFusedRun(c, &ran));
    if (ran) return ncclSuccess;
  }
  FusedComm f;
  NCCLCHECK(fusedCommView(comm, rt::kOpMoeCombine, &f));
  void* block = nullptr;
  NCCLCHECK(
      cliqueBlockForCall(comm, kCliqueMoeCombine, sizeof(CombineClique), c.stream, api, &block));
  gemm::GemmArgs g1, g2;
  const bool actInGemm = moeSwigluInGemm(c);
  NCCLCHECK(moeGemm(c, c.buf.xRecv, c.w1, 2 * c.I, c.H, actInGemm ? c.buf.act : c.buf.h, c.inType,
                    &g1, actInGemm));
  NCCLCHECK(moeGemm(c, c.buf.act, c.w2, c.H, c.I, c.buf.out, ncclFloat32, &g2));
  NCCLCHECK(preloadFfnKernels(c.inType, c.cfg.outType));

  CombineParams cp{};
  cp.f = f;
  cp.q = static_cast<CombineClique*>(block);
  cp.out = c.buf.out;
  cp.topkIdx = c.topkIdx;
  cp.topkWeights = c.topkWeights;
  cp.y = c.yOut;
  cp.tokens = (int64_t)c.T;
  cp.hidden = (int64_t)c.H;
  cp.topk = c.k;
  cp.expertsPerRank = c.E / comm->nRanks;
  cp.experts = c.E;
  cp.nRanks = comm->nRanks;
  const int combineGrid = moeCommGrid(c, f.smBudget, (int64_t)c.T, kFfnWarps);

  int32_t* slotRow = nullptr;
  ncclResult_t res = moeDispatch(c, &slotRow);
  cp.slotRow = slotRow;
  // Queued behind the dispatch kernel only after every in-process peer launched its own
  // (moeDispatch returns after the rendezvous' launch wait), as in moeRun.
  if (res == ncclSuccess) res = gemm::launch(g1, c.stream);
  if (res == ncclSuccess && !actInGemm) res = moeSwiglu(c, f.smBudget);
  if (res == ncclSuccess) res = gemm::launch(g2, c.stream);
  // A continuation: the dispatch may already have reported an overflow or a bad id on this
  // rank, and the peers' combines still wait for this rank's slot.
  if (res == ncclSuccess)
    res = fusedEnqueue(
        comm, c.stream, api,
        [&](cudaStream_t s) -> ncclResult_t {
          CUDACHECK(launchCombine(c, cp, combineGrid, s));
          return ncclSuccess;
        },
        true);
  return fusedFreeScratch(slotRow, c.stream, res, api);
}

}  // namespace fused
}  // namespace mk
