// Launchers of the fused MoE layer kernel per input type (fused_ffn.cuh); the template
// instantiations live in fused_ffn_inst_{bf16,f16}.cu so that they compile in parallel.
#pragma once
#include "base/checks.h"
#include "fused/core/framework.h"
#include "fused/ops/moe/fused_ffn.cuh"

namespace mk {
namespace fused {

// Cooperative launch of `grid` CTAs (refused by the runtime rather than left waiting for CTAs
// that never start); grid 0 only loads the kernel (see moeFusedLaunchTr). Both GEMMs run the
// grouped deep ring (GroupPipe) with B [N, K]: GEMM1 with the SwiGLU epilogue into inType,
// GEMM2 into fp32, as the sequential path's GroupPipe tile for tile.
template <gemm::DType kIn>
ncclResult_t moeFfnFusedLaunchIn(const MoeFfnFusedParams& p, int grid, cudaStream_t stream) {
  using gemm::BLayout;
  using gemm::GroupPipe;
  using Tr1 = gemm::Traits<kIn, kIn, BLayout::kNK, GroupPipe, true>;
  using Tr2 = gemm::Traits<kIn, gemm::DType::kF32, BLayout::kNK, GroupPipe>;
  return launchCooperative(moeFfnFusedKernel<Tr1, Tr2>, grid, gemm::kThreads, GroupPipe::kSmemBytes,
                           stream, p);
}

extern template ncclResult_t moeFfnFusedLaunchIn<gemm::DType::kBF16>(const MoeFfnFusedParams&, int,
                                                                     cudaStream_t);
extern template ncclResult_t moeFfnFusedLaunchIn<gemm::DType::kF16>(const MoeFfnFusedParams&, int,
                                                                    cudaStream_t);

}  // namespace fused
}  // namespace mk
