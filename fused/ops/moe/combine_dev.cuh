// The combine's arithmetic (device only), shared by the sequential layer's combine kernel
// (ffn.cu) and the fused layer's combine CTAs (fused_ffn.cuh), so that both give the same bits:
// y[t] = sum over the token's slots j, in slot order, of w_j * out_j, in fp32, rounded once.
#pragma once
#include <cstdint>
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

// One warp, one token: lane j < topk holds slot j's source row `src` ([hidden] fp32, null when
// the slot contributes nothing) and weight `w`; every lane sums its float4 columns over the
// slots in slot order into yr ([hidden] O). Called by the whole warp.
template <typename O>
__device__ __forceinline__ void combineToken(const float* src, float w, int topk, int64_t hidden,
                                             O* yr) {
  const int lane = threadIdx.x & 31;
  const int64_t vecs = hidden / 4;
  // Every lane walks the same number of rounds: the shuffles below need the whole warp, and a
  // row narrower than 32 float4s leaves some lanes without a column.
  for (int64_t v0 = 0; v0 < vecs; v0 += 32) {
    const int64_t v = v0 + lane;
    const bool mine = v < vecs;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < topk; ++j) {
      const float* s = reinterpret_cast<const float*>(
          __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(src), j));
      const float wj = __shfl_sync(0xffffffffu, w, j);
      if (s == nullptr || !mine) continue;
      const float4 x = reinterpret_cast<const float4*>(s)[v];
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
