// GPU tests of ncclGemmAllReduce, ncclAllGatherGemm and ncclGemmReduceScatter: n ranks
// sharing GPU 0 (one thread driving every rank), fresh random inputs per case, poisoned
// outputs, every element compared with an fp64 reference computed independently on the GPU
// (per-rank products summed in fp64), with a tolerance derived from the rounding the call
// may do: each partial rounded to the output type, then n-1 additions in that type.
// GemmAllReduce results must also be bit-identical on every rank.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/test_coll_util.h"
#include "gpu/test_gemm_util.cuh"
#include "mkernel/fused.h"

namespace {

using gemmtest::fillRandom;
using gemmtest::loadAny;
using mk::gemm::DType;

DType dtOf(ncclDataType_t t) {
  return t == ncclFloat16 ? DType::kF16 : (t == ncclFloat32 ? DType::kF32 : DType::kBF16);
}
size_t esOf(ncclDataType_t t) {
  return t == ncclFloat32 ? 4 : 2;
}

// ref[m,n] (+)= sum_k A[m,k] B(k,n) and absRef[m,n] (+)= |that product|, in fp64.
__global__ void refAccumKernel(int M, int N, int K, const void* A, const void* B, int kn, DType ab,
                               double* ref, double* absRef, int accumulate) {
  const int m = blockIdx.y * 16 + threadIdx.y, n = blockIdx.x * 16 + threadIdx.x;
  if (m >= M || n >= N) return;
  double acc = 0;
  for (int k = 0; k < K; ++k) {
    const double b = kn ? loadAny(B, (int64_t)k * N + n, ab) : loadAny(B, (int64_t)n * K + k, ab);
    acc += loadAny(A, (int64_t)m * K + k, ab) * b;
  }
  const int64_t i = (int64_t)m * N + n;
  ref[i] = accumulate ? ref[i] + acc : acc;
  absRef[i] = accumulate ? absRef[i] + fabs(acc) : fabs(acc);
}

__global__ void addBiasRefKernel(int M, int N, const void* bias, DType bt, double* ref,
                                 double* absRef) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (int64_t)M * N;
       i += (int64_t)gridDim.x * blockDim.x) {
    const double b = loadAny(bias, i % N, bt);
    ref[i] += b;
    absRef[i] += fabs(b);
  }
}

// Counts elements of got[rows, N] (starting at reference row `row0`) outside
// |got - ref| <= tol * absRef + atol; NaN fails.
__global__ void checkKernel(int rows, int N, int row0, const void* got, DType t, const double* ref,
                            const double* absRef, double tol, double atol, unsigned long long* bad,
                            unsigned long long* first) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (int64_t)rows * N;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = (int64_t)row0 * N + i;
    const double d = loadAny(got, i, t);
    if (!(fabs(d - ref[j]) <= tol * absRef[j] + atol)) {
      atomicAdd(bad, 1ull);
      atomicMin(first, (unsigned long long)i);
    }
  }
}

struct Case {
  int op;  // 0 GemmAllReduce, 1 AllGatherGemm, 2 GemmReduceScatter
  int n;
  int M, N, K;
  int layout;
  ncclDataType_t in, out;
  bool bias;
  int algo;
};

std::string name(const Case& c) {
  static const char* ops[] = {"GemmAllReduce", "AllGatherGemm", "GemmReduceScatter"};
  static const char* algos[] = {"auto", "fused", "seq"};
  return std::string(ops[c.op]) + "_n" + std::to_string(c.n) + "_" + std::to_string(c.M) + "x" +
         std::to_string(c.N) + "x" + std::to_string(c.K) + (c.layout ? "_KN" : "_NK") + "_" +
         (c.in == ncclFloat16 ? "f16" : "bf16") + "_to_" +
         (c.out == ncclFloat32 ? "f32" : (c.out == ncclFloat16 ? "f16" : "bf16")) +
         (c.bias ? "_bias" : "") + "_" + algos[c.algo];
}

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t bytes) { cudaMalloc(&p, bytes ? bytes : 16); }
  ~Buf() { cudaFree(p); }
};

// Runs one case `reps` times (fresh inputs each time; reps > 1 inside a CUDA graph when
// `graph`), returns "" or what went wrong.
std::string runCase(const Case& c, uint64_t seed, bool graph = false, int reps = 1) {
  colltest::Clique& q = colltest::clique(c.n);
  if (!q.ok) return "clique: " + q.why;
  const int n = c.n;
  const size_t es = 2, eo = esOf(c.out);
  const size_t rowsA = c.op == 1 ? c.M / n : c.M, rowsC = c.op == 2 ? c.M / n : c.M;
  const size_t bytesB = (size_t)c.N * c.K * es;
  std::vector<std::unique_ptr<Buf>> A, B, C, G;
  cudaSetDevice(0);
  for (int r = 0; r < n; ++r) {
    A.emplace_back(new Buf(rowsA * c.K * es));
    B.emplace_back(new Buf(bytesB));
    C.emplace_back(new Buf(rowsC * c.N * eo));
    G.emplace_back(new Buf(c.op == 1 ? (size_t)c.M * c.K * es : 0));
  }
  Buf bias((size_t)c.N * eo), ref((size_t)c.M * c.N * 8), absRef((size_t)c.M * c.N * 8);
  Buf cnt(16);
  ncclFusedConfig_t cfg = NCCL_FUSED_CONFIG_INITIALIZER;
  cfg.bLayout = c.layout;
  cfg.outType = c.out;
  cfg.bias = c.bias ? bias.p : nullptr;
  cfg.algo = c.algo;

  std::vector<cudaGraph_t> graphs;
  auto issue = [&]() -> std::string {
    for (int r = 0; r < n; ++r) {
      ncclResult_t res;
      if (c.op == 0)
        res = ncclGemmAllReduce(A[r]->p, B[r]->p, C[r]->p, c.M, c.N, c.K, c.in, &cfg, q.comms[r],
                                q.streams[r]);
      else if (c.op == 1)
        res = ncclAllGatherGemm(A[r]->p, B[0]->p, C[r]->p, G[r]->p, c.M, c.N, c.K, c.in, &cfg,
                                q.comms[r], q.streams[r]);
      else
        res = ncclGemmReduceScatter(A[r]->p, B[r]->p, C[r]->p, c.M, c.N, c.K, c.in, &cfg,
                                    q.comms[r], q.streams[r]);
      if (res != ncclSuccess)
        return std::string("rank ") + std::to_string(r) + ": " + ncclGetErrorString(res) + ": " +
               ncclGetLastError(nullptr);
    }
    return "";
  };
  // Graph mode: one graph per rank stream, captured once (the calls read the buffers at
  // replay time), replayed with new inputs.
  std::vector<cudaGraphExec_t> execs;
  if (graph) {
    for (int r = 0; r < n; ++r) {
      if (cudaStreamBeginCapture(q.streams[r], cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        return "begin capture failed";
    }
    std::string e = issue();
    // End every capture before instantiating anything (instantiation is refused while a
    // stream of this thread still captures), also when a call failed.
    std::vector<cudaError_t> ended(n);
    graphs.assign(n, nullptr);
    for (int r = 0; r < n; ++r) ended[r] = cudaStreamEndCapture(q.streams[r], &graphs[r]);
    for (int r = 0; r < n && e.empty(); ++r) {
      if (ended[r] != cudaSuccess || graphs[r] == nullptr)
        e = std::string("end capture failed: ") + cudaGetErrorString(ended[r]);
    }
    for (int r = 0; r < n && e.empty(); ++r) {
      cudaGraphExec_t x = nullptr;
      cudaError_t ie = cudaGraphInstantiate(&x, graphs[r], 0);
      if (ie != cudaSuccess) e = std::string("instantiate failed: ") + cudaGetErrorString(ie);
      execs.push_back(x);
    }
    if (!e.empty()) {
      for (auto x : execs)
        if (x) cudaGraphExecDestroy(x);
      for (auto g : graphs)
        if (g) cudaGraphDestroy(g);
      colltest::dropClique(c.n);
      return e;
    }
  }
  std::string err;
  for (int rep = 0; rep < reps && err.empty(); ++rep) {
    const uint64_t s = seed * 1000 + rep * 17;
    const int kn = c.layout == ncclFusedLayoutKN;
    for (int r = 0; r < n; ++r) {
      fillRandom(A[r]->p, rowsA, c.K, c.K, dtOf(c.in), s * 31 + r);
      if (c.op != 1 || r == 0)
        fillRandom(B[r]->p, kn ? c.K : c.N, kn ? c.N : c.K, kn ? c.N : c.K, dtOf(c.in),
                   s * 31 + 100 + r);
      cudaMemset(C[r]->p, 0xFF, rowsC * c.N * eo);
      if (c.op == 1) cudaMemset(G[r]->p, 0xFF, (size_t)c.M * c.K * es);
    }
    if (c.bias) fillRandom(bias.p, 1, c.N, c.N, dtOf(c.out), s * 31 + 999);
    // Reference: sum over ranks of A_r B_r (AR/RS); the gathered A times B (AG).
    dim3 blk(16, 16), grd((c.N + 15) / 16, (c.M + 15) / 16);
    if (c.op == 1) {
      dim3 grdS((c.N + 15) / 16, (rowsA + 15) / 16);
      for (int r = 0; r < n; ++r)
        refAccumKernel<<<grdS, blk>>>(rowsA, c.N, c.K, A[r]->p, B[0]->p, kn, dtOf(c.in),
                                      (double*)ref.p + (size_t)r * rowsA * c.N,
                                      (double*)absRef.p + (size_t)r * rowsA * c.N, 0);
    } else {
      for (int r = 0; r < n; ++r)
        refAccumKernel<<<grd, blk>>>(c.M, c.N, c.K, A[r]->p, B[r]->p, kn, dtOf(c.in),
                                     (double*)ref.p, (double*)absRef.p, r > 0);
    }
    if (c.bias)
      addBiasRefKernel<<<256, 256>>>(c.M, c.N, bias.p, dtOf(c.out), (double*)ref.p,
                                     (double*)absRef.p);
    if (cudaDeviceSynchronize() != cudaSuccess) return "reference failed";
    if (graph) {
      for (int r = 0; r < n; ++r)
        if (cudaGraphLaunch(execs[r], q.streams[r]) != cudaSuccess) return "graph launch failed";
    } else {
      err = issue();
      if (!err.empty()) break;
    }
    if (!colltest::syncClique(q, 120, &err)) break;
    // Tolerance: partials rounded to the output type (one unit roundoff each) and summed in
    // it (n-1 more), plus the bias addition; fp32 accumulation inside the GEMM is far below.
    const double u =
        c.out == ncclFloat32 ? 1.0 / (1 << 23) : (c.out == ncclFloat16 ? 1.0 / 2048 : 1.0 / 256);
    const double tol = (c.op == 1 ? 2 : n + 2) * u;
    // fp32 accumulation over K inside the GEMM (cancellation makes it absolute, not relative).
    const double atol = (double)c.K * n / (1 << 24);
    for (int r = 0; r < n && err.empty(); ++r) {
      unsigned long long h[2] = {0, ~0ull};
      cudaMemcpy(cnt.p, h, 16, cudaMemcpyHostToDevice);
      const int row0 = c.op == 2 ? r * (int)rowsC : 0;
      checkKernel<<<512, 256>>>((int)rowsC, c.N, row0, C[r]->p, dtOf(c.out), (double*)ref.p,
                                (double*)absRef.p, tol, atol, (unsigned long long*)cnt.p,
                                (unsigned long long*)cnt.p + 1);
      cudaMemcpy(h, cnt.p, 16, cudaMemcpyDeviceToHost);
      if (h[0] != 0)
        err = "rank " + std::to_string(r) + ": " + std::to_string(h[0]) +
              " wrong elements (first " + std::to_string(h[1]) + ")";
    }
    if (err.empty() && c.op == 0) {  // bit-identical on every rank
      std::vector<uint8_t> h0(rowsC * c.N * eo), h1(h0.size());
      cudaMemcpy(h0.data(), C[0]->p, h0.size(), cudaMemcpyDeviceToHost);
      for (int r = 1; r < n && err.empty(); ++r) {
        cudaMemcpy(h1.data(), C[r]->p, h1.size(), cudaMemcpyDeviceToHost);
        if (h0 != h1)
          err = "rank " + std::to_string(r) + " differs from rank 0 (not bit-identical)";
      }
    }
    if (err.empty() && c.op == 1) {  // the gathered A: every shard in place, bytes exact
      std::vector<uint8_t> g(c.M * (size_t)c.K * es), a(rowsA * c.K * es);
      for (int r = 0; r < n && err.empty(); ++r) {
        cudaMemcpy(g.data(), G[r]->p, g.size(), cudaMemcpyDeviceToHost);
        for (int p = 0; p < n && err.empty(); ++p) {
          cudaMemcpy(a.data(), A[p]->p, a.size(), cudaMemcpyDeviceToHost);
          if (memcmp(g.data() + p * a.size(), a.data(), a.size()) != 0)
            err = "rank " + std::to_string(r) + ": Agathered block " + std::to_string(p) + " wrong";
        }
      }
    }
  }
  for (auto x : execs) cudaGraphExecDestroy(x);
  for (auto g : graphs) cudaGraphDestroy(g);
  if (!err.empty()) colltest::dropClique(c.n);
  return err;
}

class FusedGemmColl : public ::testing::TestWithParam<Case> {};

TEST_P(FusedGemmColl, MatchesReference) {
  MKTEST_REQUIRE_GPU();
  const Case& c = GetParam();
  std::string err = runCase(c, ::testing::UnitTest::GetInstance()->random_seed() + c.M * 7 + c.n);
  EXPECT_EQ(err, "") << name(c);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  const int ranks[] = {1, 2, 3, 4, 8};
  for (int op = 0; op < 3; ++op) {
    for (int n : ranks) {
      // Tiles and tails in M, N and K; M a multiple of n*8 so shards stay 16-byte rows.
      v.push_back({op, n, 48 * n, 264, 136, 0, ncclBfloat16, ncclBfloat16, false, 0});
      v.push_back({op, n, 256 * n, 512, 256, 1, ncclFloat16, ncclFloat32, true, 0});
    }
    v.push_back({op, 4, 520, 130, 72, 0, ncclBfloat16, ncclFloat16, true, 2});
    v.push_back({op, 4, 1024, 1024, 1024, 0, ncclBfloat16, ncclBfloat16, true, 1});
    v.push_back({op, 2, 2048, 768, 512, 1, ncclBfloat16, ncclFloat32, false, 2});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedGemmColl, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return name(i.param); });

// Captured once per rank stream, replayed with new inputs.
TEST(FusedGemmCollGraph, ReplaysWithNewInputs) {
  MKTEST_REQUIRE_GPU();
  for (int algo : {ncclFusedSequential, ncclFusedFused}) {
    for (int op = 0; op < 3; ++op) {
      Case c{op, 4, 512, 384, 192, 0, ncclBfloat16, ncclBfloat16, op == 0, algo};
      // One eager call first: the fused path sets up its per-comm state outside capture.
      EXPECT_EQ(runCase(c, 70 + op), "") << name(c) << " (eager)";
      EXPECT_EQ(runCase(c, 77 + op, true, 50), "") << name(c);
    }
  }
}

// Bad input is refused before any CUDA call, with a message, and the comm stays usable.
TEST(FusedGemmCollArgs, RefusedAndCommStillWorks) {
  MKTEST_REQUIRE_GPU();
  colltest::Clique& q = colltest::clique(2);
  ASSERT_TRUE(q.ok) << q.why;
  Buf a(4096), b(4096), c(4096);
  ncclFusedConfig_t cfg = NCCL_FUSED_CONFIG_INITIALIZER;
  EXPECT_EQ(
      ncclGemmAllReduce(a.p, b.p, c.p, 16, 16, 12, ncclBfloat16, &cfg, q.comms[0], q.streams[0]),
      ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("multiple of 8"), std::string::npos);
  EXPECT_EQ(ncclGemmReduceScatter(a.p, b.p, c.p, 15, 16, 16, ncclBfloat16, &cfg, q.comms[0],
                                  q.streams[0]),
            ncclInvalidArgument);
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(
      ncclGemmAllReduce(a.p, b.p, c.p, 16, 16, 16, ncclBfloat16, &cfg, q.comms[0], q.streams[0]),
      ncclInvalidUsage);
  ncclGroupEnd();  // may report the refused call: NCCL returns a group's recorded error
  Case ok{0, 2, 64, 64, 64, 0, ncclBfloat16, ncclBfloat16, false, 0};
  EXPECT_EQ(runCase(ok, 5), "");
}

}  // namespace
