// The stand-alone attention kernel and its launcher, instantiated per (head dim, input type) in
// attn_inst_*.cu so the variants compile in parallel.
#pragma once

#include <cstdint>
#include "base/checks.h"
#include "fused/attention/attn_kernel.cuh"

namespace mk {
namespace attn {

template <class C>
__global__ void __launch_bounds__(C::kThreads, 1) attnKernel(const __grid_constant__ AttnParams p) {
  extern __shared__ uint8_t smem[];
  attnCta<C>(p, smem, blockIdx.x, gridDim.x);
}

// grid <= 0: only loads the kernel (preload).
template <class C>
ncclResult_t launchCfg(const AttnParams& p, int32_t grid, cudaStream_t stream) {
  auto kernel = attnKernel<C>;
  CUDACHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
  if (grid <= 0) return ncclSuccess;
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  CUDACHECK(cudaGetLastError());
  return ncclSuccess;
}

template <int kD, bool kF16>
ncclResult_t launchVariant(const AttnParams& p, bool overlap, int32_t grid, cudaStream_t stream) {
  return withCfg<kD, kF16>(overlap, p.variant,
                           [&](auto c) { return launchCfg<decltype(c)>(p, grid, stream); });
}

// The variants' kernels of head dims 64 and 128 (both input types), each in its own unit
// (attn_inst_d64_v*.cu, attn_inst_d128_v*.cu) so they compile in parallel; extern in
// attn_inst_d64.cu / attn_inst_d128.cu.
#define MK_ATTN_VARIANT(EXTERN, D, V)                                                        \
  EXTERN template ncclResult_t launchCfg<Cfg<D, false, true, V>>(const AttnParams&, int32_t, \
                                                                 cudaStream_t);              \
  EXTERN template ncclResult_t launchCfg<Cfg<D, true, true, V>>(const AttnParams&, int32_t,  \
                                                                cudaStream_t);
#define MK_ATTN_D64_VARIANT(EXTERN, V) MK_ATTN_VARIANT(EXTERN, 64, V)

#define MK_ATTN_INSTANTIATE(D)                                                                   \
  template ncclResult_t launchVariant<D, false>(const AttnParams&, bool, int32_t, cudaStream_t); \
  template ncclResult_t launchVariant<D, true>(const AttnParams&, bool, int32_t, cudaStream_t);

}  // namespace attn
}  // namespace mk
