// The demo's fused part: ncclGemmAllReduce, ncclAllGatherGemm and ncclGemmReduceScatter on
// every rank, each run as one fused kernel per rank and as the sequential path (GEMM, then the
// collective), checked against an fp64 host reference on sampled elements and against each
// other, then timed side by side.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "demo_util.h"
#include "mkernel/fused.h"

namespace {

enum class Op { kAllReduce, kAllGather, kReduceScatter };

const char* opName(Op op) {
  switch (op) {
    case Op::kAllReduce:
      return "ncclGemmAllReduce    ";
    case Op::kAllGather:
      return "ncclAllGatherGemm    ";
    default:
      return "ncclGemmReduceScatter";
  }
}

struct RankBufs {
  __nv_bfloat16 *A = nullptr, *B = nullptr, *C = nullptr;
  cudaStream_t st = nullptr;
};

// One call on every rank (fused calls are not grouped: each rank's kernel waits for its
// peers on the device, so one thread may issue them one after the other).
void issue(Op op, std::vector<RankBufs>& r, const std::vector<ncclComm_t>& comms, size_t M,
           size_t N, size_t K, int algo) {
  ncclFusedConfig_t cfg = NCCL_FUSED_CONFIG_INITIALIZER;
  cfg.algo = algo;
  for (size_t i = 0; i < r.size(); ++i) {
    if (op == Op::kAllReduce) {
      DEMO_NCCL(ncclGemmAllReduce(r[i].A, r[i].B, r[i].C, M, N, K, ncclBfloat16, &cfg, comms[i],
                                  r[i].st));
    } else if (op == Op::kAllGather) {
      DEMO_NCCL(ncclAllGatherGemm(r[i].A, r[i].B, r[i].C, nullptr, M, N, K, ncclBfloat16, &cfg,
                                  comms[i], r[i].st));
    } else {
      DEMO_NCCL(ncclGemmReduceScatter(r[i].A, r[i].B, r[i].C, M, N, K, ncclBfloat16, &cfg, comms[i],
                                      r[i].st));
    }
  }
  for (auto& b : r) DEMO_CUDA(cudaStreamSynchronize(b.st));
}

double timeIt(Op op, std::vector<RankBufs>& r, const std::vector<ncclComm_t>& comms, size_t M,
              size_t N, size_t K, int algo) {
  const int iters = 10;
  issue(op, r, comms, M, N, K, algo);  // warm-up
  auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) issue(op, r, comms, M, N, K, algo);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
         iters;
}

void runOp(Op op, const std::vector<ncclComm_t>& comms, const std::vector<int>& devs) {
  const int n = (int)comms.size();
  const size_t M = 2048, N = 2048, K = 1024;  // M: rows of C (AllGather/ReduceScatter: total)
  const size_t rowsA = op == Op::kAllGather ? M / n : M;  // rows of A on each rank
  const size_t rowsC = op == Op::kReduceScatter ? M / n : M;
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  // B is shared by every rank (a Linear weight [N, K]); A differs per rank.
  std::vector<__nv_bfloat16> hB(N * K);
  for (auto& v : hB) v = __float2bfloat16(dist(rng));
  std::vector<std::vector<__nv_bfloat16>> hA(n, std::vector<__nv_bfloat16>(rowsA * K));
  std::vector<RankBufs> r(n);
  for (int i = 0; i < n; ++i) {
    for (auto& v : hA[i]) v = __float2bfloat16(dist(rng));
    DEMO_CUDA(cudaSetDevice(devs[i]));
    DEMO_CUDA(cudaMalloc(&r[i].A, rowsA * K * 2));
    DEMO_CUDA(cudaMalloc(&r[i].B, N * K * 2));
    DEMO_CUDA(cudaMalloc(&r[i].C, rowsC * N * 2));
    DEMO_CUDA(cudaStreamCreateWithFlags(&r[i].st, cudaStreamNonBlocking));
    DEMO_CUDA(cudaMemcpy(r[i].A, hA[i].data(), rowsA * K * 2, cudaMemcpyHostToDevice));
    DEMO_CUDA(cudaMemcpy(r[i].B, hB.data(), N * K * 2, cudaMemcpyHostToDevice));
  }
  // Reference of C[row][col] on `rank` (fp64 over the bf16 inputs).
  auto ref = [&](int rank, size_t row, size_t col) {
    double s = 0;
    if (op == Op::kAllGather) {
      const size_t q = row / rowsA, rr = row % rowsA;
      for (size_t k = 0; k < K; ++k)
        s += (double)__bfloat162float(hA[q][rr * K + k]) * __bfloat162float(hB[col * K + k]);
      return s;
    }
    const size_t gRow = op == Op::kReduceScatter ? rank * rowsC + row : row;
    for (int q = 0; q < n; ++q)
      for (size_t k = 0; k < K; ++k)
        s += (double)__bfloat162float(hA[q][gRow * K + k]) * __bfloat162float(hB[col * K + k]);
    return s;
  };
  // out[a][i]: rank i's C from algo a (fused, sequential), poisoned first (0xffff: NaN).
  const int algos[2] = {ncclFusedFused, ncclFusedSequential};
  std::vector<std::vector<std::vector<__nv_bfloat16>>> out(
      2, std::vector<std::vector<__nv_bfloat16>>(n, std::vector<__nv_bfloat16>(rowsC * N)));
  size_t wrong = 0, differ = 0;
  for (int a = 0; a < 2; ++a) {
    for (int i = 0; i < n; ++i) DEMO_CUDA(cudaMemset(r[i].C, 0xff, rowsC * N * 2));
    issue(op, r, comms, M, N, K, algos[a]);
    for (int i = 0; i < n; ++i)
      DEMO_CUDA(cudaMemcpy(out[a][i].data(), r[i].C, rowsC * N * 2, cudaMemcpyDeviceToHost));
  }
  for (int i = 0; i < n; ++i) {
    // Sampled elements against fp64; the tolerance covers the bf16 roundings of the partial
    // products and of the result.
    for (int s = 0; s < 64; ++s) {
      const size_t row = rng() % rowsC, col = rng() % N;
      const double want = ref(i, row, col);
      for (int a = 0; a < 2; ++a) {
        const double got = __bfloat162float(out[a][i][row * N + col]);
        if (!(std::fabs(got - want) <= 0.02 * std::fabs(want) + 0.05 * std::sqrt((double)K)))
          ++wrong;
      }
    }
    differ += std::memcmp(out[0][i].data(), out[1][i].data(), rowsC * N * 2) != 0;
  }
  const double tf = timeIt(op, r, comms, M, N, K, ncclFusedFused);
  const double ts = timeIt(op, r, comms, M, N, K, ncclFusedSequential);
  const double ta = timeIt(op, r, comms, M, N, K, ncclFusedAuto);
  printf(
      "  %s %zux%zux%zu x %d ranks: %s, fused %s sequential; fused %.3f ms, sequential %.3f ms, "
      "auto %.3f ms\n",
      opName(op), M, N, K, n, wrong ? "WRONG" : "correct",
      differ ? "differs from" : "bit-identical to", tf, ts, ta);
  for (auto& b : r) {
    cudaFree(b.A);
    cudaFree(b.B);
    cudaFree(b.C);
    cudaStreamDestroy(b.st);
  }
  if (wrong) exit(1);
}

}  // namespace

void fusedDemo(const std::vector<ncclComm_t>& comms, const std::vector<int>& devs) {
  int dev = 0;
  cudaDeviceProp prop;
  DEMO_CUDA(cudaGetDevice(&dev));
  DEMO_CUDA(cudaGetDeviceProperties(&prop, dev));
  if (prop.major != 9) {
    printf(
        "  fused GEMM + collectives: skipped (the GEMM engine needs a Hopper GPU; this is "
        "sm_%d%d)\n",
        prop.major, prop.minor);
    return;
  }
  for (Op op : {Op::kAllReduce, Op::kAllGather, Op::kReduceScatter}) runOp(op, comms, devs);
}
