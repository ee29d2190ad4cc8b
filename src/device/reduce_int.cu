// Reduction kernels for the integer dtypes (split from the others so that the two CI
// cores compile the reduction instantiations in parallel).
#include "device/reduce_kernel.cuh"

namespace mk {

cudaError_t launchReduceInt(const ReduceArgs& a, int grid, cudaStream_t s) {
  return dev::launchReduceFamily<kFamInt>(a, grid, s);
}

}  // namespace mk
