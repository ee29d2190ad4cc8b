// Issue 12's fused benchmark, mode (b): ranks as processes (one per rank, on one GPU under
// MPS; bench/procs_harness.h forks them and each loads the library under test with dlopen)
// running the fused GEMM + collective calls, against cuBLAS + the collective. Run by
// bench/fused_vs_nccl.sh: once on libmkernel.so (MKERNEL_EMULATE_NODES=2, variants auto,
// fused, sequential: ncclGemmAllReduce etc. looked up with dlsym) and once on the real
// libnccl.so.2 (one NCCL_HOSTID per process, NCCL_NET=Socket; variant cublas+coll).
//   cublas+coll  GemmAllReduce:     cublasGemmEx -> C, ncclAllReduce(C, C) in place
//                AllGatherGemm:     ncclAllGather(Ashard -> G), cublasGemmEx(G) -> C
//                GemmReduceScatter: cublasGemmEx -> T [M,N], ncclReduceScatter(T -> Cshard)
// bf16 in and out, fp32 accumulation, A [M,K] row-major times B [N,K]^T (mkernel's layout).
// The shapes are fused_bench's (fused_shapes.cuh).
//
// Check before timing, on every rank and every element: each process regenerates every
// rank's operands from the seed (the same in both runs, so both libraries get the same
// inputs) and computes the reference with cuBLAS: per-rank products in fp32, summed over the
// ranks in fp32 (what cuBLAS + the collective computes, without its roundings). Tolerance as
// tests/gpu/test_fused_util.cuh, with absRef = sum_r |A_r B_r| (fp32 products, one per rank):
// |got - ref| <= (n + 2) u absRef + 2 K n 2^-24 (AllGatherGemm: 2 u), u = 2^-8 (bf16); the
// second K n 2^-24 covers the reference's own fp32 accumulation. Mismatches are counted.
//
// Timing (as fused_bench): per variant, warm-up calls, then per rep a barrier of the rank
// processes, a start event, the call, a stop event; a rep's time is the slowest rank's, the
// result the median over reps (per-rank medians are kept too). TFLOP/s per rank: 2MNK / time.
// Each check and timing phase writes a marker line to stderr ("fused_procs_bench: mark ...")
// so the library's NCCL_DEBUG_SUBSYS=FUSED lines in the same log can be attributed.
//
//   bench_fused_procs_bench --lib PATH [--nprocs 2] [--ranks-per-node 1]
//       [--variants auto,fused,sequential|cublas+coll] [--set quick|default|full]
//       [--ops ar,ag,rs] [--shapes ar:MxNxK,...] [--reps 5] [--warmup 1] [--seed 1]
//       [--rank-env NAME=VALUE]... [--label TEXT] [--out FILE.json] [--timeout-s 420]
//       [--budget-s S] (no new shape is started after S seconds; the rest is "not reached")
// Exit status 0 only if every rank finished and every element of every check passed.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "coll_bench_util.h"
#include "bench_args.h"
#include "fused_shapes.cuh"
#include "mkernel/fused.h"
#include "procs_harness.h"

using namespace procs;       // NOLINT: the process harness
using namespace fusedbench;  // NOLINT: shapes, operators, fill

namespace {

constexpr int kMaxShapes = 48, kMaxVariants = 4, kMaxReps = 32;
enum Variant { kAuto = 0, kFused = 1, kSeq = 2, kCublasColl = 3 };
const char* const kVarNames[kMaxVariants] = {"auto", "fused", "sequential", "cublas+coll"};

// ---- shared results (after the harness's Control block) -----------------------------------
struct VarRes {
  double ms[kMaxReps][kMaxRanks];  // per rep, per rank: start -> stop event
  unsigned long long wrong[kMaxRanks];
  float worst[kMaxRanks];  // max |got - ref| / tolerance (> 1: a mismatch)
  int checked[kMaxRanks], timedReps;
};
struct ShapeRes {
  int state;  // 0 not reached, 1 ran, 2 skipped (note says why)
  char note[160];
  VarRes v[kMaxVariants];
};
struct Payload {
  volatile int stop;
  int skip[kMaxShapes];
  char skipNote[kMaxShapes][160];
  ShapeRes shapes[kMaxShapes];
};
Payload* gp = nullptr;

struct Opts {
  std::string lib, label, out, set = "default", ops = "ar,ag,rs", shapes;
  int nprocs = 2, ranksPerNode = 1, reps = 5, warmup = 1;
  uint64_t seed = 1;
  double timeoutS = 420, budgetS = 0;
  std::vector<int> variants = {kAuto, kFused, kSeq};
  std::vector<std::string> rankEnv;
};

// ---- the library's fused entry points (libmkernel only) ---------------------------------
struct FusedApi {
  decltype(&ncclGemmAllReduce) gemmAllReduce = nullptr;
  decltype(&ncclAllGatherGemm) allGatherGemm = nullptr;
  decltype(&ncclGemmReduceScatter) gemmReduceScatter = nullptr;
} fapi;

void loadFused(const char* path) {
  fapi.gemmAllReduce =
      reinterpret_cast<decltype(fapi.gemmAllReduce)>(dlsym(api.handle, "ncclGemmAllReduce"));
  fapi.allGatherGemm =
      reinterpret_cast<decltype(fapi.allGatherGemm)>(dlsym(api.handle, "ncclAllGatherGemm"));
  fapi.gemmReduceScatter = reinterpret_cast<decltype(fapi.gemmReduceScatter)>(
      dlsym(api.handle, "ncclGemmReduceScatter"));
  if (!fapi.gemmAllReduce || !fapi.allGatherGemm || !fapi.gemmReduceScatter)
    fail(
        "%s has no fused entry points (ncclGemmAllReduce etc.): the fused variants need "
        "libmkernel.so",
        path);
}

#define BK(call)                                                                   \
  do {                                                                             \
    cublasStatus_t s_ = (call);                                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS) fail("%s: cuBLAS status %d", #call, (int)s_); \
  } while (0)

// ---- device helpers ---------------------------------------------------------------------
__global__ void accumulateKernel(const float* p, float* ref, float* absRef, size_t n, int first) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const float x = p[i];
    ref[i] = first ? x : ref[i] + x;
    absRef[i] = first ? fabsf(x) : absRef[i] + fabsf(x);
  }
}

// out->wrong: elements with |got - ref| > tol * absRef + atol (NaN included); out->worst: the
// largest |got - ref| / (tol * absRef + atol) (non-negative floats compare as ints).
struct CheckOut {
  unsigned long long wrong;
  float worst;
};
__global__ void checkKernel(const __nv_bfloat16* got, const float* ref, const float* absRef,
                            size_t n, float tol, float atol, CheckOut* out) {
  unsigned long long wrong = 0;
  float worst = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const float bound = tol * absRef[i] + atol;
    const float d = fabsf(__bfloat162float(got[i]) - ref[i]);
    const float r = d == d ? d / bound : 1e30f;
    if (!(d <= bound)) wrong++;
    worst = fmaxf(worst, r);
  }
  if (wrong) atomicAdd(&out->wrong, wrong);
  atomicMax(reinterpret_cast<int*>(&out->worst), __float_as_int(worst));
}

// ---- one shape on one rank --------------------------------------------------------------
struct Ctx {
  const Opts* o;
  ncclComm_t comm;
  cudaStream_t s;
  cublasHandle_t blas;
};

struct Bufs {
  __nv_bfloat16 *A = nullptr, *B = nullptr;  // AR, RS: every rank's A_r, B_r; AG: full A, my B
  __nv_bfloat16 *C = nullptr, *G = nullptr, *T = nullptr;
  float *ref = nullptr, *absRef = nullptr, *P = nullptr;
  CheckOut* chk = nullptr;
};

// row-major D [rows,N] = A [rows,K] * B [N,K]^T, fp32 accumulation (column-major view:
// D^T = B^T-op * A^T).
void gemm(Ctx& c, const Shape& s, const void* A, const void* B, void* D, size_t rows,
          cudaDataType_t dType) {
  const float one = 1.0f, zero = 0.0f;
  BK(cublasGemmEx(c.blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)s.N, (int)rows, (int)s.K, &one, B,
                  CUDA_R_16BF, (int)s.K, A, CUDA_R_16BF, (int)s.K, &zero, D, dType, (int)s.N,
                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

uint64_t seedA(const Opts& o, int shape, int r) {
  return o.seed * 1000003ull + (uint64_t)shape * 1000 + (uint64_t)r * 10 + 1;
}
uint64_t seedB(const Opts& o, int shape, int r) {
  return o.seed * 1000003ull + (uint64_t)shape * 1000 + (uint64_t)r * 10 + 2;
}

size_t bytesNeeded(const Shape& s, int n, const std::vector<int>& variants) {
  const size_t e = 2, cN = rowsC(s, n) * s.N;
  size_t b = (s.op == kAG ? s.M * s.K : (size_t)n * s.M * s.K) * e;  // A
  b += (s.op == kAG ? 1 : (size_t)n) * s.N * s.K * e;                // B
  b += cN * e + 3 * cN * 4;                                          // C, ref, absRef, P
  if (s.op == kAG) b += s.M * s.K * e;  // G (cublas+coll), or the library's gather buffer
  if (s.op == kRS) b += s.M * s.N * e;  // T (cublas+coll; the library has its own partials)
  (void)variants;
  return b;
}

void setup(Ctx& c, const Shape& s, int si, Bufs& b) {
  const int n = gN, me = gRank;
  const Opts& o = *c.o;
  const size_t cN = rowsC(s, n) * s.N;
  const int nA = s.op == kAG ? 1 : n, nB = s.op == kAG ? 1 : n;
  CK(cudaMalloc(&b.A, (size_t)nA * s.M * s.K * 2));
  CK(cudaMalloc(&b.B, (size_t)nB * s.N * s.K * 2));
  CK(cudaMalloc(&b.C, cN * 2));
  CK(cudaMalloc(&b.ref, cN * 4));
  CK(cudaMalloc(&b.absRef, cN * 4));
  CK(cudaMalloc(&b.P, cN * 4));
  CK(cudaMalloc(&b.chk, sizeof(CheckOut)));
  if (s.op == kAG) CK(cudaMalloc(&b.G, s.M * s.K * 2));
  if (s.op == kRS) CK(cudaMalloc(&b.T, s.M * s.N * 2));
  if (s.op == kAG) {
    fillKernel<<<1024, 256, 0, c.s>>>(b.A, s.M * s.K, seedA(o, si, 0));
    fillKernel<<<1024, 256, 0, c.s>>>(b.B, s.N * s.K, seedB(o, si, me));
  } else {
    for (int r = 0; r < n; r++) {
      fillKernel<<<1024, 256, 0, c.s>>>(b.A + (size_t)r * s.M * s.K, s.M * s.K, seedA(o, si, r));
      fillKernel<<<1024, 256, 0, c.s>>>(b.B + (size_t)r * s.N * s.K, s.N * s.K, seedB(o, si, r));
    }
  }
  CK(cudaGetLastError());
  // The reference: AR every rank's product; RS every rank's product, my rows only; AG the
  // product of the full A with my B.
  const int terms = s.op == kAG ? 1 : n;
  for (int r = 0; r < terms; r++) {
    const __nv_bfloat16* A = b.A + (size_t)r * s.M * s.K;
    if (s.op == kRS) A += (size_t)me * (s.M / n) * s.K;
    const __nv_bfloat16* B = b.B + (size_t)r * s.N * s.K;
    gemm(c, s, A, B, b.P, rowsC(s, n), CUDA_R_32F);
    accumulateKernel<<<1024, 256, 0, c.s>>>(b.P, b.ref, b.absRef, cN, r == 0);
    CK(cudaGetLastError());
  }
  CK(cudaStreamSynchronize(c.s));
}

void teardown(Bufs& b) {
  for (void* p : {(void*)b.A, (void*)b.B, (void*)b.C, (void*)b.G, (void*)b.T, (void*)b.ref,
                  (void*)b.absRef, (void*)b.P, (void*)b.chk})
    if (p) CK(cudaFree(p));
  b = Bufs();
}

void issue(Ctx& c, const Shape& s, int v, Bufs& b) {
  const int n = gN, me = gRank;
  const bool ag = s.op == kAG;
  const __nv_bfloat16* myA = ag ? b.A + (size_t)me * (s.M / n) * s.K : b.A + (size_t)me * s.M * s.K;
  const __nv_bfloat16* myB = ag ? b.B : b.B + (size_t)me * s.N * s.K;
  if (v != kCublasColl) {
    ncclFusedConfig_t cfg = NCCL_FUSED_CONFIG_INITIALIZER;
    cfg.outType = ncclBfloat16;
    cfg.algo = v == kFused ? ncclFusedFused : v == kSeq ? ncclFusedSequential : ncclFusedAuto;
    if (s.op == kAR)
      NK(fapi.gemmAllReduce(myA, myB, b.C, s.M, s.N, s.K, ncclBfloat16, &cfg, c.comm, c.s));
    else if (ag)
      NK(fapi.allGatherGemm(myA, myB, b.C, nullptr, s.M, s.N, s.K, ncclBfloat16, &cfg, c.comm,
                            c.s));
    else
      NK(fapi.gemmReduceScatter(myA, myB, b.C, s.M, s.N, s.K, ncclBfloat16, &cfg, c.comm, c.s));
    return;
  }
  if (s.op == kAR) {
    gemm(c, s, myA, myB, b.C, s.M, CUDA_R_16BF);
    NK(api.allReduce(b.C, b.C, s.M * s.N, ncclBfloat16, ncclSum, c.comm, c.s));
  } else if (ag) {
    NK(api.allGather(myA, b.G, (s.M / n) * s.K, ncclBfloat16, c.comm, c.s));
    gemm(c, s, b.G, myB, b.C, s.M, CUDA_R_16BF);
  } else {
    gemm(c, s, myA, myB, b.T, s.M, CUDA_R_16BF);
    NK(api.reduceScatter(b.T, b.C, (s.M / n) * s.N, ncclBfloat16, ncclSum, c.comm, c.s));
  }
}

void mark(const Shape& s, int si, int v, const char* what) {
  fprintf(stderr,
          "fused_procs_bench: mark pid=%d rank=%d shape=%d op=%s M=%zu N=%zu K=%zu "
          "variant=%s phase=%s\n",
          (int)getpid(), gRank, si, kOpNames[s.op], s.M, s.N, s.K, kVarNames[v], what);
  fflush(stderr);
}

void runShape(Ctx& c, const Shape& s, int si) {
  const Opts& o = *c.o;
  ShapeRes& res = gp->shapes[si];
  Bufs b;
  setPhase("%s %zux%zux%zu: setup and reference", kOpNames[s.op], s.M, s.N, s.K);
  setup(c, s, si, b);
  const double u = 1.0 / 256;
  const float tol = (float)((s.op == kAG ? 2 : gN + 2) * u);
  const float atol = (float)(2.0 * s.K * gN / (1 << 24));
  const size_t cN = rowsC(s, gN) * s.N;
  for (int v : o.variants) {
    setPhase("%s %zux%zux%zu %s: check", kOpNames[s.op], s.M, s.N, s.K, kVarNames[v]);
    mark(s, si, v, "check");
    CK(cudaMemsetAsync(b.C, 0xff, cN * 2, c.s));  // NaN poison
    CK(cudaMemsetAsync(b.chk, 0, sizeof(CheckOut), c.s));
    CK(cudaStreamSynchronize(c.s));
    barrier();
    issue(c, s, v, b);
    waitStream(c.s, c.comm);
    checkKernel<<<1024, 256, 0, c.s>>>(b.C, b.ref, b.absRef, cN, tol, atol, b.chk);
    CK(cudaGetLastError());
    CheckOut h{};
    CK(cudaMemcpyAsync(&h, b.chk, sizeof(h), cudaMemcpyDeviceToHost, c.s));
    CK(cudaStreamSynchronize(c.s));
    res.v[v].wrong[gRank] = h.wrong;
    res.v[v].worst[gRank] = h.worst;
    res.v[v].checked[gRank] = 1;
    if (h.wrong)
      fprintf(stderr,
              "fused_procs_bench: rank %d %s %zux%zux%zu %s: %llu of %zu elements outside the "
              "tolerance (worst |diff|/tol %.3g)\n",
              gRank, kOpNames[s.op], s.M, s.N, s.K, kVarNames[v], h.wrong, cN, h.worst);
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int v : o.variants) {
    setPhase("%s %zux%zux%zu %s: warm-up and %d reps", kOpNames[s.op], s.M, s.N, s.K, kVarNames[v],
             o.reps);
    mark(s, si, v, "time");
    for (int i = 0; i < o.warmup; i++) issue(c, s, v, b);
    waitStream(c.s, c.comm);
    for (int rep = 0; rep < o.reps; rep++) {
      barrier();
      CK(cudaEventRecord(e0, c.s));
      issue(c, s, v, b);
      CK(cudaEventRecord(e1, c.s));
      waitStream(c.s, c.comm);
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      res.v[v].ms[rep][gRank] = ms;
    }
    if (gRank == 0) res.v[v].timedReps = o.reps;
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  barrier();  // every rank is done with the buffers its peers' calls read
  teardown(b);
  if (gRank == 0) res.state = 1;
}

void rankMain(const Opts& o, const std::vector<Shape>& shapes) {
  setupRank(o.rankEnv, o.ranksPerNode, {});
  setPhase("loading %s", o.lib.c_str());
  loadApi(o.lib.c_str());
  bool fusedVariants = false;
  for (int v : o.variants) fusedVariants |= v != kCublasColl;
  if (fusedVariants) loadFused(o.lib.c_str());
  setPhase("CUDA initialisation on device 0");
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  Ctx c;
  c.o = &o;
  CK(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking));
  BK(cublasCreate(&c.blas));
  BK(cublasSetStream(c.blas, c.s));
  c.comm = initComm();
  for (size_t si = 0; si < shapes.size(); si++) {
    const Shape& s = shapes[si];
    if (gRank == 0) {  // rank 0 decides for all: the budget, the shape's rules, the memory
      gp->skip[si] = 0;
      if (o.budgetS > 0 && nowSec() - gStart > o.budgetS) gp->stop = 1;
      size_t freeB = 0, totalB = 0;
      CK(cudaMemGetInfo(&freeB, &totalB));
      const double need = (double)bytesNeeded(s, gN, o.variants) * gN;
      if (s.op != kAR && s.M % gN)
        snprintf(gp->skipNote[si], 160, "skipped: M %% ranks != 0");
      else if (s.K % 8)
        snprintf(gp->skipNote[si], 160, "skipped: K %% 8 != 0");
      else if (need > 0.8 * freeB)
        snprintf(gp->skipNote[si], 160, "skipped: needs %.1f GiB, %.1f GiB free",
                 need / 1073741824.0, freeB / 1073741824.0);
      gp->skip[si] = gp->skipNote[si][0] != 0;
    }
    barrier();
    if (gp->stop) break;
    if (gp->skip[si]) {
      if (gRank == 0) {
        gp->shapes[si].state = 2;
        snprintf(gp->shapes[si].note, 160, "%s", gp->skipNote[si]);
      }
      continue;
    }
    runShape(c, s, (int)si);
  }
  setPhase("teardown");
  barrier();
  NK(api.commDestroy(c.comm));
  BK(cublasDestroy(c.blas));
  CK(cudaStreamDestroy(c.s));
  setPhase("done");
}

// ---- report -----------------------------------------------------------------------------
std::string report(const Opts& o, const std::vector<Shape>& shapes, const std::string& cmd, bool ok,
                   unsigned long long* totalWrong) {
  collbench::Json j;
  j.beginObject();
  j.str("label", o.label).str("command", cmd).str("library", o.lib).str("version", g->version);
  j.integer("nprocs", o.nprocs).integer("ranks_per_node", o.ranksPerNode);
  j.boolean("ranks_finished", ok);
  j.integer("reps", o.reps).integer("warmup", o.warmup).integer("seed", (long long)o.seed);
  j.str("time", "per call: median over reps of the slowest rank's start->stop event time");
  j.str("tflops", "per rank: 2*M*N*K / time");
  j.str("check",
        "|got - ref| <= (n+2)*2^-8*sum_r|A_r B_r| + 2*K*n*2^-24 (AG: 2*2^-8), ref = "
        "cuBLAS fp32 products of every rank's regenerated operands, summed in fp32");
  j.beginArray("variants");
  for (int v : o.variants) j.str(nullptr, kVarNames[v]);
  j.endArray();
  printf("# %s: %d processes, library %s (version %s)\n", o.label.c_str(), o.nprocs, o.lib.c_str(),
         g->version);
  j.beginArray("shapes");
  for (size_t si = 0; si < shapes.size(); si++) {
    const Shape& s = shapes[si];
    const ShapeRes& r = gp->shapes[si];
    j.beginObject();
    j.str("op", kOpNames[s.op]).integer("M", s.M).integer("N", s.N).integer("K", s.K);
    j.str("shape_tag", s.tag);
    j.str("state", r.state == 1 ? "ran" : r.state == 2 ? "skipped" : "not reached");
    j.str("note", r.note);
    j.beginObject("variants");
    for (int v : o.variants) {
      const VarRes& x = r.v[v];
      bool checked = true;
      for (int k = 0; k < o.nprocs; k++) checked &= x.checked[k] != 0;
      if (!checked) continue;
      j.beginObject(kVarNames[v]);
      unsigned long long wrong = 0;
      float worst = 0;
      j.beginArray("wrong_per_rank");
      for (int k = 0; k < o.nprocs; k++) {
        j.integer(nullptr, (long long)x.wrong[k]);
        wrong += x.wrong[k];
        worst = std::max(worst, x.worst[k]);
      }
      j.endArray().integer("wrong", (long long)wrong).num("worst_err_over_tol", worst);
      *totalWrong += wrong;
      if (x.timedReps > 0) {
        std::vector<double> slowest;
        for (int rep = 0; rep < x.timedReps; rep++) {
          double w = 0;
          for (int k = 0; k < o.nprocs; k++) w = std::max(w, x.ms[rep][k]);
          slowest.push_back(w);
        }
        const double m = collbench::median(slowest);
        j.num("median_ms", m).num("p10_ms", collbench::quantile(slowest, 0.1));
        j.num("p90_ms", collbench::quantile(slowest, 0.9)).num("tflops_per_rank", tflops(s, m));
        j.beginArray("reps_ms");
        for (double t : slowest) j.num(nullptr, t);
        j.endArray().beginArray("per_rank_median_ms");
        std::vector<double> rankMed;
        for (int k = 0; k < o.nprocs; k++) {
          std::vector<double> t;
          for (int rep = 0; rep < x.timedReps; rep++) t.push_back(x.ms[rep][k]);
          rankMed.push_back(collbench::median(t));
          j.num(nullptr, rankMed.back());
        }
        j.endArray().beginArray("per_rank_tflops");
        for (double t : rankMed) j.num(nullptr, tflops(s, t));
        j.endArray();
        printf("  %-18s %6zux%6zux%6zu %-4s %-11s %10.3f ms %8.2f TF/s/rank  wrong %llu\n",
               kOpNames[s.op], s.M, s.N, s.K, s.tag.c_str(), kVarNames[v], m, tflops(s, m), wrong);
      }
      j.endObject();
    }
    j.endObject().endObject();
    if (r.state != 1)
      printf("  %-18s %6zux%6zux%6zu %-4s %s\n", kOpNames[s.op], s.M, s.N, s.K, s.tag.c_str(),
             r.state == 2 ? r.note : "not reached (budget or an earlier failure)");
  }
  j.endArray().integer("wrong_total", (long long)*totalWrong).endObject();
  return j.text() + "\n";
}

[[noreturn]] void usage(const char* why) {
  fprintf(stderr,
          "fused_procs_bench: %s\n(see the comment at the top of bench/fused_procs_bench.cu)\n",
          why);
  exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  const std::string cmd = benchargs::commandLine(argc, argv);
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--lib")
      o.lib = val();
    else if (a == "--nprocs")
      o.nprocs = atoi(val());
    else if (a == "--ranks-per-node")
      o.ranksPerNode = atoi(val());
    else if (a == "--variants") {
      o.variants.clear();
      for (const std::string& name : benchargs::splitList(val())) {
        int v = -1;
        for (int k = 0; k < kMaxVariants; k++)
          if (name == kVarNames[k]) v = k;
        if (v < 0) usage(("unknown variant " + name).c_str());
        o.variants.push_back(v);
      }
    } else if (a == "--set")
      o.set = val();
    else if (a == "--ops")
      o.ops = val();
    else if (a == "--shapes")
      o.shapes = val();
    else if (a == "--reps")
      o.reps = atoi(val());
    else if (a == "--warmup")
      o.warmup = atoi(val());
    else if (a == "--seed")
      o.seed = strtoull(val(), nullptr, 10);
    else if (a == "--rank-env")
      o.rankEnv.push_back(val());
    else if (a == "--label")
      o.label = val();
    else if (a == "--out")
      o.out = val();
    else if (a == "--timeout-s")
      o.timeoutS = atof(val());
    else if (a == "--budget-s")
      o.budgetS = atof(val());
    else
      usage(("unknown option " + a).c_str());
  }
  if (o.lib.empty()) usage("--lib is required");
  if (o.nprocs < 2 || o.nprocs > kMaxRanks) usage("--nprocs must be 2..16");
  if (o.ranksPerNode < 1) usage("--ranks-per-node must be >= 1");
  if (o.reps < 1 || o.reps > kMaxReps) usage("--reps must be 1..32");
  if (o.warmup < 0) usage("--warmup must be >= 0");
  if (o.variants.empty()) usage("--variants is empty");
  for (const std::string& kv : o.rankEnv)
    if (kv.find('=') == std::string::npos || kv[0] == '=') usage("--rank-env takes NAME=VALUE");
  std::vector<Shape> shapes;
  if (!o.shapes.empty()) {
    if (!parseShapes(o.shapes, &shapes)) usage("--shapes: expected op:MxNxK[,...], op ar|ag|rs");
  } else if (o.set == "quick" || o.set == "default" || o.set == "full") {
    shapes = filterOps(defaultShapes(o.set == "full", o.set == "quick"), o.ops);
  } else {
    usage("--set must be quick, default or full");
  }
  if (shapes.empty()) usage("no shape selected");
  if (shapes.size() > (size_t)kMaxShapes) usage("too many shapes");

  gTool = "fused_procs_bench";
  void* mem = mapShared(sizeof(Payload));
  if (mem == nullptr) usage("mmap failed");
  gp = static_cast<Payload*>(mem);
  bool ok = runRanks(o.nprocs, o.timeoutS, [&] { rankMain(o, shapes); });
  unsigned long long totalWrong = 0;
  const std::string json = report(o, shapes, cmd, ok, &totalWrong);
  if (totalWrong) {
    ok = false;
    fprintf(stderr, "fused_procs_bench: %llu elements outside the tolerance\n", totalWrong);
  }
  if (!o.out.empty()) {
    FILE* f = fopen(o.out.c_str(), "w");
    if (!f || fputs(json.c_str(), f) < 0) {
      fprintf(stderr, "fused_procs_bench: cannot write %s\n", o.out.c_str());
      ok = false;
    }
    if (f) fclose(f);
  }
  return ok ? 0 : 1;
}
