// The combine's arithmetic (device only), shared by every combine of the layer (the clique's
// sequential kernel, ffn.cu; the AllToAll path's, a2a.cu; the fused kernels' combine CTAs,
// fused_ffn.cuh and xnode_kernel.cuh), so that every path gives the same bits:
// y[t] = sum over the token's slots j, in slot order, of w_j * In(out_j), in fp32, rounded once
// to outType. In(out_j) is the expert's output rounded to the layer's input type, as torch's
// grouped GEMM returns it: a row that travels back to its token's rank (the AllToAll path, the
// fused kernel across nodes) then carries 2 bytes an element instead of 4, and a row read where
// GEMM2 stored it in fp32 is rounded here, to the same value.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "fused/core/elem.cuh"

namespace mk {
namespace fused {
namespace moedev {

template <typename O>
__device__ __forceinline__ void storeOut4(O* y, float4 a) {
  y[0] = fromF<O>(a.x);
  y[1] = fromF<O>(a.y);
  y[2] = fromF<O>(a.z);
  y[3] = fromF<O>(a.w);
}

// The layer's input element type (the gemm Traits' kF16In).
template <bool kF16>
using InElem = typename std::conditional<kF16, __half, __nv_bfloat16>::type;

// x rounded to In and back: exact for a value already in In.
template <typename In>
__device__ __forceinline__ float roundIn(float x) {
  return toF(fromF<In>(x));
}

// Columns a lane takes at once: 16 bytes of In, two float4 of fp32 (hidden is a multiple of 8:
// check.cc, 16-byte token rows; every row base is 16-byte aligned).
constexpr int kCombineCols = 8;

// Eight In elements (16 bytes) as fp32.
template <typename In>
__device__ __forceinline__ void loadIn8(const void* p, float* x) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  In e[kCombineCols];
  memcpy(e, &raw, sizeof(raw));
#pragma unroll
  for (int i = 0; i < kCombineCols; ++i) x[i] = toF(e[i]);
}

// Eight fp32 values rounded to In, stored as 16 bytes.
template <typename In>
__device__ __forceinline__ void storeIn8(void* p, const float* x) {
  In e[kCombineCols];
#pragma unroll
  for (int i = 0; i < kCombineCols; ++i) e[i] = fromF<In>(x[i]);
  uint4 raw;
  memcpy(&raw, e, sizeof(raw));
  *reinterpret_cast<uint4*>(p) = raw;
}

// Column group v (kCombineCols fp32 values, two float4) of an fp32 row.
__device__ __forceinline__ void loadF8(const void* row, int64_t v, float* x) {
  const float4 a = static_cast<const float4*>(row)[2 * v];
  const float4 b = static_cast<const float4*>(row)[2 * v + 1];
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
  x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

// One warp: an fp32 row of `hidden` rounded into an In row, what a returned row carries (the
// combine's In(out_j)).
template <typename In>
__device__ __forceinline__ void roundRow(void* to, const float* from, int64_t hidden) {
  const int lane = threadIdx.x & 31;
  for (int64_t v = lane; v < hidden / kCombineCols; v += 32) {
    float x[kCombineCols];
    loadF8(from, v, x);
    storeIn8<In>(static_cast<uint8_t*>(to) + v * sizeof(uint4), x);
  }
}

// One warp, one token: lane j < topk holds slot j's source row `src` ([hidden] elements, null
// when the slot contributes nothing), whether that row holds In elements (`inRow`: a returned
// row) or GEMM2's fp32 ones, and weight `w`; every lane sums its 8-column groups of In(out_j)
// over the slots in slot order into yr ([hidden] O). Called by the whole warp.
template <typename O, typename In>
__device__ __forceinline__ void combineToken(const void* src, bool inRow, float w, int topk,
                                             int64_t hidden, O* yr) {
  const int lane = threadIdx.x & 31;
  const int64_t vecs = hidden / kCombineCols;
  // inRow rides in bit 0 of the row's address (16-byte aligned): one shuffle carries both.
  const uintptr_t tagged = reinterpret_cast<uintptr_t>(src) | (inRow ? 1u : 0u);
  // Every lane walks the same number of rounds: the shuffles below need the whole warp, and a
  // row narrower than 32 groups leaves some lanes without a column.
  for (int64_t v0 = 0; v0 < vecs; v0 += 32) {
    const int64_t v = v0 + lane;
    const bool mine = v < vecs;
    float acc[kCombineCols];
#pragma unroll
    for (int i = 0; i < kCombineCols; ++i) acc[i] = 0.f;
    for (int j = 0; j < topk; ++j) {
      const uintptr_t sj = __shfl_sync(0xffffffffu, tagged, j);
      const float wj = __shfl_sync(0xffffffffu, w, j);
      const uint8_t* s = reinterpret_cast<const uint8_t*>(sj & ~(uintptr_t)1);
      if (s == nullptr || !mine) continue;
      float x[kCombineCols];
      if (sj & 1) {
        loadIn8<In>(s + v * sizeof(uint4), x);
      } else {
        loadF8(s, v, x);
#pragma unroll
        for (int i = 0; i < kCombineCols; ++i) x[i] = roundIn<In>(x[i]);
      }
#pragma unroll
      for (int i = 0; i < kCombineCols; ++i) acc[i] += wj * x[i];
    }
    if (mine) {
      storeOut4(yr + v * kCombineCols, make_float4(acc[0], acc[1], acc[2], acc[3]));
      storeOut4(yr + v * kCombineCols + 4, make_float4(acc[4], acc[5], acc[6], acc[7]));
    }
  }
}

// Host side: f(TypeTag<O>{}, TypeTag<In>{}) for a layer's types (y in outType: bf16, fp16,
// else fp32; the experts' outputs rounded to inType: fp16, else bf16). The combine kernels'
// launchers pick their instantiation with it.
template <typename T>
struct TypeTag {
  using type = T;
};
template <class F>
auto byLayerTypes(ncclDataType_t inType, ncclDataType_t outType, F f) {
  auto withIn = [&](auto in) {
    switch (outType) {
      case ncclBfloat16:
        return f(TypeTag<__nv_bfloat16>{}, in);
      case ncclFloat16:
        return f(TypeTag<__half>{}, in);
      default:
        return f(TypeTag<float>{}, in);
    }
  };
  return inType == ncclFloat16 ? withIn(TypeTag<__half>{}) : withIn(TypeTag<__nv_bfloat16>{});
}

// Tokens a warp claims at once: few enough that the warps' shares stay even, enough that the
// claims cost little next to reading k rows of H elements per token.
constexpr int kCombineChunk = 4;

// Warps claim `chunk` tokens at a time from *claim (a per-call counter, zeroed before the
// kernel) until none of the `tokens` is left; each(t) combines token t and returns false to
// stop the warp (a wait failed). Called by the whole warp.
template <class F>
__device__ __forceinline__ void claimTokens(int32_t* claim, int64_t tokens, int chunk,
                                            const F& each) {
  const int lane = threadIdx.x & 31;
  for (;;) {
    int32_t t0 = 0;
    if (lane == 0) t0 = atomicAdd(claim, chunk);
    t0 = __shfl_sync(0xffffffffu, t0, 0);
    if (t0 >= tokens) return;
    const int64_t end = (int64_t)t0 + chunk < tokens ? (int64_t)t0 + chunk : tokens;
    for (int64_t t = t0; t < end; ++t)
      if (!each(t)) return;
  }
}

}  // namespace moedev
}  // namespace fused
}  // namespace mk
