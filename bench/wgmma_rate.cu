// Tensor-core issue rate of the GEMM engine's wgmma forms, without the rest of a GEMM: what
// limits a k-step (docs/gemm-notes.md, sessions 43-44: neither L2 bytes nor a count of
// shared-memory bytes explained why the cooperative 128x256 tile's k-step runs at ~0.89 of peak
// and the ping-pong's 128x128 / 128x192 units at ~0.81 / ~0.78).
//
// Each CTA (one per SM) keeps an A tile (128 rows) and a B tile (256 rows) of random bf16 in
// shared memory and W warpgroups issue, side by side and with no synchronisation between
// them, `iters` k-steps of 4 k16 slices, each slice R m64nNk16 instructions (row halves of A
// sharing one B, as the engine's units: R = 2 is a 128xN unit) with both operands read from
// shared memory, keeping one batch in flight (commit, wait_group 1) as the engine's consumers.
// Optionally one more thread copies 32 KB blocks from global memory (an L2-resident 32 MiB
// buffer) into a shared-memory ring with bulk copies for as long as the warpgroups compute: the
// shared-memory write traffic a producer's TMA loads add. Reported per configuration: SM cycles
// per k-step (per CTA from the first warpgroup's start to the last one's end; the median CTA),
// multiply-adds per cycle per SM as a fraction of
// --peak (2048 bf16 multiply-adds a cycle per SM for sm_90's dense tensor cores), and the
// loader's bytes per cycle.
//
//   bench_wgmma_rate [--iters 4096] [--peak 2048] [--out bench/results/wgmma.json]
//                    [--commit SHA]
#include <sys/time.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "bench_args.h"
#include "bench_cuda.cuh"
#include "device/rt/ptx_ext.cuh"
#include "fused/gemm/primitives.cuh"

namespace {

constexpr int kBytesA = 128 * 128;  // 128 rows of 64 bf16 (one k-step of A)
constexpr int kBytesB = 256 * 128;  // 256 rows
constexpr int kLoadBlock = 32 * 1024;
constexpr int kLoadBufs = 2;
constexpr int kSmemBytes = kBytesA + kBytesB + kLoadBufs * kLoadBlock + 64 + 1024;
// Two issuing warpgroups and a third whose first thread is the loader: the register split
// (setmaxnreg) works on whole warpgroups.
constexpr int kMaxThreads = 3 * 128;
// The split of the engine's 192-column ping-pong kernel (pipeline 4): issuing warpgroups 240
// registers, the third 24 (3 x 128 threads share the 64K register file; n192 x 2 needs 218).
constexpr int kIssueRegs = 240, kIdleRegs = 24;
// Words per warpgroup record: start and end clock64, k-steps done; per CTA the loader's
// start and end clock64 and bytes.
constexpr int kRecWords = 3;

struct Args {
  const uint8_t* tiles;  // [kBytesA + kBytesB] random bf16, copied into every CTA
  const uint8_t* src;    // loader's source
  uint64_t srcBytes;
  int32_t iters;
  int32_t wgs;    // issuing warpgroups (1 or 2)
  int32_t load;   // 1: the loader (third warpgroup's first thread) runs
  uint64_t* rec;  // [grid][3][kRecWords]: 2 warpgroups then the loader
  float* sink;    // keeps the accumulators live
};

// N: columns of one instruction; R: row halves of A issued against the same B per k16 slice.
// Registers as the engine's kernels: 168 a thread at launch, then setmaxnreg. A flat cap does
// not work: 288 threads at 224 registers failed to launch (session 45; warps are allocated in
// fours, so 9 warps cost 12), and __launch_bounds__(288, 1) capped n192 x 2 at 168 (spilled).
template <int N, int R>
__global__ void __launch_bounds__(kMaxThreads, 1) rateKernel(const Args a) {
  extern __shared__ uint8_t raw[];
  uint8_t* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sA = base;
  uint8_t* sB = base + kBytesA;
  uint8_t* sLoad = sB + kBytesB;
  uint64_t* bars = reinterpret_cast<uint64_t*>(sLoad + kLoadBufs * kLoadBlock);
  // Issuing warpgroups done: the loader runs until all are (their tails see fill traffic too).
  uint32_t* done = reinterpret_cast<uint32_t*>(bars + kLoadBufs);
  const int wg = threadIdx.x / 128, tid = threadIdx.x & 127;
  // Operands: generic stores, then made visible to the async proxy (wgmma reads through it).
  for (int i = threadIdx.x * 16; i < kBytesA + kBytesB; i += blockDim.x * 16)
    *reinterpret_cast<uint4*>(base + i) = *reinterpret_cast<const uint4*>(a.tiles + i);
  if (threadIdx.x == 0) {
    for (int b = 0; b < kLoadBufs; ++b) mk::ptx::mbarInit(&bars[b], 1);
    *done = 0;
    mk::ptx::fenceMbarInit();
  }
  mk::ptx::fenceProxyAsyncShared();
  __syncthreads();
  uint64_t* rec = a.rec + (size_t)blockIdx.x * 3 * kRecWords;
  if (wg < a.wgs)
    mk::ptx::setmaxnregInc<kIssueRegs>();
  else
    mk::ptx::setmaxnregDec<kIdleRegs>();
  if (wg < a.wgs) {
    float acc[R][N / 2];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < N / 2; ++i) acc[r][i] = 0.0f;
    const uint32_t aAddr = mk::ptx::smemAddr(sA), bAddr = mk::ptx::smemAddr(sB);
    const uint64_t t0 = clock64();
    for (int it = 0; it < a.iters; ++it) {
#pragma unroll
      for (int r = 0; r < R; ++r) mk::ptx::fenceRegs(acc[r]);
      mk::ptx::wgmmaFence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t db = mk::gemm::descKMajor(bAddr + kk * 32);
#pragma unroll
        for (int r = 0; r < R; ++r)
          // Row half (r + wg) % 2: with one instruction a slice, the two warpgroups read
          // different halves of A, as the cooperative tile's.
          mk::ptx::wgmmaSS<N, false, 0>(
              acc[r], mk::gemm::descKMajor(aAddr + ((r + wg) & 1) * 64 * 128 + kk * 32), db, 1);
      }
      mk::ptx::wgmmaCommit();
#pragma unroll
      for (int r = 0; r < R; ++r) mk::ptx::fenceRegs(acc[r]);
      mk::ptx::wgmmaWait<1>();
    }
    mk::ptx::wgmmaWait<0>();
#pragma unroll
    for (int r = 0; r < R; ++r) mk::ptx::fenceRegs(acc[r]);
    const uint64_t t1 = clock64();
    if (tid == 0) {
      rec[wg * kRecWords + 0] = t0;
      rec[wg * kRecWords + 1] = t1;
      rec[wg * kRecWords + 2] = (uint64_t)a.iters;
      atomicAdd(done, 1u);
    }
    float s = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < N / 2; ++i) s += acc[r][i];
    if (s == 12345.678f) a.sink[blockIdx.x] = s;  // practically never: keeps the work live
  } else if (wg == 2 && tid == 0 && a.load) {
    // The loader: block i into ring buffer i % kLoadBufs, one in flight per buffer; stops
    // once warpgroup 0 is done, and after at most 64 blocks per issuing k-step (bounded).
    const uint64_t blocks = a.srcBytes / kLoadBlock;
    const uint64_t maxBlocks = (uint64_t)a.iters * 64;
    uint64_t i = 0, bytes = 0;
    uint32_t phase[kLoadBufs] = {0, 0};
    const uint64_t t0 = clock64();
    for (; i < maxBlocks && *reinterpret_cast<volatile uint32_t*>(done) < (uint32_t)a.wgs; ++i) {
      const int b = (int)(i % kLoadBufs);
      if (i >= kLoadBufs) {
        mk::ptx::mbarWait(&bars[b], phase[b]);
        phase[b] ^= 1;
        bytes += kLoadBlock;
      }
      const uint64_t blk = (blockIdx.x * 97 + i) % blocks;
      mk::ptx::mbarArriveExpectTx(&bars[b], kLoadBlock);
      mk::ptx::bulkLoad1d(sLoad + b * kLoadBlock, a.src + blk * kLoadBlock, kLoadBlock, &bars[b]);
    }
    // Drain: shared memory must outlive the copies in flight.
    for (uint64_t j = i >= kLoadBufs ? i - kLoadBufs : 0; j < i; ++j) {
      const int b = (int)(j % kLoadBufs);
      mk::ptx::mbarWait(&bars[b], phase[b]);
      phase[b] ^= 1;
      bytes += kLoadBlock;
    }
    const uint64_t t1 = clock64();
    rec[2 * kRecWords + 0] = t0;
    rec[2 * kRecWords + 1] = t1;
    rec[2 * kRecWords + 2] = bytes;
  }
}

struct Config {
  int n, r, wgs, load;
};

struct Result {
  Config c;
  double cyclesPerStep, fmaPerClk, frac, loadBytesPerClk;
};

template <int N, int R>
Result runOne(const Config& c, const Args& base, int grid, double peak, cudaStream_t stream,
              uint64_t* dRec) {
  Args a = base;
  a.wgs = c.wgs;
  a.load = c.load;
  auto kernel = rateKernel<N, R>;
  BENCH_CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  std::vector<uint64_t> h((size_t)grid * 3 * kRecWords);
  // One warm-up launch (clocks ramp, module load), then the measured one.
  for (int rep = 0; rep < 2; ++rep) {
    BENCH_CK(cudaMemsetAsync(dRec, 0, h.size() * sizeof(uint64_t), stream));
    kernel<<<grid, kMaxThreads, kSmemBytes, stream>>>(a);
    BENCH_CK(cudaGetLastError());
    BENCH_CK(cudaStreamSynchronize(stream));
  }
  BENCH_CK(cudaMemcpy(h.data(), dRec, h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  std::vector<double> perStep, load;
  for (int b = 0; b < grid; ++b) {
    // Per CTA, the span from the first warpgroup's start to the last one's end: a warpgroup
    // finishing early would otherwise let the other's tail run alone and count twice.
    const uint64_t* r = h.data() + (size_t)b * 3 * kRecWords;
    uint64_t t0 = r[0], t1 = r[1];
    for (int w = 1; w < c.wgs; ++w) {
      t0 = std::min(t0, r[w * kRecWords]);
      t1 = std::max(t1, r[w * kRecWords + 1]);
    }
    perStep.push_back((double)(t1 - t0) / (double)r[2]);
    if (c.load && r[2 * kRecWords + 1] > r[2 * kRecWords])
      load.push_back((double)r[2 * kRecWords + 2] /
                     (double)(r[2 * kRecWords + 1] - r[2 * kRecWords]));
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  Result res;
  res.c = c;
  res.cyclesPerStep = median(perStep);
  // Multiply-adds of one warpgroup's k-step: 4 slices x R instructions of 64 x N x 16.
  const double fmaStep = 4.0 * R * 64.0 * N * 16.0;
  res.fmaPerClk = c.wgs * fmaStep / res.cyclesPerStep;
  res.frac = res.fmaPerClk / peak;
  res.loadBytesPerClk = median(load);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 4096;
  double peak = 2048.0;
  std::string out, commit = "unknown";
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--iters" && i + 1 < argc) {
      iters = atoi(argv[++i]);
    } else if (s == "--peak" && i + 1 < argc) {
      peak = atof(argv[++i]);
    } else if (benchargs::outOrCommit(argc, argv, &i, &out, &commit)) {
      continue;  // --out or --commit, taken
    } else {
      fprintf(stderr, "usage: %s [--iters N] [--peak FMA_PER_CLK_PER_SM] [--out F] [--commit C]\n",
              argv[0]);
      return 2;
    }
  }
  if (iters < 1) {
    fprintf(stderr, "--iters must be >= 1\n");
    return 2;
  }
  cudaDeviceProp prop;
  BENCH_CK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9 || prop.minor != 0) {
    printf("skipped: wgmma needs an sm_90 device (this one is sm_%d%d)\n", prop.major, prop.minor);
    return 0;
  }
  const int grid = prop.multiProcessorCount;
  cudaStream_t stream;
  BENCH_CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Args a{};
  uint8_t *tiles = nullptr, *src = nullptr;
  const uint64_t srcBytes = 32ull << 20;
  BENCH_CK(cudaMalloc(&tiles, kBytesA + kBytesB));
  BENCH_CK(cudaMalloc(&src, srcBytes));
  benchcuda::fillKernel<<<256, 256, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(tiles),
                                                 (kBytesA + kBytesB) / 2, 7);
  benchcuda::fillKernel<<<1024, 256, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(src),
                                                  srcBytes / 2, 8);
  uint64_t* dRec = nullptr;
  float* sink = nullptr;
  BENCH_CK(cudaMalloc(&dRec, (size_t)grid * 3 * kRecWords * sizeof(uint64_t)));
  BENCH_CK(cudaMalloc(&sink, grid * sizeof(float)));
  a.tiles = tiles;
  a.src = src;
  a.srcBytes = srcBytes;
  a.iters = iters;
  a.rec = dRec;
  a.sink = sink;

  // The engine's forms: the cooperative tile (m64n256, R 1, two warpgroups), the ping-pong
  // units (R 2 at n128 and n192, one or two warpgroups issuing), and n64 for scale.
  std::vector<Result> res;
  for (int load : {0, 1})
    for (int wgs : {1, 2}) {
      const Config cs[] = {{64, 2, wgs, load},  {128, 1, wgs, load}, {128, 2, wgs, load},
                           {192, 1, wgs, load}, {192, 2, wgs, load}, {256, 1, wgs, load}};
      for (const Config& c : cs) {
        Result r;
        if (c.n == 64) r = runOne<64, 2>(c, a, grid, peak, stream, dRec);
        if (c.n == 128 && c.r == 1) r = runOne<128, 1>(c, a, grid, peak, stream, dRec);
        if (c.n == 128 && c.r == 2) r = runOne<128, 2>(c, a, grid, peak, stream, dRec);
        if (c.n == 192 && c.r == 1) r = runOne<192, 1>(c, a, grid, peak, stream, dRec);
        if (c.n == 192 && c.r == 2) r = runOne<192, 2>(c, a, grid, peak, stream, dRec);
        if (c.n == 256) r = runOne<256, 1>(c, a, grid, peak, stream, dRec);
        res.push_back(r);
        printf(
            "  m64n%-3d x %d row halves, %d warpgroup%s%s: %7.1f cycles a k-step, %6.1f "
            "multiply-adds/clk/SM = %.3f of peak%s",
            c.n, c.r, c.wgs, c.wgs > 1 ? "s" : " ", c.load ? ", loader" : "", r.cyclesPerStep,
            r.fmaPerClk, r.frac, c.load ? "" : "\n");
        if (c.load) printf(", loader %.1f B/clk\n", r.loadBytesPerClk);
        fflush(stdout);
      }
    }
  if (!out.empty()) {
    FILE* f = benchargs::openJson(out, "wgmma_rate", argc, argv, commit, prop.name, grid);
    if (f == nullptr) return 1;
    fprintf(f, "  \"iters\": %d,\n  \"peak_fma_per_clk_per_sm\": %.1f,\n  \"results\": [\n", iters,
            peak);
    for (size_t i = 0; i < res.size(); ++i) {
      const Result& r = res[i];
      fprintf(f,
              "    {\"n\": %d, \"row_halves\": %d, \"warpgroups\": %d, \"loader\": %d, "
              "\"cycles_per_kstep\": %.2f, \"fma_per_clk_per_sm\": %.2f, \"fraction_of_peak\": "
              "%.4f, \"loader_bytes_per_clk\": %.2f}%s\n",
              r.c.n, r.c.r, r.c.wgs, r.c.load, r.cyclesPerStep, r.fmaPerClk, r.frac,
              r.loadBytesPerClk, i + 1 < res.size() ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    fclose(f);
  }
  cudaFree(tiles);
  cudaFree(src);
  cudaFree(dRec);
  cudaFree(sink);
  return 0;
}
