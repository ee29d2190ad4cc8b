// Instantiation unit: BF16 inputs, F32 output, B [N,K], grouped GEMMs.
#include "fused/gemm/gemm_launch.cuh"

namespace mk {
namespace gemm {
MK_GEMM_INSTANTIATE(launchGrouped, kBF16, kF32, kNK)
}  // namespace gemm
}  // namespace mk
