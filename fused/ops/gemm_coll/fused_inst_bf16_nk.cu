// Instantiation of the fused GEMM + collective kernels for bf16 inputs and B in the [NK]
// layout (fused_launchers.cuh launchLayout).
#include "fused/ops/gemm_coll/fused_launchers.cuh"

namespace mk {
namespace fused {
template ncclResult_t launchLayout<gemm::DType::kBF16, gemm::BLayout::kNK>(const GcParams&,
                                                                           cudaStream_t, bool);
}  // namespace fused
}  // namespace mk
