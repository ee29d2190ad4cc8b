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

// Launches `kernel`, or with `loadOnly` only loads it (see gemmCollPreload).
template <class Kernel>
ncclResult_t launchOrLoad(Kernel kernel, const GcParams& p, cudaStream_t s, bool loadOnly) {
  if (loadOnly) {
    CUDACHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)gemm::kSmemBytes));
    return ncclSuccess;
  }
  return launchRoles(kernel, p.split, gemm::kThreads, gemm::kSmemBytes, s, p);
}

// The partials are written in the output type (GcReduce reads what the GEMM stored).
template <DType kIn, BLayout kB>
ncclResult_t launchReduce(const GcParams& p, cudaStream_t s, bool loadOnly) {
  switch ((DType)p.outType) {
    case DType::kBF16:
      return launchOrLoad(gcKernel<gemm::Traits<kIn, DType::kBF16, kB>, GcReduce<__nv_bfloat16>>, p,
                          s, loadOnly);
    case DType::kF16:
      return launchOrLoad(gcKernel<gemm::Traits<kIn, DType::kF16, kB>, GcReduce<__half>>, p, s,
                          loadOnly);
    default:
      return launchOrLoad(gcKernel<gemm::Traits<kIn, DType::kF32, kB>, GcReduce<float>>, p, s,
                          loadOnly);
  }
}

template <DType kIn, BLayout kB>
ncclResult_t launchGather(const GcParams& p, cudaStream_t s, bool loadOnly) {
  switch ((DType)p.outType) {
    case DType::kBF16:
      return launchOrLoad(gcKernel<gemm::Traits<kIn, DType::kBF16, kB>, GcGather>, p, s, loadOnly);
    case DType::kF16:
      return launchOrLoad(gcKernel<gemm::Traits<kIn, DType::kF16, kB>, GcGather>, p, s, loadOnly);
    default:
      return launchOrLoad(gcKernel<gemm::Traits<kIn, DType::kF32, kB>, GcGather>, p, s, loadOnly);
  }
}

// Launches (or only loads) the reduce (AllReduce/ReduceScatter) or gather kernel for p.kind
// and p.outType.
template <DType kIn>
ncclResult_t launchAny(const GcParams& p, bool kn, cudaStream_t s, bool loadOnly) {
  if (p.kind == (int)GemmColl::kAllGather)
    return kn ? launchGather<kIn, BLayout::kKN>(p, s, loadOnly)
              : launchGather<kIn, BLayout::kNK>(p, s, loadOnly);
  return kn ? launchReduce<kIn, BLayout::kKN>(p, s, loadOnly)
            : launchReduce<kIn, BLayout::kNK>(p, s, loadOnly);
}

extern template ncclResult_t launchAny<gemm::DType::kBF16>(const GcParams&, bool, cudaStream_t,
                                                           bool);
extern template ncclResult_t launchAny<gemm::DType::kF16>(const GcParams&, bool, cudaStream_t,
                                                          bool);

}  // namespace fused
}  // namespace mk
