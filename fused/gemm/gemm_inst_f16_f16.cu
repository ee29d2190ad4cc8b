// Instantiation unit: F16 inputs, F16 output, both B layouts.
#include "fused/gemm/gemm_launch.cuh"

namespace mk {
namespace gemm {
MK_GEMM_INSTANTIATE(kF16, kF16)
}  // namespace gemm
}  // namespace mk
