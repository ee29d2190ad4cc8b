// Instantiation unit: BF16 inputs, BF16 output, both B layouts.
#include "fused/gemm/gemm_launch.cuh"

namespace mk {
namespace gemm {
MK_GEMM_INSTANTIATE(kBF16, kBF16)
}  // namespace gemm
}  // namespace mk
