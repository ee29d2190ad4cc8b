// Launchers of the fused dispatch + grouped GEMM kernel per input type (fused_moe.cuh); the
// template instantiations live in fused_moe_inst_{bf16,f16}.cu so that they compile in
// parallel.
#pragma once
#include "base/checks.h"
#include "fused/core/framework.h"
#include "fused/gemm/dtype_built.h"
#include "fused/ops/moe/fused_moe.cuh"

namespace mk {
namespace fused {

// Cooperative launch of `grid` CTAs (the runtime refuses a grid that cannot be co-resident
// instead of letting GEMM CTAs wait for dispatch CTAs that never start); grid 0 only loads the
// kernel (a lazy load at the first launch can wait for the device, where a peer's kernel may
// wait for this thread).
template <class Tr>
ncclResult_t moeFusedLaunchTr(const MoeFusedParams& p, int grid, cudaStream_t stream) {
  return launchCooperative(moeFusedKernel<Tr>, grid, gemm::kThreads, Tr::Pipe::kSmemBytes, stream,
                           p);
}

// The grouped deep ring (GroupPipe), as the fused operators' compute roles run: its results
// equal the sequential path's GroupPipe / GroupWidePipe / GroupCarryPipe tile for tile (only the
// staging of the epilogue differs).
template <gemm::DType kIn, gemm::DType kOut>
ncclResult_t moeFusedLaunchOut(const MoeFusedParams& p, bool kn, int grid, cudaStream_t stream) {
  using gemm::BLayout;
  using gemm::GroupPipe;
  using gemm::Traits;
  return kn ? moeFusedLaunchTr<Traits<kIn, kOut, BLayout::kKN, GroupPipe>>(p, grid, stream)
            : moeFusedLaunchTr<Traits<kIn, kOut, BLayout::kNK, GroupPipe>>(p, grid, stream);
}

template <gemm::DType kIn>
ncclResult_t moeFusedLaunchIn(const MoeFusedParams& p, gemm::DType out, bool kn, int grid,
                              cudaStream_t stream) {
  return gemm::byOutType(out, "ncclMoeDispatchGemm", [&](auto t) {
    return moeFusedLaunchOut<kIn, decltype(t)::value>(p, kn, grid, stream);
  });
}

extern template ncclResult_t moeFusedLaunchIn<gemm::DType::kBF16>(const MoeFusedParams&,
                                                                  gemm::DType, bool, int,
                                                                  cudaStream_t);
extern template ncclResult_t moeFusedLaunchIn<gemm::DType::kF16>(const MoeFusedParams&, gemm::DType,
                                                                 bool, int, cudaStream_t);

}  // namespace fused
}  // namespace mk
