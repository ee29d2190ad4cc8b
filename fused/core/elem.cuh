// Element conversions of the fused operators' device code: fp32 to and from the element types
// they store (float, __half, __nv_bfloat16), rounding to nearest even.
#pragma once
#include <type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace mk {
namespace fused {

template <typename T>
__device__ __forceinline__ T fromF(float v) {
  if constexpr (std::is_same<T, float>::value) {
    return v;
  } else if constexpr (std::is_same<T, __half>::value) {
    return __float2half_rn(v);
  } else {
    static_assert(std::is_same<T, __nv_bfloat16>::value, "float, __half or __nv_bfloat16");
    return __float2bfloat16_rn(v);
  }
}

template <typename T>
__device__ __forceinline__ float toF(T v) {
  return static_cast<float>(v);
}

}  // namespace fused
}  // namespace mk
