// Launchers of the fused GEMM + collective kernels per input type: the heavy template
// instantiations live in fused_inst_{bf16,f16}_{nk,kn}_{reduce,gather}.cu so that they compile in
// parallel (the largest translation units bound the build's wall time on a many-core machine).
#pragma once
#include <type_traits>

#include "fused/core/framework.h"
#include "fused/gemm/dtype_built.h"
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

// The element of output type k (GcReduce reads what the GEMM stored).
template <DType k>
using OutElem = std::conditional_t<k == DType::kBF16, __nv_bfloat16,
                                   std::conditional_t<k == DType::kF16, __half, float>>;

// The partials are written in the output type.
template <DType kIn, BLayout kB>
ncclResult_t launchReduce(const GcParams& p, cudaStream_t s, bool loadOnly) {
  return gemm::byOutType((DType)p.outType, "fused GEMM", [&](auto t) {
    constexpr DType kOut = decltype(t)::value;
    return launchOrLoad(gcKernel<gemm::Traits<kIn, kOut, kB>, GcReduce<OutElem<kOut>>>, p, s,
                        loadOnly);
  });
}

template <DType kIn, BLayout kB>
ncclResult_t launchGather(const GcParams& p, cudaStream_t s, bool loadOnly) {
  return gemm::byOutType((DType)p.outType, "fused GEMM", [&](auto t) {
    return launchOrLoad(gcKernel<gemm::Traits<kIn, decltype(t)::value, kB>, GcGather>, p, s,
                        loadOnly);
  });
}

// One input type and B layout a file each (fused_inst_<in>_<layout>_<reduce|gather>.cu).
#define MK_GC_EXTERN(fn, in, layout)                                                       \
  extern template ncclResult_t fn<gemm::DType::in, gemm::BLayout::layout>(const GcParams&, \
                                                                          cudaStream_t, bool);
#define MK_GC_EXTERN_BOTH(in, layout)    \
  MK_GC_EXTERN(launchReduce, in, layout) \
  MK_GC_EXTERN(launchGather, in, layout)
MK_GC_EXTERN_BOTH(kBF16, kNK)
MK_GC_EXTERN_BOTH(kBF16, kKN)
MK_GC_EXTERN_BOTH(kF16, kNK)
MK_GC_EXTERN_BOTH(kF16, kKN)
#undef MK_GC_EXTERN_BOTH
#undef MK_GC_EXTERN

// Launches (or only loads) the reduce (AllReduce/ReduceScatter) or gather kernel of one B
// layout for p.kind and p.outType.
template <DType kIn, BLayout kB>
ncclResult_t launchLayout(const GcParams& p, cudaStream_t s, bool loadOnly) {
  if (p.kind == (int)GemmColl::kAllGather) return launchGather<kIn, kB>(p, s, loadOnly);
  return launchReduce<kIn, kB>(p, s, loadOnly);
}

// Launches (or only loads) the kernel for the input type kIn, B layout `kn`, p.kind and
// p.outType.
template <DType kIn>
ncclResult_t launchAny(const GcParams& p, bool kn, cudaStream_t s, bool loadOnly) {
  return kn ? launchLayout<kIn, BLayout::kKN>(p, s, loadOnly)
            : launchLayout<kIn, BLayout::kNK>(p, s, loadOnly);
}

}  // namespace fused
}  // namespace mk
