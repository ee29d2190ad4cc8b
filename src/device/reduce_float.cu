// Reduction kernels for float and double (accumulated in their own precision).
#include "device/reduce_kernel.cuh"

namespace mk {

cudaError_t launchReduceFloat(const ReduceArgs& a, int grid, cudaStream_t s) {
  switch (a.dtype) {
    case ncclFloat32:
      return dev::launchReduceDt<ncclFloat32>(a, grid, s);
    case ncclFloat64:
      return dev::launchReduceDt<ncclFloat64>(a, grid, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace mk
