// Instantiation unit: BF16 inputs, BF16 output, B [K,N].
#include "fused/gemm/gemm_launch.cuh"

namespace mk {
namespace gemm {
MK_GEMM_INSTANTIATE(kBF16, kBF16, kKN)
}  // namespace gemm
}  // namespace mk
