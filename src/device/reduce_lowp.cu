// Reduction kernels for half, bfloat16 and both fp8 formats (accumulated in float,
// rounded once per reduction step).
#include "device/reduce_kernel.cuh"

namespace mk {

cudaError_t launchReduceLowp(const ReduceArgs& a, int grid, cudaStream_t s) {
  switch (a.dtype) {
    case ncclFloat16:
      return dev::launchReduceDt<ncclFloat16>(a, grid, s);
    case ncclBfloat16:
      return dev::launchReduceDt<ncclBfloat16>(a, grid, s);
    case ncclFloat8e4m3:
      return dev::launchReduceDt<ncclFloat8e4m3>(a, grid, s);
    case ncclFloat8e5m2:
      return dev::launchReduceDt<ncclFloat8e5m2>(a, grid, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace mk
