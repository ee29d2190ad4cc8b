// The GEMM CTA's stream-K parts (gemm_kernel.cuh, Traits::kStreamK; the plan in streamk.h): a
// non-finisher part hands its partial accumulators to the tile's finisher through the engine's
// workspace, and the finisher adds them in before its epilogue.
#pragma once
#include <cstdint>

#include "device/rt/ptx.cuh"
#include "device/rt/wait.cuh"
#include "fused/gemm/primitives.cuh"

namespace mk {
namespace gemm {

// Stream-K, a non-finisher part: this WG's 128 accumulators a thread go to the CTA's
// workspace slot in fragment order, float4 i of thread tid at [i][tid] (a warp's stores are
// 512 contiguous bytes; the finisher reads with the same mapping, so no layout is needed),
// through L2 (st.cg: the finisher runs on another SM). Then every thread's stores are fenced
// at GPU scope before the WG's barrier, after which one thread releases the WG's flag with
// the launch's epoch (the pattern of publishTile).
__device__ __forceinline__ void skStorePartial(const GemmParams& p, float (&acc)[128], int32_t cta,
                                               int32_t wg) {
  const int32_t tid = threadIdx.x & 127;
  float4* dst = p.skWork + (size_t)(cta * kConsumerWGs + wg) * (32 * 128) + tid;
#pragma unroll
  for (int i = 0; i < 32; ++i)
    __stcg(dst + i * 128, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
  __threadfence();
  ptx::namedBarSync(1 + wg, 128);
  if (tid == 0) rt::releaseFlag(p.skFlags + cta * kConsumerWGs + wg, p.skEpoch, false);
}

// Stream-K, the finisher part of tile `tile`: thread 0 of the WG waits (bounded, abortable:
// GemmArgs::hooks.wait) for the same WG's flag of every other contributor, the WG learns the
// verdict through one barrier (which also orders thread 0's acquires before every thread's
// reads), and each thread adds the partials into its registers. False on timeout/abort
// (recorded by the wait): the tile is not stored.
__device__ __forceinline__ bool skAddPartials(const GemmParams& p, float (&acc)[128], int32_t cta,
                                              int32_t tile, int32_t wg) {
  const int32_t tid = threadIdx.x & 127;
  const int32_t last = skContribEnd(p.sk, cta, tile);
  bool ok = true;
  if (tid == 0) {
    for (int32_t c = cta + 1; ok && c < last; ++c)
      ok = rt::waitFlag(p.hooks.wait, p.skFlags + c * kConsumerWGs + wg, p.skEpoch, c, false);
  }
  if (!ptx::namedBarAnd(1 + wg, 128, ok)) return false;
  for (int32_t c = cta + 1; c < last; ++c) {
    const float4* src = p.skWork + (size_t)(c * kConsumerWGs + wg) * (32 * 128) + tid;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const float4 v = __ldcg(src + i * 128);
      acc[4 * i] += v.x;
      acc[4 * i + 1] += v.y;
      acc[4 * i + 2] += v.z;
      acc[4 * i + 3] += v.w;
      // At most 8 float4 loads in flight: the 128 accumulators leave no room for a second copy.
      if ((i & 7) == 7) ptx::fenceAccumulators(acc);
    }
  }
  return true;
}

}  // namespace gemm
}  // namespace mk
