// Issue rate of the epilogue's fp32 -> 16-bit conversions (cvt.rn.{bf16x2,f16x2}.f32, two
// accumulators into one packed register), alone on the SM: whether converting a 128x256 tile
// (16384 packed conversions by the two consumer warpgroups) bounds the engine's per-tile
// epilogue (docs/gemm-notes.md: ~0.57 us a tile at K = 1024, i.e. ~1000 SM cycles, the time
// 16384 conversions take at 16 a cycle).
//
// One CTA per SM; every thread converts `iters` rounds of 16 independent register pairs and
// folds the results into two accumulators with 3-input XORs (one LOP3 per two conversions, so
// the integer pipe is not what is measured) and adds to each input (one FADD a pair), then stores
// the accumulators (nothing is dead). Reported per
// type and warp count: packed conversions per SM cycle (from the CTA's first to its last
// thread's clock64; the median CTA), and the same loop with the conversions replaced by integer
// ops of the same shape as a reference for the loop's own cost.
//
//   bench_cvt_rate [--iters 4096] [--out bench/results/cvt.json] [--commit SHA]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_args.h"
#include "bench_cuda.cuh"

namespace {

constexpr int kPairs = 16;

enum Op : int { kBf16 = 0, kF16 = 1, kInt = 2 };
const char* const kOpName[] = {"cvt.rn.bf16x2.f32", "cvt.rn.f16x2.f32", "integer reference"};

template <int kOp>
__device__ __forceinline__ uint32_t convert(float x, float y) {
  uint32_t o;
  if constexpr (kOp == kBf16) {
    asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(o) : "f"(x), "f"(y));
  } else if constexpr (kOp == kF16) {
    asm volatile("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(o) : "f"(x), "f"(y));
  } else {
    // One integer op per pair, as a reference for the loop around the conversions.
    asm volatile("add.u32 %0, %1, %2;"
                 : "=r"(o)
                 : "r"(__float_as_uint(x)), "r"(__float_as_uint(y)));
  }
  return o;
}

// rec per CTA: [start, end] clock64 (min start, max end over the CTA's threads).
template <int kOp>
__global__ void cvtKernel(int32_t iters, float seed, unsigned long long* rec, uint32_t* sink) {
  float x[kPairs], y[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    x[j] = seed * (float)(threadIdx.x + j);
    y[j] = seed * (float)((int)threadIdx.x - j);  // signed: no wrap to 2^32 - j
  }
  uint32_t acc0 = 0, acc1 = 0;
  __syncthreads();
  const unsigned long long t0 = clock64();
  for (int32_t i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < kPairs; j += 4) {
      acc0 ^= convert<kOp>(x[j], y[j]) ^ convert<kOp>(x[j + 1], y[j + 1]);
      acc1 ^= convert<kOp>(x[j + 2], y[j + 2]) ^ convert<kOp>(x[j + 3], y[j + 3]);
    }
    // New inputs every round (one FADD a pair, in the reference loop too), so that no compiler
    // pass can hoist a conversion of loop-invariant registers out of the loop.
#pragma unroll
    for (int j = 0; j < kPairs; ++j) x[j] += seed;
  }
  const unsigned long long t1 = clock64();
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc0 ^ acc1;
  atomicMin(&rec[2 * blockIdx.x], t0);
  atomicMax(&rec[2 * blockIdx.x + 1], t1);
}

struct Row {
  int op, warps;
  double perClk;  // packed conversions (or reference ops) per SM cycle, median CTA
};

template <int kOp>
double run(int sms, int threads, int32_t iters, unsigned long long* dRec, uint32_t* dSink) {
  std::vector<unsigned long long> rec(2 * sms);
  for (int i = 0; i < sms; ++i) rec[2 * i] = ~0ull, rec[2 * i + 1] = 0;
  BENCH_CK(cudaMemcpy(dRec, rec.data(), rec.size() * 8, cudaMemcpyHostToDevice));
  cvtKernel<kOp><<<sms, threads>>>(iters, 1.0009765625f, dRec, dSink);
  BENCH_CK(cudaGetLastError());
  BENCH_CK(cudaDeviceSynchronize());
  BENCH_CK(cudaMemcpy(rec.data(), dRec, rec.size() * 8, cudaMemcpyDeviceToHost));
  std::vector<double> cyc(sms);
  for (int i = 0; i < sms; ++i) cyc[i] = (double)(rec[2 * i + 1] - rec[2 * i]);
  std::sort(cyc.begin(), cyc.end());
  const double ops = (double)threads * iters * kPairs;
  return ops / cyc[sms / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int32_t iters = 4096;
  std::string out = "bench/results/cvt.json", commit = "unknown";
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--iters" && i + 1 < argc) {
      iters = atoi(argv[++i]);
    } else if (benchargs::outOrCommit(argc, argv, &i, &out, &commit)) {
      continue;  // --out or --commit, taken
    } else {
      fprintf(stderr, "usage: %s [--iters N] [--out F] [--commit C]\n", argv[0]);
      return 2;
    }
  }
  if (iters < 1) {
    fprintf(stderr, "--iters must be >= 1\n");
    return 2;
  }
  cudaDeviceProp prop;
  BENCH_CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  unsigned long long* dRec = nullptr;
  uint32_t* dSink = nullptr;
  BENCH_CK(cudaMalloc(&dRec, 2 * sms * sizeof(unsigned long long)));
  BENCH_CK(cudaMalloc(&dSink, (size_t)sms * 1024 * sizeof(uint32_t)));
  std::vector<Row> rows;
  // 8 warps: the engine's two consumer warpgroups; 32: whether more warps issue faster.
  for (int warps : {8, 32}) {
    const int threads = 32 * warps;
    run<kBf16>(sms, threads, iters, dRec, dSink);  // warm-up
    rows.push_back({kBf16, warps, run<kBf16>(sms, threads, iters, dRec, dSink)});
    rows.push_back({kF16, warps, run<kF16>(sms, threads, iters, dRec, dSink)});
    rows.push_back({kInt, warps, run<kInt>(sms, threads, iters, dRec, dSink)});
  }
  printf(
      "| op | warps | per SM cycle | cycles for 16384 (one 128x256 tile) |\n|---|---|---|---|\n");
  for (const Row& r : rows)
    printf("| %s | %d | %.2f | %.0f |\n", kOpName[r.op], r.warps, r.perClk, 16384.0 / r.perClk);
  FILE* f = benchargs::openJson(out, "cvt_rate", argc, argv, commit, prop.name, sms);
  if (f != nullptr) {
    fprintf(f, "  \"iters\": %d,\n  \"results\": [\n", iters);
    for (size_t i = 0; i < rows.size(); ++i)
      fprintf(f, "    {\"op\": \"%s\", \"warps\": %d, \"per_sm_cycle\": %.3f}%s\n",
              kOpName[rows[i].op], rows[i].warps, rows[i].perClk, i + 1 < rows.size() ? "," : "");
    fprintf(f, "  ]\n}\n");
    fclose(f);
  }
  BENCH_CK(cudaFree(dRec));
  BENCH_CK(cudaFree(dSink));
  return 0;
}
