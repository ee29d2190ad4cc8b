// PTX forms beyond ptx.cuh's, first needed by the attention engine (fused/attention/): wgmma
// shapes other than the GEMM engine's m64n256k16, the A-from-registers form, 4-D and 5-D TMA
// loads, ex2; thread-block clusters (the GEMM engine's CTA pairs: cluster rank and barrier,
// mbarrier arrive on a cluster peer, multicast TMA loads). Part of the PTX set: one wrapper per
// instruction form, no policy.
//   wgmmaSS<N>: D(64xN, fp32) (+)= A(64x16, K-major smem) * B(16xN, smem descriptor)
//   wgmmaRS<N>: the same with A in registers: four b32 per thread, each two 16-bit values,
//               laid out like the m64nNk16 fp32 accumulator fragment of 16 columns (so a
//               softmax computed on S's accumulators feeds P.V without a shuffle).
// kTransB = 1: B is MN-major (N contiguous), allowed for 16-bit types only.
#pragma once
#include <cstdint>

#include "device/rt/ptx.cuh"

namespace mk {
namespace ptx {

template <int N, bool kF16, int kTransB>
__device__ __forceinline__ void wgmmaSS(float (&d)[N / 2], uint64_t descA, uint64_t descB,
                                        int scaleD) {
  static_assert(N == 64 || N == 128 || N == 176 || N == 192 || N == 256,
                "wgmmaSS: shape not generated");
  // One shape: its generated asm text with the input type spelled (wgmma_asm.inc).
#define MK_SS_SHAPE(SHAPE)                                             \
  if constexpr (kF16) {                                                \
    asm volatile(MK_WGMMA_SS_N##SHAPE##_ASM("f16")                     \
                 : MK_WGMMA_OUTS_##SHAPE(d)                            \
                 : "l"(descA), "l"(descB), "r"(scaleD), "n"(kTransB)); \
  } else {                                                             \
    asm volatile(MK_WGMMA_SS_N##SHAPE##_ASM("bf16")                    \
                 : MK_WGMMA_OUTS_##SHAPE(d)                            \
                 : "l"(descA), "l"(descB), "r"(scaleD), "n"(kTransB)); \
  }
  if constexpr (N == 256) {
    wgmmaM64N256K16<kF16, kTransB>(d, descA, descB, scaleD);
  } else if constexpr (N == 192) {
    // S = Q.K^T of 192-key blocks (attention, head dim 64, MKERNEL_ATTN_D64_VARIANT=1); the
    // GEMM engine's 192-column ping-pong units (GemmArgs::pipeline 4).
    MK_SS_SHAPE(192)
  } else if constexpr (N == 176) {
    // S = Q.K^T of 176-key blocks (attention, head dim 128, MKERNEL_ATTN_D128_VARIANT=1).
    MK_SS_SHAPE(176)
  } else if constexpr (N == 128) {
    MK_SS_SHAPE(128)
  } else {
    MK_SS_SHAPE(64)
  }
#undef MK_SS_SHAPE
}

template <int N, bool kF16, int kTransB>
__device__ __forceinline__ void wgmmaRS(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t descB,
                                        int scaleD) {
  static_assert(N == 64 || N == 128 || N == 256, "wgmmaRS: shape not generated");
#define MK_RS_IN "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(descB), "r"(scaleD), "n"(kTransB)
  if constexpr (N == 256) {
    if constexpr (kF16) {
      asm volatile(MK_WGMMA_RS_N256_ASM("f16") : MK_WGMMA_N256_OUTS(d) : MK_RS_IN);
    } else {
      asm volatile(MK_WGMMA_RS_N256_ASM("bf16") : MK_WGMMA_N256_OUTS(d) : MK_RS_IN);
    }
  } else if constexpr (N == 128) {
    if constexpr (kF16) {
      asm volatile(MK_WGMMA_RS_N128_ASM("f16") : MK_WGMMA_OUTS_128(d) : MK_RS_IN);
    } else {
      asm volatile(MK_WGMMA_RS_N128_ASM("bf16") : MK_WGMMA_OUTS_128(d) : MK_RS_IN);
    }
  } else {
    if constexpr (kF16) {
      asm volatile(MK_WGMMA_RS_N64_ASM("f16") : MK_WGMMA_OUTS_64(d) : MK_RS_IN);
    } else {
      asm volatile(MK_WGMMA_RS_N64_ASM("bf16") : MK_WGMMA_OUTS_64(d) : MK_RS_IN);
    }
  }
#undef MK_RS_IN
}

// Boxes of 4-D and 5-D tensors (attention: [B][S][H][D] and [src][B][S][H][D]); coordinates
// innermost first, out-of-range parts zero-filled.
__device__ __forceinline__ void tmaLoad4d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                          int32_t x, int32_t y, int32_t z, int32_t w) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smemAddr(bar)), "r"(x), "r"(y), "r"(z), "r"(w)
      : "memory");
}
__device__ __forceinline__ void tmaLoad5d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                          int32_t x, int32_t y, int32_t z, int32_t w, int32_t v) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];" ::"r"(smemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smemAddr(bar)), "r"(x), "r"(y), "r"(z), "r"(w),
      "r"(v)
      : "memory");
}

// ---- thread-block clusters ------------------------------------------------------------------

// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t clusterCtaRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster arrives (release) and waits (acquire). Not the
// .aligned form: callers reach it from diverged role branches.
__device__ __forceinline__ void clusterSync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

// Arrives on the mbarrier at `bar`'s offset in the shared memory of cluster CTA `ctaRank` (this
// CTA's own rank included), with the default semantics (release, CTA scope). Not
// .release.cluster: on sm_90 ptxas puts MEMBAR.ALL.CTA, MEMBAR.ALL.GPU, ERRBAR and CGAERRBAR
// before that arrive (an L2 round trip per arrive). The GEMM's stage release needs no
// cluster-scope release: the stage was only read by wgmma (async proxy), complete once
// wgmma.wait_group returns, and no generic write is published through it.
__device__ __forceinline__ void mbarArriveCluster(uint64_t* bar, uint32_t ctaRank) {
  asm volatile(
      "{\n.reg .b32 ra;\n"
      "mapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smemAddr(bar)),
      "r"(ctaRank)
      : "memory");
}

// A 2-D box written to `dst`'s offset in the shared memory of every cluster CTA in `ctaMask`,
// each completing `bar`'s offset in its own shared memory (complete_tx of the box's bytes).
__device__ __forceinline__ void tmaLoad2dMulticast(void* dst, const CUtensorMap* map, uint64_t* bar,
                                                   int32_t x, int32_t y, uint16_t ctaMask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smemAddr(bar)), "r"(x), "r"(y), "h"(ctaMask)
      : "memory");
}

// tmaLoad2dMulticast's 3-D form (a grouped GEMM's B: z = the group).
__device__ __forceinline__ void tmaLoad3dMulticast(void* dst, const CUtensorMap* map, uint64_t* bar,
                                                   int32_t x, int32_t y, int32_t z,
                                                   uint16_t ctaMask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(smemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smemAddr(bar)), "r"(x), "r"(y), "r"(z), "h"(ctaMask)
      : "memory");
}

// A 1-D bulk copy written to `dst`'s offset in the shared memory of every cluster CTA in
// `ctaMask`, each completing `bar`'s offset in its own shared memory (see bulkLoad1d).
__device__ __forceinline__ void bulkLoad1dMulticast(void* dst, const void* src, uint32_t bytes,
                                                    uint64_t* bar, uint16_t ctaMask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1], %2, [%3], %4;" ::"r"(smemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smemAddr(bar)), "h"(ctaMask)
      : "memory");
}

// Arrives on named barrier `id` without waiting (the waiting side runs bar.sync with the same
// thread count): hands a turn to another warpgroup.
__device__ __forceinline__ void namedBarArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// fenceAccumulators for any fragment size (see ptx.cuh).
template <int R>
__device__ __forceinline__ void fenceRegs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void fenceRegs(uint32_t (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// ex2.approx: 2^x in one MUFU op (the softmax's exponential; -inf gives +0).
__device__ __forceinline__ float exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace ptx
}  // namespace mk
