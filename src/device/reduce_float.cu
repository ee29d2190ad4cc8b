// Reduction kernels for float and double (accumulated in their own precision).
#include "device/reduce_kernel.cuh"

namespace mk {

cudaError_t launchReduceFloat(const ReduceArgs& a, int grid, cudaStream_t s) {
  return dev::launchReduceFamily<kFamFloat>(a, grid, s);
}

}  // namespace mk
