// What the fused GEMM + collective benchmarks share (bench/fused_bench.cu, mode (a): ranks as
// threads; bench/fused_procs_bench.cu, mode (b): ranks as processes against the real NCCL):
// the operators, the shape list of issue 12, the flop count and the operand fill.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace fusedbench {

enum Op { kAR = 0, kAG = 1, kRS = 2 };
inline const char* const kOpNames[3] = {"gemm_allreduce", "allgather_gemm", "gemm_reducescatter"};
inline const char* const kOpShort[3] = {"ar", "ag", "rs"};

struct Shape {
  Op op;
  size_t M, N, K;
  std::string tag;  // "", "K/8", "N/8" or "custom"
};

// Rows of A a rank holds (AG: its shard) and rows of the output it gets (RS: its shard).
inline size_t rowsA(const Shape& s, int n) {
  return s.op == kAG ? s.M / n : s.M;
}
inline size_t rowsC(const Shape& s, int n) {
  return s.op == kRS ? s.M / n : s.M;
}

// Every rank runs an M x N x K GEMM (AG: on the gathered A): TFLOP/s per rank.
inline double tflops(const Shape& s, double ms) {
  return 2.0 * s.M * (double)s.N * s.K / (ms * 1e-3) / 1e12;
}

// Issue 12's list: GEMM+AllReduce and GEMM+ReduceScatter M x 8192 x 8192, AllGather+GEMM
// M = K, N = M/16 (mKernel's benchmark), plus K (AR, RS) or N (AG) sharded by 8.
//   full:    M every power of two 2048..32768, sharded at every M
//   default: M in {2048, 8192, 32768}, sharded at 8192 and 32768
//   quick:   M in {2048, 8192}, sharded at 8192
inline std::vector<Shape> defaultShapes(bool full, bool quick = false) {
  std::vector<size_t> Ms = full    ? std::vector<size_t>{2048, 4096, 8192, 16384, 32768}
                           : quick ? std::vector<size_t>{2048, 8192}
                                   : std::vector<size_t>{2048, 8192, 32768};
  std::vector<size_t> sharded = full    ? Ms
                                : quick ? std::vector<size_t>{8192}
                                        : std::vector<size_t>{8192, 32768};
  std::vector<Shape> v;
  for (size_t M : Ms) v.push_back({kAR, M, 8192, 8192, ""});
  for (size_t M : sharded) v.push_back({kAR, M, 8192, 1024, "K/8"});
  for (size_t M : Ms) v.push_back({kAG, M, M / 16, M, ""});
  for (size_t M : sharded) v.push_back({kAG, M, 1024, 8192, "N/8"});
  for (size_t M : Ms) v.push_back({kRS, M, 8192, 8192, ""});
  for (size_t M : sharded) v.push_back({kRS, M, 8192, 1024, "K/8"});
  return v;
}

// Keeps the shapes whose operator is in a comma list of short names ("ar,ag,rs").
inline std::vector<Shape> filterOps(const std::vector<Shape>& in, const std::string& ops) {
  std::vector<Shape> v;
  for (const Shape& s : in)
    if (("," + ops + ",").find(std::string(",") + kOpShort[s.op] + ",") != std::string::npos)
      v.push_back(s);
  return v;
}

// "ar:MxNxK,ag:MxNxK,..." -> shapes tagged "custom"; false on a malformed item.
inline bool parseShapes(const std::string& list, std::vector<Shape>* out) {
  size_t p = 0;
  while (p < list.size()) {
    size_t q = list.find(',', p);
    std::string item = list.substr(p, q == std::string::npos ? std::string::npos : q - p);
    char op[8] = {0};
    unsigned long long M, N, K;
    if (sscanf(item.c_str(), "%2[a-z]:%llux%llux%llu", op, &M, &N, &K) != 4) return false;
    int o = -1;
    for (int i = 0; i < 3; ++i)
      if (!strcmp(op, kOpShort[i])) o = i;
    if (o < 0 || M == 0 || N == 0 || K == 0) return false;
    out->push_back({(Op)o, (size_t)M, (size_t)N, (size_t)K, "custom"});
    if (q == std::string::npos) break;
    p = q + 1;
  }
  return !out->empty();
}

// Uniform in [-1, 1), a pure function of (seed, index): a process can regenerate the operands
// of every other rank from the seed alone.
static __global__ void fillKernel(__nv_bfloat16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed * 0xD1B54A32D192ED03ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    p[i] = __float2bfloat16((float)(x >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
  }
}

}  // namespace fusedbench
