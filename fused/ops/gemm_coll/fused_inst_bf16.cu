// Instantiation of the fused GEMM + collective launchers for bf16 inputs.
#include "fused/ops/gemm_coll/fused_launchers.cuh"

namespace mk {
namespace fused {
template ncclResult_t launchAny<gemm::DType::kBF16>(const GcParams&, bool, cudaStream_t, bool);
}  // namespace fused
}  // namespace mk
