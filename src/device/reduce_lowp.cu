// Reduction kernels for half, bfloat16 and both fp8 formats (accumulated in float,
// rounded once per reduction step).
#include "device/reduce_kernel.cuh"

namespace mk {

cudaError_t launchReduceLowp(const ReduceArgs& a, int grid, cudaStream_t s) {
  return dev::launchReduceFamily<kFamLowp>(a, grid, s);
}

}  // namespace mk
