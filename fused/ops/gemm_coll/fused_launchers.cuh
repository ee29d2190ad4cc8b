// Launchers of the fused GEMM + collective kernels per input type: the heavy template
// instantiations live in fused_inst_{bf16,f16}.cu so that they compile in parallel.
#pragma once
#include "fused/core/framework.h"
#include "fused/ops/gemm_coll/fused_kernels.cuh"
#include "fused/ops/gemm_coll/gemm_coll.h"

namespace mk {
namespace fused {

using gemm::BLayout;
using gemm::DType;

// The partials are written in the output type (GcReduce reads what the GEMM stored).
template <DType kIn, BLayout kB>
ncclResult_t launchReduce(const GcParams& p, cudaStream_t s) {
  switch ((DType)p.outType) {
    case DType::kBF16:
      return launchRoles(gcKernel<gemm::Traits<kIn, DType::kBF16, kB>, GcReduce<__nv_bfloat16>>,
                         p.split, gemm::kThreads, gemm::kSmemBytes, s, p);
    case DType::kF16:
      return launchRoles(gcKernel<gemm::Traits<kIn, DType::kF16, kB>, GcReduce<__half>>, p.split,
                         gemm::kThreads, gemm::kSmemBytes, s, p);
    default:
      return launchRoles(gcKernel<gemm::Traits<kIn, DType::kF32, kB>, GcReduce<float>>, p.split,
                         gemm::kThreads, gemm::kSmemBytes, s, p);
  }
}

template <DType kIn, BLayout kB>
ncclResult_t launchGather(const GcParams& p, cudaStream_t s) {
  switch ((DType)p.outType) {
    case DType::kBF16:
      return launchRoles(gcKernel<gemm::Traits<kIn, DType::kBF16, kB>, GcGather>, p.split,
                         gemm::kThreads, gemm::kSmemBytes, s, p);
    case DType::kF16:
      return launchRoles(gcKernel<gemm::Traits<kIn, DType::kF16, kB>, GcGather>, p.split,
                         gemm::kThreads, gemm::kSmemBytes, s, p);
    default:
      return launchRoles(gcKernel<gemm::Traits<kIn, DType::kF32, kB>, GcGather>, p.split,
                         gemm::kThreads, gemm::kSmemBytes, s, p);
  }
}

// Launches the reduce (AllReduce/ReduceScatter) or gather kernel for p.kind.
template <DType kIn>
ncclResult_t launchAny(const GcParams& p, bool kn, cudaStream_t s) {
  if (p.kind == (int)GemmColl::kAllGather)
    return kn ? launchGather<kIn, BLayout::kKN>(p, s) : launchGather<kIn, BLayout::kNK>(p, s);
  return kn ? launchReduce<kIn, BLayout::kKN>(p, s) : launchReduce<kIn, BLayout::kNK>(p, s);
}

extern template ncclResult_t launchAny<gemm::DType::kBF16>(const GcParams&, bool, cudaStream_t);
extern template ncclResult_t launchAny<gemm::DType::kF16>(const GcParams&, bool, cudaStream_t);

}  // namespace fused
}  // namespace mk
