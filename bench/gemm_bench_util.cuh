// Helpers of bench/gemm_bench.cu (one translation unit): the max relative difference of two
// bf16 outputs, the shape, medians and wall-clock stamps for nvidia-smi's sampling beside it.
#pragma once
#include <sys/time.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

namespace gemmbench {

__global__ void diffKernel(const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n, float* out) {
  float m = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const float x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    const float d = fabsf(x - y) / (fabsf(y) + 1.0f);
    m = (d == d) ? fmaxf(m, d) : 1e30f;
  }
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(m));  // non-negative floats
}

struct Shape {
  int M, N, K;
};

inline double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Local wall time as nvidia-smi's --query-gpu=timestamp prints it (millisecond resolution).
inline std::string wallStamp() {
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  struct tm lt;
  localtime_r(&tv.tv_sec, &lt);
  char buf[64];
  strftime(buf, sizeof(buf), "%Y/%m/%d %H:%M:%S", &lt);
  char out[80];
  snprintf(out, sizeof(out), "%s.%03d", buf, (int)(tv.tv_usec / 1000));
  return out;
}

inline double wallSeconds() {
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  return tv.tv_sec + tv.tv_usec * 1e-6;
}

}  // namespace gemmbench
