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
#include <type_traits>
#include <cuda_runtime.h>

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

// Four In elements (8 bytes, 8-byte aligned) as fp32.
template <typename In>
__device__ __forceinline__ float4 loadIn4(const void* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const In* e = reinterpret_cast<const In*>(&raw);
  return make_float4(toF(e[0]), toF(e[1]), toF(e[2]), toF(e[3]));
}

// Four fp32 values rounded to In, stored as 8 bytes (8-byte aligned).
template <typename In>
__device__ __forceinline__ void storeIn4(void* p, float4 a) {
  uint2 raw;
  In* e = reinterpret_cast<In*>(&raw);
  e[0] = fromF<In>(a.x);
  e[1] = fromF<In>(a.y);
  e[2] = fromF<In>(a.z);
  e[3] = fromF<In>(a.w);
  *reinterpret_cast<uint2*>(p) = raw;
}

// One warp: an fp32 row of `hidden` (a multiple of 4) rounded into an In row, what a returned
// row carries (the combine's In(out_j)). Called by the whole warp.
template <typename In>
__device__ __forceinline__ void roundRow(void* to, const float* from, int64_t hidden) {
  const int lane = threadIdx.x & 31;
  for (int64_t v = lane; v < hidden / 4; v += 32)
    storeIn4<In>(static_cast<uint8_t*>(to) + v * 4 * sizeof(In),
                 reinterpret_cast<const float4*>(from)[v]);
}

// One warp, one token: lane j < topk holds slot j's source row `src` ([hidden] elements, null
// when the slot contributes nothing), whether that row holds In elements (`inRow`: a returned
// row) or GEMM2's fp32 ones, and weight `w`; every lane sums its 4-column groups of In(out_j)
// over the slots in slot order into yr ([hidden] O). Called by the whole warp.
template <typename O, typename In>
__device__ __forceinline__ void combineToken(const void* src, bool inRow, float w, int topk,
                                             int64_t hidden, O* yr) {
  const int lane = threadIdx.x & 31;
  const int64_t vecs = hidden / 4;
  // Every lane walks the same number of rounds: the shuffles below need the whole warp, and a
  // row narrower than 32 groups leaves some lanes without a column.
  for (int64_t v0 = 0; v0 < vecs; v0 += 32) {
    const int64_t v = v0 + lane;
    const bool mine = v < vecs;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < topk; ++j) {
      const uint8_t* s = reinterpret_cast<const uint8_t*>(
          __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(src), j));
      const bool in = __shfl_sync(0xffffffffu, inRow ? 1 : 0, j) != 0;
      const float wj = __shfl_sync(0xffffffffu, w, j);
      if (s == nullptr || !mine) continue;
      float4 x;
      if (in) {
        x = loadIn4<In>(s + v * 4 * sizeof(In));
      } else {
        x = reinterpret_cast<const float4*>(s)[v];
        x = make_float4(roundIn<In>(x.x), roundIn<In>(x.y), roundIn<In>(x.z), roundIn<In>(x.w));
      }
      acc.x += wj * x.x;
      acc.y += wj * x.y;
      acc.z += wj * x.z;
      acc.w += wj * x.w;
    }
    if (mine) storeOut4(yr + v * 4, acc);
  }
}

// Tokens a warp claims at once: few enough that the warps' shares stay even, enough that the
// claims cost little next to reading k rows of H floats per token.
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
