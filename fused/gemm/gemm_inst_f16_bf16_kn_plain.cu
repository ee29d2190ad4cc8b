// Instantiation unit: F16 inputs, BF16 output, B [K,N], plain GEMMs.
#include "fused/gemm/gemm_launch.cuh"

namespace mk {
namespace gemm {
MK_GEMM_INSTANTIATE(launchPlain, kF16, kBF16, kKN)
}  // namespace gemm
}  // namespace mk
