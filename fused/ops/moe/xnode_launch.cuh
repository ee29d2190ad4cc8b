// Launchers of the fused MoE kernel across nodes (xnode_kernel.cuh) per input type; the
// template instantiations live in xnode_inst_*.cu so that they compile in parallel.
#pragma once
#include "base/checks.h"
#include "fused/core/framework.h"
#include "fused/gemm/dtype_built.h"
#include "fused/ops/moe/xnode_kernel.cuh"

namespace mk {
namespace fused {

// Cooperative launch of `grid` CTAs (refused by the runtime rather than left waiting for CTAs
// that never start); grid 0 only loads the kernel. The grouped deep ring (GroupPipe), as the
// sequential path's GEMMs tile for tile.
// The layer: GEMM1 [N,K] with the SwiGLU epilogue into the input type, GEMM2 into fp32.
template <gemm::DType kIn>
ncclResult_t moeXnodeLaunchFfn(const MoeXnParams& p, int grid, cudaStream_t stream) {
  using gemm::BLayout;
  using gemm::GroupPipe;
  using Tr1 = gemm::Traits<kIn, kIn, BLayout::kNK, GroupPipe, true>;
  using Tr2 = gemm::Traits<kIn, gemm::DType::kF32, BLayout::kNK, GroupPipe>;
  return launchCooperative(moeXnodeKernel<Tr1, Tr2, true>, grid, gemm::kThreads,
                           GroupPipe::kSmemBytes, stream, p);
}

template <gemm::DType kIn, gemm::DType kOut>
ncclResult_t moeXnodeLaunchOut(const MoeXnParams& p, bool kn, int grid, cudaStream_t stream) {
  using gemm::BLayout;
  using gemm::GroupPipe;
  using TrKN = gemm::Traits<kIn, kOut, BLayout::kKN, GroupPipe>;
  using TrNK = gemm::Traits<kIn, kOut, BLayout::kNK, GroupPipe>;
  return kn ? launchCooperative(moeXnodeKernel<TrKN, TrKN, false>, grid, gemm::kThreads,
                                GroupPipe::kSmemBytes, stream, p)
            : launchCooperative(moeXnodeKernel<TrNK, TrNK, false>, grid, gemm::kThreads,
                                GroupPipe::kSmemBytes, stream, p);
}

// The dispatch call: one grouped GEMM into the output type, either weight layout.
template <gemm::DType kIn>
ncclResult_t moeXnodeLaunchDispatch(const MoeXnParams& p, gemm::DType out, bool kn, int grid,
                                    cudaStream_t stream) {
  return gemm::byOutType(out, "ncclMoeDispatchGemm", [&](auto t) {
    return moeXnodeLaunchOut<kIn, decltype(t)::value>(p, kn, grid, stream);
  });
}

extern template ncclResult_t moeXnodeLaunchDispatch<gemm::DType::kBF16>(const MoeXnParams&,
                                                                        gemm::DType, bool, int,
                                                                        cudaStream_t);
extern template ncclResult_t moeXnodeLaunchDispatch<gemm::DType::kF16>(const MoeXnParams&,
                                                                       gemm::DType, bool, int,
                                                                       cudaStream_t);
extern template ncclResult_t moeXnodeLaunchFfn<gemm::DType::kBF16>(const MoeXnParams&, int,
                                                                   cudaStream_t);
extern template ncclResult_t moeXnodeLaunchFfn<gemm::DType::kF16>(const MoeXnParams&, int,
                                                                  cudaStream_t);

}  // namespace fused
}  // namespace mk
