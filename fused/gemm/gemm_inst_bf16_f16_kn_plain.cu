// Instantiation unit: BF16 inputs, F16 output, B [K,N], plain GEMMs.
#include "fused/gemm/gemm_launch.cuh"

namespace mk {
namespace gemm {
MK_GEMM_INSTANTIATE(launchPlain, kBF16, kF16, kKN)
}  // namespace gemm
}  // namespace mk
