// CUDA helpers shared by the single-process benchmarks (gemm_bench, share_bench): a check
// that exits with the failing call (a benchmark has nothing to recover), and a random bf16 fill
// in [-1, 1) that needs no host copy of the operands.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define BENCH_CK(x)                                                                      \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

namespace benchcuda {

// Element i from a 64-bit mix of (i, seed): reproducible for a seed, uncorrelated between
// operands with different seeds.
__global__ inline void fillKernel(__nv_bfloat16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    p[i] = __float2bfloat16((float)(x >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
  }
}

}  // namespace benchcuda
