// Host helpers shared by the MoE GPU tests (test_moe_dispatch.cu, test_moe_ffn.cu): bf16/fp16
// bit patterns, the value an output element holds, and a CUDA check for functions that return
// an error string.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#define MOE_CUDA(x)                                                                \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) return std::string(#x) + ": " + cudaGetErrorString(e_); \
  } while (0)

namespace moetest {

inline uint16_t toBits(float v, ncclDataType_t t) {
  uint16_t b;
  if (t == ncclBfloat16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    memcpy(&b, &h, 2);
  } else {
    const __half h = __float2half_rn(v);
    memcpy(&b, &h, 2);
  }
  return b;
}

inline float fromBits(uint16_t b, ncclDataType_t t) {
  if (t == ncclBfloat16) {
    __nv_bfloat16 h;
    memcpy(&h, &b, 2);
    return __bfloat162float(h);
  }
  __half h;
  memcpy(&h, &b, 2);
  return __half2float(h);
}

// v rounded to t (bf16 or fp16) and back.
inline float roundTo(double v, ncclDataType_t t) {
  return fromBits(toBits((float)v, t), t);
}

// Element i of an output array of type t (fp32, bf16 or fp16) copied to the host as bytes.
inline float outValue(const std::vector<uint8_t>& y, size_t i, ncclDataType_t t) {
  if (t == ncclFloat32) {
    float v;
    memcpy(&v, y.data() + i * 4, 4);
    return v;
  }
  uint16_t b;
  memcpy(&b, y.data() + i * 2, 2);
  return fromBits(b, t);
}

}  // namespace moetest
