// Instantiation of the fused GEMM + collective launchers for f16 inputs.
#include "fused/ops/gemm_coll/fused_launchers.cuh"

namespace mk {
namespace fused {
template ncclResult_t launchAny<gemm::DType::kF16>(const GcParams&, bool, cudaStream_t, bool);
}  // namespace fused
}  // namespace mk
