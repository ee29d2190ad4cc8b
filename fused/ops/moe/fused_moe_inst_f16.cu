// Instantiation of the fused dispatch + grouped GEMM kernel for f16 inputs.
#include "fused/ops/moe/fused_moe_launch.cuh"

namespace mk {
namespace fused {
template ncclResult_t moeFusedLaunchIn<gemm::DType::kF16>(const MoeFusedParams&, gemm::DType, bool,
                                                          int, cudaStream_t);
}  // namespace fused
}  // namespace mk
