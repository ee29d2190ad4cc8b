// Instantiation unit: F16 inputs, F32 output, B [K,N], plain GEMMs.
#include "fused/gemm/gemm_launch.cuh"

namespace mk {
namespace gemm {
MK_GEMM_INSTANTIATE(launchPlain, kF16, kF32, kKN)
}  // namespace gemm
}  // namespace mk
