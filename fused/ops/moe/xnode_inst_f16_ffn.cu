// Instantiation of the fused MoE layer kernel across nodes for f16 inputs.
#include "fused/ops/moe/xnode_launch.cuh"

namespace mk {
namespace fused {
template ncclResult_t moeXnodeLaunchFfn<gemm::DType::kF16>(const MoeXnParams&, int, cudaStream_t);
}  // namespace fused
}  // namespace mk
