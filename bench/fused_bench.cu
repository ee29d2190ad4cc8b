// Fused GEMM + collective benchmark (include/mkernel/fused.h), one run, side by side.
//
// (a) n ranks (default 4) sharing GPU 0 as threads of this process (ncclCommInitAll, one
//     thread per rank: fused calls are refused inside ncclGroupStart/End). Per operator and
//     shape, each timed the same way (every rank's call between one start event and that
//     rank's stop event; median of --reps, after warm-up; A rotates over operand sets that
//     exceed 3x L2). The start fires once every rank thread has queued its call, so ranks'
//     kernels start together and host issue is not in the time (it is reported apart,
//     "host issue ms"; the ungated start let the ranks' fused kernels begin up to ~0.9 ms
//     apart on the H200, each then waiting for its peers' tiles):
//       fused       algo = ncclFusedFused        sequential  algo = ncclFusedSequential
//       auto        algo = ncclFusedAuto         cublas+coll cuBLASLt GEMM, mkernel collective
//       gemm_engine mkernel's GEMM engine alone (the per-rank SM budget the operators use)
//       gemm_cublas cuBLASLt alone               coll        mkernel's collective alone
//     hidden = (T_gemm_engine + T_coll - T_fused) / min(T_gemm_engine, T_coll): the part of the
//     shorter phase that fusing hid. TFLOP/s are per rank (2MNK / time; with n ranks on one
//     GPU the device does n times that). Before timing, fused, auto and cublas+coll outputs
//     are compared with the sequential one on every rank (max |diff| / max |C|, <= 0.05).
//     Shapes: GEMM+AllReduce and GEMM+ReduceScatter M x 8192 x 8192; AllGather+GEMM M = K,
//     N = M/16 (mKernel's benchmark); plus K (AR, RS) or N (AG) sharded by 8. Default M in
//     {2048, 8192, 32768}; --full: every power of two 2048..32768 and more sharded shapes.
// (b) of issue 12 (2 processes as 2 nodes against cuBLAS + the real NCCL over sockets) is
//     bench/fused_procs_bench.cu, run by bench/fused_vs_nccl.sh; the shapes are shared
//     (fused_shapes.cuh). The split chosen and the cost model's prediction are not exposed by
//     the public API (fields "split" and "model" are null in the JSON here; mode (b) takes
//     the split from the library's NCCL_DEBUG_SUBSYS=FUSED log).
//
//   bench_fused_bench [--ranks 4] [--reps 10] [--warmup 2] [--ops ar,ag,rs] [--full]
//                     [--shapes ar:4096x8192x8192,ag:...] [--out FILE] [--timeout 900]
//                     [--blocked]
// Variants are interleaved: each one's warm-up, then per rep one call of every variant in
// turn (--blocked: each variant's warm-up and reps in one block, as before session 25).
// JSON (command, commit, device, date, every time) under bench/results/ unless --out; the
// table comes last. Every wait is bounded (per-phase deadline, process watchdog).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coll_bench_util.h"
#include "bench_args.h"
#include "fused_shapes.cuh"
#include "fused/gemm/gemm.h"
#include "mkernel/fused.h"

using collbench::Json;
using namespace fusedbench;  // NOLINT: the shared shape list, operators and fill

namespace {

[[noreturn]] void fatal(const std::string& msg) {
  fprintf(stderr, "fused_bench: FAIL %s\n", msg.c_str());
  fflush(stdout);
  _exit(1);
}
#define FB_CUDA(cmd)                                                        \
  do {                                                                      \
    cudaError_t e_ = (cmd);                                                 \
    if (e_ != cudaSuccess)                                                  \
      fatal(std::string(#cmd) + ": " + cudaGetErrorName(e_) + " at line " + \
            std::to_string(__LINE__));                                      \
  } while (0)
#define FB_BLAS(cmd)                                                                         \
  do {                                                                                       \
    cublasStatus_t s_ = (cmd);                                                               \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                         \
      fatal(std::string(#cmd) + ": cuBLAS status " + std::to_string((int)s_) + " at line " + \
            std::to_string(__LINE__));                                                       \
  } while (0)

enum Variant { kFused, kSeq, kAuto, kCublasColl, kGemmEngine, kGemmCublas, kColl, kNumVariants };
const char* kVarNames[kNumVariants] = {"fused",       "sequential",  "auto", "cublas+coll",
                                       "gemm_engine", "gemm_cublas", "coll"};

struct Options {
  int ranks = 4, device = 0, reps = 10, warmup = 2, timeoutS = 0;  // 0: 900, --full 2400
  bool full = false;
  bool blocked = false;  // each variant's reps in one block (interleaved: a round of every
                         // variant per rep, so the card's state drifts alike for all of them)
  std::string ops = "ar,ag,rs", shapes, out;
};

// ---- device helpers ---------------------------------------------------------------------------
// out[0] = max |a - b| (NaN counts as 1e30), out[1] = max |b|, over n elements. The caller
// reports out[0] / out[1]: rounding differences between summation orders are relative to the
// largest partial sums, not to each element (non-negative floats compare as ints).
__global__ void diffKernel(const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n, float* out) {
  float m = 0.0f, r = 0.0f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const float x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    const float d = fabsf(x - y);
    m = (d == d) ? fmaxf(m, d) : 1e30f;
    r = fmaxf(r, fabsf(y));
  }
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(m));
  atomicMax(reinterpret_cast<int*>(out) + 1, __float_as_int(r));
}

// Holds stream 0 until the host says every rank has queued its call (*gate >= want), so that
// `start` fires with all ranks' work already queued and the times are the GPU's, not the rank
// threads' host issue (measured apart). Bounded: after `maxCycles` it gives up and counts the
// expiry in *expired (the times of that call then include host issue; reported).
__global__ void gateKernel(const volatile int* gate, int want, long long maxCycles, int* expired) {
  const long long t0 = clock64();
  while (*gate < want) {
    if (clock64() - t0 > maxCycles) {
      atomicAdd(expired, 1);
      return;
    }
  }
}

double nowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// cudaEventSynchronize without an unbounded wait.
void waitEvent(cudaEvent_t e, double deadline, const std::string& what) {
  for (;;) {
    cudaError_t r = cudaEventQuery(e);
    if (r == cudaSuccess) return;
    if (r != cudaErrorNotReady) fatal(what + ": " + cudaGetErrorString(r));
    if (nowS() > deadline) fatal("timed out waiting for the GPU during " + what);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// ---- one thread per rank ----------------------------------------------------------------------
class RankPool {
 public:
  RankPool(int n, int device) : n_(n) {
    for (int r = 0; r < n; ++r)
      threads_.emplace_back([this, r, device] {
        if (cudaSetDevice(device) != cudaSuccess) fatal("cudaSetDevice in a rank thread");
        loop(r);
      });
  }
  ~RankPool() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  // Runs fn(rank) on every rank's thread and waits (bounded) until all returned.
  void run(const std::function<void(int)>& fn, double timeoutS, const std::string& what) {
    std::unique_lock<std::mutex> g(mu_);
    fn_ = &fn;
    pending_ = n_;
    ++gen_;
    cv_.notify_all();
    if (!done_.wait_for(g, std::chrono::duration<double>(timeoutS), [&] { return pending_ == 0; }))
      fatal("a rank thread did not return within " + std::to_string((int)timeoutS) + " s during " +
            what + " (a host call blocked)");
    fn_ = nullptr;
  }

 private:
  void loop(int r) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* fn;
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return stop_ || gen_ != seen; });
        if (stop_) return;
        seen = gen_;
        fn = fn_;
      }
      (*fn)(r);
      std::lock_guard<std::mutex> g(mu_);
      if (--pending_ == 0) done_.notify_all();
    }
  }
  int n_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  const std::function<void(int)>* fn_ = nullptr;
  uint64_t gen_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

// ---- per-rank state for one shape ---------------------------------------------------------------
struct Rank {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* ws = nullptr;
  // shape buffers
  std::vector<void*> A;  // rotating operand sets: A (AR, RS: [M,K]; AG: shard [M/n,K])
  void *B = nullptr, *C = nullptr, *Cref = nullptr, *G = nullptr, *T = nullptr;
  float* diff = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulHeuristicResult_t heur{};
  std::vector<cudaEvent_t> stops;
  std::string error;
};
constexpr size_t kWsBytes = size_t(32) << 20;

struct Bench {
  Options o;
  int n = 0, sms = 0, l2 = 0;
  std::vector<Rank> ranks;
  cudaStream_t s0 = nullptr;
  std::vector<cudaEvent_t> starts;
  RankPool* pool = nullptr;
  int* gate = nullptr;     // mapped host memory: calls queued by every rank (gateKernel)
  int* expired = nullptr;  // mapped host memory: gates that gave up (times include host issue)
  int gateSeq = 0;
};

void setupShape(Bench& b, const Shape& s, int r, int sets) {
  Rank& k = b.ranks[r];
  const size_t e = 2, bytesA = rowsA(s, b.n) * s.K * e;
  k.A.assign(sets, nullptr);
  for (int i = 0; i < sets; ++i) {
    FB_CUDA(cudaMalloc(&k.A[i], bytesA));
    fillKernel<<<1024, 256, 0, k.stream>>>((__nv_bfloat16*)k.A[i], bytesA / e, 1000 * r + i);
  }
  FB_CUDA(cudaMalloc(&k.B, s.N * s.K * e));
  fillKernel<<<1024, 256, 0, k.stream>>>((__nv_bfloat16*)k.B, s.N * s.K, 77 + r);
  FB_CUDA(cudaMalloc(&k.C, rowsC(s, b.n) * s.N * e));
  FB_CUDA(cudaMalloc(&k.Cref, rowsC(s, b.n) * s.N * e));
  if (s.op == kAG) {
    FB_CUDA(cudaMalloc(&k.G, s.M * s.K * e));
    fillKernel<<<1024, 256, 0, k.stream>>>((__nv_bfloat16*)k.G, s.M * s.K, 5);
  }
  if (s.op == kRS) FB_CUDA(cudaMalloc(&k.T, s.M * s.N * e));
  FB_CUDA(cudaMalloc(&k.diff, 2 * sizeof(float)));
  FB_CUDA(cudaGetLastError());
  // cuBLASLt in the column-major view: C^T[N, rows] = B^T-op * A^T (B is [N,K] row-major).
  const size_t rows = s.M;  // C of AR and AG, and RS's full product T, have M rows
  FB_BLAS(cublasLtMatmulDescCreate(&k.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  FB_BLAS(cublasLtMatmulDescSetAttribute(k.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  FB_BLAS(cublasLtMatmulDescSetAttribute(k.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  FB_BLAS(cublasLtMatrixLayoutCreate(&k.la, CUDA_R_16BF, s.K, s.N, s.K));
  FB_BLAS(cublasLtMatrixLayoutCreate(&k.lb, CUDA_R_16BF, s.K, rows, s.K));
  FB_BLAS(cublasLtMatrixLayoutCreate(&k.lc, CUDA_R_16BF, s.N, rows, s.N));
  cublasLtMatmulPreference_t pref;
  FB_BLAS(cublasLtMatmulPreferenceCreate(&pref));
  FB_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &kWsBytes, sizeof(kWsBytes)));
  int found = 0;
  FB_BLAS(
      cublasLtMatmulAlgoGetHeuristic(k.lt, k.op, k.la, k.lb, k.lc, k.lc, pref, 1, &k.heur, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  if (found < 1)
    fatal("cuBLASLt has no algorithm for " + std::to_string(rows) + "x" + std::to_string(s.N) +
          "x" + std::to_string(s.K));
}

void teardownShape(Rank& k) {
  for (void* p : k.A) cudaFree(p);
  k.A.clear();
  for (void** p : {&k.B, &k.C, &k.Cref, &k.G, &k.T}) {
    if (*p) cudaFree(*p);
    *p = nullptr;
  }
  cudaFree(k.diff);
  k.diff = nullptr;
  cublasLtMatrixLayoutDestroy(k.la);
  cublasLtMatrixLayoutDestroy(k.lb);
  cublasLtMatrixLayoutDestroy(k.lc);
  cublasLtMatmulDescDestroy(k.op);
}

bool ncclOk(Rank& k, ncclResult_t res, const char* what) {
  if (res == ncclSuccess) return true;
  if (k.error.empty())
    k.error = std::string(what) + ": " + ncclGetErrorString(res) + ": " + ncclGetLastError(nullptr);
  return false;
}

void cublasGemm(Rank& k, const void* A, void* D) {
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t st = cublasLtMatmul(k.lt, k.op, &one, k.B, k.la, A, k.lb, &zero, D, k.lc, D, k.lc,
                                     &k.heur.algo, k.ws, kWsBytes, k.stream);
  if (st != CUBLAS_STATUS_SUCCESS && k.error.empty())
    k.error = "cublasLtMatmul status " + std::to_string((int)st);
}

void engineGemm(Bench& b, Rank& k, const Shape& s, const void* A, void* D) {
  mk::gemm::GemmArgs g;
  g.M = (int32_t)s.M;
  g.N = (int32_t)s.N;
  g.K = (int32_t)s.K;
  g.A = A;
  g.B = k.B;
  g.bLayout = mk::gemm::BLayout::kNK;
  g.D = D;
  g.smBudget = std::max(1, b.sms / b.n);  // the share the operators give each local rank
  ncclOk(k, mk::gemm::launch(g, k.stream), "mk::gemm::launch");
}

// One call of variant v by rank r on operand set `set`, output in `out` (C or Cref).
void issue(Bench& b, const Shape& s, Variant v, int r, int set, void* out) {
  Rank& k = b.ranks[r];
  const void* A = k.A[set % k.A.size()];
  const size_t cRows = rowsC(s, b.n);
  if (v == kFused || v == kSeq || v == kAuto) {
    ncclFusedConfig_t cfg = NCCL_FUSED_CONFIG_INITIALIZER;
    cfg.outType = ncclBfloat16;
    cfg.algo = v == kFused ? ncclFusedFused : v == kSeq ? ncclFusedSequential : ncclFusedAuto;
    ncclResult_t res = s.op == kAR   ? ncclGemmAllReduce(A, k.B, out, s.M, s.N, s.K, ncclBfloat16,
                                                         &cfg, k.comm, k.stream)
                       : s.op == kAG ? ncclAllGatherGemm(A, k.B, out, nullptr, s.M, s.N, s.K,
                                                         ncclBfloat16, &cfg, k.comm, k.stream)
                                     : ncclGemmReduceScatter(A, k.B, out, s.M, s.N, s.K,
                                                             ncclBfloat16, &cfg, k.comm, k.stream);
    ncclOk(k, res, kVarNames[v]);
    return;
  }
  const bool gemm = v == kCublasColl || v == kGemmEngine || v == kGemmCublas;
  const bool coll = v == kCublasColl || v == kColl;
  if (s.op == kAG && coll)
    ncclOk(k, ncclAllGather(A, k.G, rowsA(s, b.n) * s.K, ncclBfloat16, k.comm, k.stream),
           "ncclAllGather");
  if (gemm) {
    const void* in = s.op == kAG ? k.G : A;
    void* dst = s.op == kRS ? k.T : out;
    if (v == kGemmEngine)
      engineGemm(b, k, s, in, dst);
    else
      cublasGemm(k, in, dst);
  }
  if (s.op == kAR && coll)
    ncclOk(k, ncclAllReduce(out, out, s.M * s.N, ncclBfloat16, ncclSum, k.comm, k.stream),
           "ncclAllReduce");
  if (s.op == kRS && coll)
    ncclOk(k, ncclReduceScatter(k.T, out, cRows * s.N, ncclBfloat16, ncclSum, k.comm, k.stream),
           "ncclReduceScatter");
}

void checkErrors(Bench& b, const std::string& what) {
  for (int r = 0; r < b.n; ++r)
    if (!b.ranks[r].error.empty())
      fatal(what + ", rank " + std::to_string(r) + ": " + b.ranks[r].error);
}

// Times `reps` calls of v (after `warmup`): per rep, max over ranks of start -> rank's stop.
// hostMs: per rep, the slowest rank thread's host time to issue its call. Call it uses operand
// set set0 + it.
std::vector<double> timeVariant(Bench& b, const Shape& s, Variant v, int warmup, int reps,
                                std::vector<double>* hostMs, int set0 = 0) {
  const std::string what = std::string(kOpNames[s.op]) + " " + kVarNames[v];
  collbench::setPhase(kVarNames[v]);
  const int total = warmup + reps;
  if ((int)b.starts.size() < total) {
    for (int i = (int)b.starts.size(); i < total; ++i) {
      cudaEvent_t e;
      FB_CUDA(cudaEventCreate(&e));
      b.starts.push_back(e);
      for (Rank& k : b.ranks) {
        FB_CUDA(cudaEventCreate(&e));
        k.stops.push_back(e);
      }
    }
  }
  const double deadline = nowS() + std::max(120.0, 0.5 * b.o.timeoutS);
  std::vector<double> issueS(b.n, 0.0);
  hostMs->clear();
  for (int it = 0; it < total; ++it) {
    // Stream 0 waits for every rank's previous call, holds until the ranks queued this one
    // (gateKernel, ~2 s at most), then fires the common start.
    if (it > 0)
      for (Rank& k : b.ranks) FB_CUDA(cudaStreamWaitEvent(b.s0, k.stops[it - 1], 0));
    const int want = ++b.gateSeq;
    gateKernel<<<1, 1, 0, b.s0>>>(b.gate, want, 4000000000ll, b.expired);
    FB_CUDA(cudaGetLastError());
    FB_CUDA(cudaEventRecord(b.starts[it], b.s0));
    b.pool->run(
        [&](int r) {
          Rank& k = b.ranks[r];
          const double t0 = nowS();
          if (cudaStreamWaitEvent(k.stream, b.starts[it], 0) != cudaSuccess) k.error = "wait";
          issue(b, s, v, r, set0 + it, k.C);
          if (cudaEventRecord(k.stops[it], k.stream) != cudaSuccess) k.error = "record";
          issueS[r] = nowS() - t0;
        },
        60, what);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    *reinterpret_cast<volatile int*>(b.gate) = want;
    checkErrors(b, what);
    if (it >= warmup) hostMs->push_back(1e3 * *std::max_element(issueS.begin(), issueS.end()));
  }
  // Every call waited for, warm-up included: the next variant's start must find the GPU idle.
  std::vector<double> ms;
  for (int it = 0; it < total; ++it) {
    double worst = 0;
    for (Rank& k : b.ranks) {
      waitEvent(k.stops[it], deadline, what);
      float t = 0;
      FB_CUDA(cudaEventElapsedTime(&t, b.starts[it], k.stops[it]));
      worst = std::max(worst, (double)t);
    }
    if (it >= warmup) ms.push_back(worst);
  }
  return ms;
}

// max |C_v - C_seq| / max |C_seq| of variant v against the sequential path, worst rank.
double compareWithSequential(Bench& b, const Shape& s, Variant v) {
  const std::string what = std::string("check ") + kVarNames[v];
  b.pool->run([&](int r) { issue(b, s, kSeq, r, 0, b.ranks[r].Cref); }, 60, what);
  checkErrors(b, what);
  b.pool->run(
      [&](int r) {
        Rank& k = b.ranks[r];
        if (cudaMemsetAsync(k.C, 0xFF, rowsC(s, b.n) * s.N * 2, k.stream) != cudaSuccess)
          k.error = "memset";
        issue(b, s, v, r, 0, k.C);
      },
      60, what);
  checkErrors(b, what);
  double worst = 0;
  for (Rank& k : b.ranks) {
    FB_CUDA(cudaMemsetAsync(k.diff, 0, 2 * sizeof(float), k.stream));
    diffKernel<<<1024, 256, 0, k.stream>>>((const __nv_bfloat16*)k.C, (const __nv_bfloat16*)k.Cref,
                                           rowsC(s, b.n) * s.N, k.diff);
    FB_CUDA(cudaGetLastError());
    cudaEvent_t e;
    FB_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    FB_CUDA(cudaEventRecord(e, k.stream));
    waitEvent(e, nowS() + 120, what);
    cudaEventDestroy(e);
    float h[2] = {0, 0};
    FB_CUDA(cudaMemcpy(h, k.diff, sizeof(h), cudaMemcpyDeviceToHost));
    worst = std::max(worst, (double)h[0] / std::max((double)h[1], 1e-30));
  }
  return worst;
}

// ---- shapes, results, output ------------------------------------------------------------------
struct Result {
  Shape s;
  bool ran = false;
  std::string note;
  double med[kNumVariants], p10[kNumVariants], p90[kNumVariants];
  double diff[kNumVariants];     // vs sequential (fused, auto, cublas+coll)
  double hostMed[kNumVariants];  // median of the slowest rank thread's host issue time, ms
  double hidden = NAN;
  int sets = 0;
};

void usage(const char* argv0) {
  printf(
      "usage: %s [--ranks 4] [--device 0] [--reps 10] [--warmup 2] [--ops ar,ag,rs] [--full]\n"
      "          [--shapes ar:MxNxK,ag:MxNxK,...] [--out FILE] [--timeout S (900; --full 2400)]\n"
      "          [--blocked]\n",
      argv0);
}

bool parseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) fatal(a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      usage(argv[0]);
      exit(0);
    } else if (a == "--ranks") {
      o->ranks = atoi(next());
    } else if (a == "--device") {
      o->device = atoi(next());
    } else if (a == "--reps") {
      o->reps = atoi(next());
    } else if (a == "--warmup") {
      o->warmup = atoi(next());
    } else if (a == "--ops") {
      o->ops = next();
    } else if (a == "--full") {
      o->full = true;
    } else if (a == "--blocked") {
      o->blocked = true;
    } else if (a == "--shapes") {
      o->shapes = next();
    } else if (a == "--out") {
      o->out = next();
    } else if (a == "--timeout") {
      o->timeoutS = atoi(next());
    } else {
      fprintf(stderr, "fused_bench: unknown option %s\n", a.c_str());
      usage(argv[0]);
      return false;
    }
  }
  if (o->timeoutS == 0) o->timeoutS = o->full ? 2400 : 900;
  return o->ranks >= 1 && o->reps >= 1 && o->warmup >= 0 && o->timeoutS > 0;
}

void runShape(Bench& b, Result& res) {
  const Shape& s = res.s;
  const int n = b.n;
  if ((s.op != kAR && s.M % n) || s.K % 8) {
    res.note = "skipped: M must be a multiple of the ranks (AG, RS) and K of 8";
    return;
  }
  const double bytesA = rowsA(s, n) * s.K * 2.0, bytesB = s.N * s.K * 2.0;
  const int sets = std::max(2, std::min(8, (int)std::ceil(3.0 * b.l2 / (bytesA + bytesB))));
  const double need = sets * bytesA + bytesB + 2.0 * rowsC(s, n) * s.N * 2 +
                      (s.op == kAG ? s.M * s.K * 2.0 : 0) + (s.op == kRS ? s.M * s.N * 2.0 : 0);
  size_t freeB = 0, totalB = 0;
  FB_CUDA(cudaMemGetInfo(&freeB, &totalB));
  if (need * n > 0.9 * freeB) {
    char buf[128];
    snprintf(buf, sizeof(buf), "skipped: needs %.1f GiB, %.1f GiB free", need * n / 1073741824.0,
             freeB / 1073741824.0);
    res.note = buf;
    return;
  }
  res.sets = sets;
  static std::string phase;
  phase = std::string("setup ") + kOpNames[s.op];
  collbench::setPhase(phase.c_str());
  b.pool->run([&](int r) { setupShape(b, s, r, sets); }, 120, phase);
  FB_CUDA(cudaDeviceSynchronize());
  for (int v = 0; v < kNumVariants; ++v) res.diff[v] = NAN;
  for (Variant v : {kFused, kAuto, kCublasColl}) res.diff[v] = compareWithSequential(b, s, v);
  const Variant order[] = {kGemmEngine, kGemmCublas, kColl, kSeq, kFused, kAuto, kCublasColl};
  // Interleaved by default: the H200's clocks drift under minutes of GEMMs (session 25's
  // traces: a fused kernel's GEMM took ~10% longer in later calls than in the first), and a
  // variant timed in one block after the others would carry that drift into its ratios.
  std::vector<double> host[kNumVariants], t[kNumVariants];
  if (b.o.blocked) {
    for (Variant v : order) t[v] = timeVariant(b, s, v, b.o.warmup, b.o.reps, &host[v]);
  } else {
    for (Variant v : order) timeVariant(b, s, v, b.o.warmup, 0, &host[v]);  // warm-up round(s)
    for (int rep = 0; rep < b.o.reps; ++rep) {
      for (Variant v : order) {
        std::vector<double> h;
        const std::vector<double> one = timeVariant(b, s, v, 0, 1, &h, b.o.warmup + rep);
        t[v].insert(t[v].end(), one.begin(), one.end());
        host[v].insert(host[v].end(), h.begin(), h.end());
      }
    }
  }
  for (Variant v : order) {
    res.hostMed[v] = collbench::median(host[v]);
    res.med[v] = collbench::median(t[v]);
    res.p10[v] = collbench::quantile(t[v], 0.1);
    res.p90[v] = collbench::quantile(t[v], 0.9);
  }
  const double tg = res.med[kGemmEngine], tc = res.med[kColl];
  res.hidden = (tg + tc - res.med[kFused]) / std::min(tg, tc);
  res.ran = true;
  FB_CUDA(cudaDeviceSynchronize());
  b.pool->run([&](int r) { teardownShape(b.ranks[r]); }, 120, "teardown");
  printf(
      "# %-18s %6zux%6zux%6zu %-7s fused %8.3f ms  seq %8.3f  auto %8.3f  cublas+coll %8.3f  "
      "gemm %8.3f  coll %8.3f  hidden %5.1f%%  diff %.1e\n",
      kOpNames[s.op], s.M, s.N, s.K, s.tag.c_str(), res.med[kFused], res.med[kSeq], res.med[kAuto],
      res.med[kCublasColl], tg, tc, 100 * res.hidden, res.diff[kFused]);
  printf(
      "#   host issue ms (slowest rank thread, median): fused %.3f seq %.3f auto %.3f "
      "engine %.3f coll %.3f\n",
      res.hostMed[kFused], res.hostMed[kSeq], res.hostMed[kAuto], res.hostMed[kGemmEngine],
      res.hostMed[kColl]);
}

void writeJson(const Bench& b, const std::vector<Result>& results, const std::string& cmd,
               const std::string& commit, bool dirty, const std::string& date,
               const cudaDeviceProp& prop, const std::vector<std::string>& failures,
               const std::string& path) {
  Json j;
  j.beginObject();
  j.str("benchmark", "fused_bench").str("command", cmd).str("git_commit", commit);
  j.boolean("git_dirty", dirty).str("date", date);
  j.beginObject("device");
  j.integer("index", b.o.device)
      .str("name", prop.name)
      .integer("sm_count", prop.multiProcessorCount);
  j.integer("l2_bytes", prop.l2CacheSize).endObject();
  j.integer("ranks", b.n).str("layout", "ranks sharing one GPU as threads (ncclCommInitAll)");
  j.str("dtype", "bf16 in/out, fp32 accumulation, B as [N,K]");
  j.integer("reps", b.o.reps).integer("warmup", b.o.warmup);
  j.str("order", b.o.blocked ? "blocked: each variant's warm-up and reps in turn"
                             : "interleaved: every variant's warm-up, then per rep one call of "
                               "each variant in turn");
  j.str("time",
        "per call, median over reps of max over ranks (common start event -> rank's stop); the "
        "start fires once every rank thread has queued its call (host issue apart: "
        "host_issue_ms)");
  j.integer("start_gates_expired", *b.expired);
  j.str("tflops", "per rank: 2*M*N*K / time");
  j.str("hidden", "(T_gemm_engine + T_coll - T_fused) / min(T_gemm_engine, T_coll)");
  j.beginArray("results");
  for (const Result& r : results) {
    j.beginObject();
    j.str("op", kOpNames[r.s.op]).integer("M", r.s.M).integer("N", r.s.N).integer("K", r.s.K);
    j.str("shape_tag", r.s.tag).boolean("ran", r.ran).str("note", r.note);
    if (r.ran) {
      j.integer("operand_sets", r.sets);
      j.beginObject("time_ms");
      for (int v = 0; v < kNumVariants; ++v) {
        j.beginObject(kVarNames[v]).num("median", r.med[v]).num("p10", r.p10[v]);
        j.num("p90", r.p90[v]).endObject();
      }
      j.endObject().beginObject("tflops_per_rank");
      for (int v = 0; v < kNumVariants; ++v)
        if (v != kColl) j.num(kVarNames[v], tflops(r.s, r.med[v]));
      j.endObject();
      j.num("hidden", r.hidden).num("fused_over_gemm_engine", r.med[kFused] / r.med[kGemmEngine]);
      j.num("fused_over_sequential", r.med[kFused] / r.med[kSeq]);
      j.num("auto_over_sequential", r.med[kAuto] / r.med[kSeq]);
      j.num("fused_over_cublas_coll", r.med[kFused] / r.med[kCublasColl]);
      j.beginObject("host_issue_ms");
      for (int v = 0; v < kNumVariants; ++v) j.num(kVarNames[v], r.hostMed[v]);
      j.endObject();
      j.beginObject("max_abs_diff_over_max_abs_vs_sequential");
      for (Variant v : {kFused, kAuto, kCublasColl}) j.num(kVarNames[v], r.diff[v]);
      j.endObject();
      j.null("split").null("model");
    }
    j.endObject();
  }
  j.endArray();
  j.beginArray("failures");
  for (const std::string& f : failures) j.str(nullptr, f);
  j.endArray().endObject();
  FILE* f = fopen(path.c_str(), "w");
  if (f == nullptr) fatal("cannot write " + path);
  fprintf(f, "%s\n", j.text().c_str());
  fclose(f);
  printf("# results written to %s\n", path.c_str());
}

void printTable(const std::vector<Result>& results, int n) {
  printf(
      "\n| op | M x N x K | fused ms | seq ms | auto ms | cuBLAS+coll ms | GEMM eng ms | "
      "GEMM cuBLAS ms | coll ms | hidden | fused TF/s/rank | fused/GEMM | auto/seq |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Result& r : results) {
    if (!r.ran) {
      printf("| %s | %zux%zux%zu %s | %s |\n", kOpNames[r.s.op], r.s.M, r.s.N, r.s.K,
             r.s.tag.c_str(), r.note.c_str());
      continue;
    }
    printf(
        "| %s | %zux%zux%zu %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.0f%% | "
        "%.0f | %.3f | %.3f |\n",
        kOpNames[r.s.op], r.s.M, r.s.N, r.s.K, r.s.tag.c_str(), r.med[kFused], r.med[kSeq],
        r.med[kAuto], r.med[kCublasColl], r.med[kGemmEngine], r.med[kGemmCublas], r.med[kColl],
        100 * r.hidden, tflops(r.s, r.med[kFused]), r.med[kFused] / r.med[kGemmEngine],
        r.med[kAuto] / r.med[kSeq]);
  }
  printf(
      "(%d ranks sharing one GPU; times per call; targets: hidden >= 70%% at the large shapes, "
      "fused/GEMM <= 1.10 where coll < GEMM, auto/seq <= 1.02)\n",
      n);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parseArgs(argc, argv, &o)) return 2;
  setvbuf(stdout, nullptr, _IOLBF, 0);
  collbench::armWatchdog(o.timeoutS);
  const std::string cmd = benchargs::commandLine(argc, argv);
  const std::string srcDir = collbench::dirName(__FILE__);
  bool dirty = false;
  const std::string commit = collbench::benchCommit(srcDir, &dirty);
  const std::string date = collbench::timeStamp("%Y-%m-%dT%H:%M:%S%z");

  std::vector<Shape> shapes;
  if (!o.shapes.empty()) {
    if (!parseShapes(o.shapes, &shapes))
      fatal("--shapes: expected op:MxNxK[,...] with op ar|ag|rs");
  } else {
    shapes = filterOps(defaultShapes(o.full), o.ops);
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("fused_bench: no CUDA device visible; nothing to measure\n");
    return 1;
  }
  if (o.device >= ndev)
    fatal("device " + std::to_string(o.device) + " requested, " + std::to_string(ndev) +
          " visible");
  FB_CUDA(cudaSetDevice(o.device));
  cudaDeviceProp prop;
  FB_CUDA(cudaGetDeviceProperties(&prop, o.device));
  printf("# fused_bench: %s\n# commit %s%s, %s\n# device %d: %s, %d SMs, L2 %d MiB; %d ranks\n",
         cmd.c_str(), commit.c_str(), dirty ? " (dirty tree)" : "", date.c_str(), o.device,
         prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, o.ranks);

  Bench b;
  b.o = o;
  b.n = o.ranks;
  b.sms = prop.multiProcessorCount;
  b.l2 = prop.l2CacheSize;
  b.ranks.resize(b.n);
  collbench::setPhase("ncclCommInitAll");
  std::vector<ncclComm_t> comms(b.n);
  std::vector<int> devs(b.n, o.device);
  ncclResult_t res = ncclCommInitAll(comms.data(), b.n, devs.data());
  if (res != ncclSuccess)
    fatal(std::string("ncclCommInitAll: ") + ncclGetErrorString(res) + ": " +
          ncclGetLastError(nullptr));
  FB_CUDA(cudaStreamCreateWithFlags(&b.s0, cudaStreamNonBlocking));
  FB_CUDA(cudaHostAlloc(&b.gate, 2 * sizeof(int), cudaHostAllocMapped));
  b.gate[0] = b.gate[1] = 0;
  b.expired = b.gate + 1;
  RankPool pool(b.n, o.device);
  b.pool = &pool;
  pool.run(
      [&](int r) {
        Rank& k = b.ranks[r];
        k.comm = comms[r];
        FB_CUDA(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking));
        FB_BLAS(cublasLtCreate(&k.lt));
        FB_CUDA(cudaMalloc(&k.ws, kWsBytes));
      },
      120, "rank setup");

  std::vector<Result> results;
  std::vector<std::string> failures;
  for (const Shape& s : shapes) {
    Result r;
    r.s = s;
    runShape(b, r);
    for (Variant v : {kFused, kAuto, kCublasColl})
      if (r.ran && !(r.diff[v] <= 0.05)) {
        char buf[200];
        snprintf(buf, sizeof(buf),
                 "%s %zux%zux%zu: %s differs from sequential (max|diff|/max|C| %.3g)",
                 kOpNames[s.op], s.M, s.N, s.K, kVarNames[v], r.diff[v]);
        failures.push_back(buf);
      }
    results.push_back(r);
  }

  collbench::setPhase("teardown");
  pool.run(
      [&](int r) {
        Rank& k = b.ranks[r];
        cudaFree(k.ws);
        cublasLtDestroy(k.lt);
        for (cudaEvent_t e : k.stops) cudaEventDestroy(e);
        cudaStreamDestroy(k.stream);
      },
      120, "rank teardown");
  for (ncclComm_t c : comms) ncclCommDestroy(c);

  std::string out = o.out;
  if (out.empty()) {
    std::string dir = srcDir + "/results";
    if (!collbench::makeDirs(dir)) dir = ".";
    out = dir + "/fused_" + collbench::timeStamp("%Y-%m-%d_%H%M%S") + ".json";
  } else {
    collbench::makeDirs(collbench::dirName(out));
  }
  if (*b.expired != 0)
    printf("# %d start gates expired: those calls' times include the ranks' host issue\n",
           *b.expired);
  writeJson(b, results, cmd, commit, dirty, date, prop, failures, out);
  printTable(results, b.n);
  for (const std::string& f : failures) printf("# FAIL %s\n", f.c_str());
  printf("fused_bench: %s\n", failures.empty() ? "OK" : "FAIL");
  cudaFreeHost(b.gate);  // after its last reader above (expired)
  for (cudaEvent_t e : b.starts) cudaEventDestroy(e);
  cudaStreamDestroy(b.s0);
  alarm(0);
  return failures.empty() ? 0 : 1;
}
