// Instantiation unit: BF16 inputs, F16 output, B [N,K], grouped GEMMs.
#include "fused/gemm/gemm_launch.cuh"

namespace mk {
namespace gemm {
MK_GEMM_INSTANTIATE(launchGrouped, kBF16, kF16, kNK)
}  // namespace gemm
}  // namespace mk
