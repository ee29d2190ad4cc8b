// Reduction kernels for the integer dtypes (split from the others so that the two CI
// cores compile the reduction instantiations in parallel).
#include "device/reduce_kernel.cuh"

namespace mk {

cudaError_t launchReduceInt(const ReduceArgs& a, int grid, cudaStream_t s) {
  switch (a.dtype) {
    case ncclInt8:
      return dev::launchReduceDt<ncclInt8>(a, grid, s);
    case ncclUint8:
      return dev::launchReduceDt<ncclUint8>(a, grid, s);
    case ncclInt32:
      return dev::launchReduceDt<ncclInt32>(a, grid, s);
    case ncclUint32:
      return dev::launchReduceDt<ncclUint32>(a, grid, s);
    case ncclInt64:
      return dev::launchReduceDt<ncclInt64>(a, grid, s);
    case ncclUint64:
      return dev::launchReduceDt<ncclUint64>(a, grid, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace mk
