// Instantiation of the fused MoE dispatch + GEMM kernel across nodes for bf16 inputs.
#include "fused/ops/moe/xnode_launch.cuh"

namespace mk {
namespace fused {
template ncclResult_t moeXnodeLaunchDispatch<gemm::DType::kBF16>(const MoeXnParams&, gemm::DType,
                                                                 bool, int, cudaStream_t);
}  // namespace fused
}  // namespace mk
