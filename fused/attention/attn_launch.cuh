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
template <int kD, bool kF16>
ncclResult_t launchVariant(const AttnParams& p, int32_t grid, cudaStream_t stream) {
  using C = Cfg<kD, kF16>;
  auto kernel = attnKernel<C>;
  CUDACHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
  if (grid <= 0) return ncclSuccess;
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  CUDACHECK(cudaGetLastError());
  return ncclSuccess;
}

#define MK_ATTN_INSTANTIATE(D)                                                             \
  template ncclResult_t launchVariant<D, false>(const AttnParams&, int32_t, cudaStream_t); \
  template ncclResult_t launchVariant<D, true>(const AttnParams&, int32_t, cudaStream_t);

}  // namespace attn
}  // namespace mk
