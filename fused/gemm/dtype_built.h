// Which 16-bit types this build holds kernels for. The CMake option MK_BUILD_F16=OFF leaves out
// the fp16 instantiation units of the GEMM engine, the fused GEMM + collectives and the MoE
// kernels (about half of the library's CPU time; the attention kernels keep fp16). The dispatch
// sites pick an instantiation through byInType and byOutType, whose `if constexpr` keeps a build
// without fp16 from referencing what it did not compile; an fp16 call there fails with
// ncclInvalidArgument instead.
#pragma once
#include <type_traits>
#include <nccl.h>

#include "fused/gemm/gemm.h"

#ifndef MK_BUILD_F16
#define MK_BUILD_F16 1
#endif

namespace mk {
namespace gemm {

constexpr bool dtypeBuilt(DType t) {
  return t != DType::kF16 || MK_BUILD_F16;
}

// ncclInvalidArgument, with a warning (ncclGetLastError) naming `op` and the build option.
ncclResult_t dtypeNotBuilt(const char* op);

// f(std::integral_constant<DType, in>{}) for the input type in: fp16, else bf16 (the caller has
// checked that it is one of the two).
template <class F>
ncclResult_t byInType(DType in, const char* op, F&& f) {
  if (in == DType::kF16) {
    if constexpr (dtypeBuilt(DType::kF16)) {
      return f(std::integral_constant<DType, DType::kF16>{});
    } else {
      return dtypeNotBuilt(op);
    }
  }
  return f(std::integral_constant<DType, DType::kBF16>{});
}

// f(std::integral_constant<DType, out>{}) for the output type out: bf16, fp16, else fp32.
template <class F>
ncclResult_t byOutType(DType out, const char* op, F&& f) {
  switch (out) {
    case DType::kBF16:
      return f(std::integral_constant<DType, DType::kBF16>{});
    case DType::kF16:
      if constexpr (dtypeBuilt(DType::kF16)) {
        return f(std::integral_constant<DType, DType::kF16>{});
      } else {
        return dtypeNotBuilt(op);
      }
    default:
      return f(std::integral_constant<DType, DType::kF32>{});
  }
}

}  // namespace gemm
}  // namespace mk
