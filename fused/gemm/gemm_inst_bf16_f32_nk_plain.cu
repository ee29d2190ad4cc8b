// Instantiation unit: BF16 inputs, F32 output, B [N,K], plain GEMMs.
#include "fused/gemm/gemm_launch.cuh"

namespace mk {
namespace gemm {
MK_GEMM_INSTANTIATE(launchPlain, kBF16, kF32, kNK)
}  // namespace gemm
}  // namespace mk
