// Instantiation of the fused GEMM + collective kernels for f16 inputs, B in the [NK] layout,
// the reduce (AllReduce, ReduceScatter) kernels (fused_launchers.cuh).
#include "fused/ops/gemm_coll/fused_launchers.cuh"

namespace mk {
namespace fused {
template ncclResult_t launchReduce<gemm::DType::kF16, gemm::BLayout::kNK>(const GcParams&,
                                                                          cudaStream_t, bool);
}  // namespace fused
}  // namespace mk
