// Instantiation of the fused MoE layer kernel for bf16 inputs.
#include "fused/ops/moe/fused_ffn_launch.cuh"

namespace mk {
namespace fused {
template ncclResult_t moeFfnFusedLaunchIn<gemm::DType::kBF16>(const MoeFfnFusedParams&, int,
                                                              cudaStream_t);
}  // namespace fused
}  // namespace mk
