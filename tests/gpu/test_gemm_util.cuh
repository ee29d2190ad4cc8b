// Helpers for the GEMM engine tests: random device inputs, an fp64 reference on the GPU,
// poisoning, and an element-wise comparison that also reports the relative Frobenius error.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "fused/gemm/gemm.h"

namespace gemmtest {

using mk::gemm::BLayout;
using mk::gemm::DType;

#define GT_CUDA(x)                                                      \
  do {                                                                  \
    cudaError_t e_ = (x);                                               \
    ASSERT_EQ(e_, cudaSuccess) << #x << ": " << cudaGetErrorString(e_); \
  } while (0)

__device__ __forceinline__ double loadAny(const void* p, int64_t i, DType t) {
  switch (t) {
    case DType::kBF16:
      return (double)__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16:
      return (double)__half2float(static_cast<const __half*>(p)[i]);
    default:
      return (double)static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void storeAny(void* p, int64_t i, DType t, float v) {
  switch (t) {
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case DType::kF16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// Uniform values in [-1, 1) for every element of a rows x cols (pitch ld) matrix.
static __global__ void fillRandomKernel(void* p, int64_t rows, int64_t cols, int64_t ld, DType t,
                                        uint64_t seed) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const float u = (float)(mix(seed * 0x9E3779B97F4A7C15ull + i) >> 40) / (float)(1ull << 24);
    storeAny(p, r * ld + c, t, 2.0f * u - 1.0f);
  }
}

inline void fillRandom(void* p, int64_t rows, int64_t cols, int64_t ld, DType t, uint64_t seed,
                       cudaStream_t s = 0) {
  fillRandomKernel<<<1024, 256, 0, s>>>(p, rows, cols, ld, t, seed);
}

// ref[m*N+n] = alpha * sum_k A[m,k] B(k,n) + beta * C[m,n], accumulated in fp64.
static __global__ void refKernel(int M, int N, int K, const void* A, int64_t lda, const void* B,
                                 int64_t ldb, BLayout bl, DType ab, const void* C, int64_t ldc,
                                 DType ct, float alpha, float beta, double* ref) {
  __shared__ double sA[16][17], sB[16][17];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int m = blockIdx.y * 16 + ty, n = blockIdx.x * 16 + tx;
  double acc = 0;
  for (int k0 = 0; k0 < K; k0 += 16) {
    const int ma = blockIdx.y * 16 + ty, ka = k0 + tx;
    sA[ty][tx] = (ma < M && ka < K) ? loadAny(A, (int64_t)ma * lda + ka, ab) : 0.0;
    const int kb = k0 + ty, nb = blockIdx.x * 16 + tx;
    double bv = 0;
    if (kb < K && nb < N)
      bv = bl == BLayout::kKN ? loadAny(B, (int64_t)kb * ldb + nb, ab)
                              : loadAny(B, (int64_t)nb * ldb + kb, ab);
    sB[ty][tx] = bv;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 16; ++k) acc += sA[ty][k] * sB[k][tx];
    __syncthreads();
  }
  if (m < M && n < N) {
    double v = (double)alpha * acc;
    if (beta != 0.0f) v += (double)beta * loadAny(C, (int64_t)m * ldc + n, ct);
    ref[(int64_t)m * N + n] = v;
  }
}

struct CmpResult {
  unsigned long long bad;
  unsigned long long firstBad;
  unsigned long long padTouched;
  double errSq, refSq;
};

// Every element of D within tolerance (NaN fails), and the padding columns [N, ldd) still
// hold the poison byte pattern (TMA stores must clip).
static __global__ void compareKernel(int M, int N, const void* D, int64_t ldd, DType dt,
                                     const double* ref, double rtol, double atol, CmpResult* out) {
  const int64_t total = (int64_t)M * ldd;
  double e2 = 0, r2 = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t m = i / ldd, n = i - m * ldd;
    if (n >= N) {
      const size_t es = dt == DType::kF32 ? 4 : 2;
      const unsigned char* b = static_cast<const unsigned char*>(D) + i * es;
      bool poisoned = true;
      for (size_t j = 0; j < es; ++j) poisoned &= b[j] == 0xFF;
      if (!poisoned) atomicAdd(&out->padTouched, 1ull);
      continue;
    }
    const double d = loadAny(D, i, dt), r = ref[m * N + n];
    const double err = fabs(d - r);
    if (!(err <= atol + rtol * fabs(r))) {
      atomicAdd(&out->bad, 1ull);
      atomicMin(&out->firstBad, (unsigned long long)(m * N + n));
    }
    if (err == err) e2 += err * err;
    r2 += r * r;
  }
  atomicAdd(&out->errSq, e2);
  atomicAdd(&out->refSq, r2);
}

// The GEMM engine needs an sm_90 device (wgmma, TMA); false with the reason otherwise.
inline bool engineUsable(std::string* why) {
  if (!mktest::haveGpu(why)) return false;
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  if (major != 9) {
    *why = "the GEMM engine needs sm_90";
    return false;
  }
  return true;
}
#define GEMMTEST_REQUIRE_SM90()                                                      \
  do {                                                                               \
    std::string why_;                                                                \
    if (!::gemmtest::engineUsable(&why_)) GTEST_SKIP() << "no usable GPU: " << why_; \
  } while (0)

// SMs of GPU 0 (grid-size cases scale with it).
inline int smCount() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  return sms;
}

inline double outRtol(DType t) {
  return t == DType::kBF16 ? 1.0 / 128 : (t == DType::kF16 ? 1.0 / 1024 : 1e-5);
}

// Device buffers of one GEMM problem, with the conventions of mk::gemm::GemmArgs.
struct Problem {
  int M, N, K;
  int64_t lda, ldb, ldd;
  BLayout bl;
  DType ab, dt;
  float alpha = 1.0f, beta = 0.0f;
  void *A = nullptr, *B = nullptr, *C = nullptr, *D = nullptr;
  double* ref = nullptr;
  CmpResult* cmp = nullptr;

  Problem(int m, int n, int k, BLayout b, DType a, DType d, int64_t padA = 0, int64_t padB = 0,
          int64_t padD = 0)
      : M(m), N(n), K(k), bl(b), ab(a), dt(d) {
    lda = K + padA;
    ldb = (bl == BLayout::kKN ? N : K) + padB;
    ldd = N + padD;
  }
  size_t esAB() const { return 2; }
  size_t esD() const { return dt == DType::kF32 ? 4 : 2; }
  size_t bytesA() const { return (size_t)M * lda * esAB(); }
  size_t bytesB() const { return (size_t)(bl == BLayout::kKN ? K : N) * ldb * esAB(); }
  size_t bytesD() const { return (size_t)M * ldd * esD(); }

  void alloc() {
    ASSERT_EQ(cudaMalloc(&A, bytesA()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&B, bytesB()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&C, bytesD()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&D, bytesD()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&ref, (size_t)M * N * sizeof(double)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&cmp, sizeof(CmpResult)), cudaSuccess);
  }
  void randomize(uint64_t seed) {
    fillRandom(A, M, K, lda, ab, seed * 4 + 1);
    if (bl == BLayout::kKN)
      fillRandom(B, K, N, ldb, ab, seed * 4 + 2);
    else
      fillRandom(B, N, K, ldb, ab, seed * 4 + 2);
    fillRandom(C, M, N, ldd, dt, seed * 4 + 3);
  }
  void poison() { cudaMemset(D, 0xFF, bytesD()); }
  mk::gemm::GemmArgs args() const {
    mk::gemm::GemmArgs g;
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = A;
    g.lda = lda;
    g.B = B;
    g.ldb = ldb;
    g.bLayout = bl;
    g.abType = ab;
    g.D = D;
    g.ldd = ldd;
    g.dType = dt;
    g.C = beta != 0.0f ? C : nullptr;
    g.ldc = ldd;
    g.alpha = alpha;
    g.beta = beta;
    return g;
  }
  // Reference from C (call before an in-place run overwrites C).
  void reference(const void* cSrc = nullptr) {
    dim3 grid((N + 15) / 16, (M + 15) / 16), block(16, 16);
    refKernel<<<grid, block>>>(M, N, K, A, lda, B, ldb, bl, ab, cSrc ? cSrc : C, ldd, dt, alpha,
                               beta, ref);
  }
  // Returns "" when every element passed, else a description.
  std::string check(const void* out = nullptr) {
    CmpResult init = {0, ~0ull, 0, 0, 0};
    cudaMemcpy(cmp, &init, sizeof(init), cudaMemcpyHostToDevice);
    const double atol = 2e-5 * std::sqrt((double)K) + (dt == DType::kF32 ? 0 : 1e-3);
    compareKernel<<<1024, 256>>>(M, N, out ? out : D, ldd, dt, ref, outRtol(dt), atol, cmp);
    CmpResult r;
    cudaError_t e = cudaMemcpy(&r, cmp, sizeof(r), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return std::string("CUDA error: ") + cudaGetErrorString(e);
    const double rel = r.refSq > 0 ? std::sqrt(r.errSq / r.refSq) : 0;
    char buf[512];
    if (r.bad || r.padTouched || rel > 1e-2) {
      snprintf(buf, sizeof(buf),
               "%llu bad elements (first at m=%llu n=%llu), %llu padding elements written, rel "
               "Frobenius err %.3g",
               r.bad, r.bad ? r.firstBad / N : 0, r.bad ? r.firstBad % N : 0, r.padTouched, rel);
      return buf;
    }
    return "";
  }
  std::string name() const {
    char buf[256];
    snprintf(buf, sizeof(buf), "M=%d N=%d K=%d B=%s %s->%s lda=%lld ldb=%lld ldd=%lld a=%g b=%g", M,
             N, K, bl == BLayout::kKN ? "[K,N]" : "[N,K]", mk::gemm::dtypeName(ab),
             mk::gemm::dtypeName(dt), (long long)lda, (long long)ldb, (long long)ldd, alpha, beta);
    return buf;
  }
  ~Problem() {
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cudaFree(D);
    cudaFree(ref);
    cudaFree(cmp);
  }
};

}  // namespace gemmtest
