// Shared by the GPU tests of the fused GEMM + collective calls (test_fused_gemm_coll.cu,
// test_fused_matrix*.cu): one call on n ranks as a Problem (every rank's inputs, its poisoned
// outputs, an fp64 reference computed independently of the library, the element-wise check).
//
// Every rank's inputs live in this process: ranks that are threads share the buffers, and a
// rank that is a process regenerates its peers' inputs from the shared seed (fillRandom is a
// pure function of seed and element index), so each process computes the full reference.
//
// Reference: per-rank products in fp64 on the GPU by a plain loop (no tensor cores, no GEMM
// engine), summed over ranks in fp64, bias added in fp64 (the same role cuBLAS plus a host sum
// would play, without trusting a second GEMM). Tolerance: |got - ref| <= tol * absRef + atol
// with absRef = sum_r |A_r B_r| + |bias| (exact, fp64):
//   - the GEMM accumulates in fp32: its error is a random walk of at most K fp32 roundings
//     of partial sums whose size grows like sqrt(k)/3 (inputs uniform in [-1, 1)), so its
//     sigma stays below K/7 * 2^-24 per rank even if every product were added alone:
//     atol = K * n * 2^-24 is at least 7 sigma per element (the tensor cores add blocks of
//     products exactly, which leaves far more margin);
//   - each rank's partial is rounded once to the output type (u; both paths store partials
//     in the output type), they are summed (at worst n-1 roundings in the output type, each
//     at most u times the running |sum| <= absRef), the bias is added with one more
//     rounding: tol = (n + 2) u (AllGatherGemm: one product, one bias rounding: 2 u);
//     u = 2^-8 bf16, 2^-11 fp16 (their unit roundoffs), 2^-23 fp32 (twice its unit
//     roundoff: fp32 sums next to the GEMM's own error, which atol covers).
// The bytes after every output (kSlack) must keep their poison (no write past the end).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "gpu/test_coll_util.h"
#include "gpu/test_gemm_util.cuh"
#include "gpu/test_proc_util.h"
#include "mkernel/fused.h"

namespace fusedtest {

using gemmtest::fillRandom;
using gemmtest::loadAny;
using mk::gemm::DType;

enum Op { kAllReduce = 0, kAllGather = 1, kReduceScatter = 2 };

inline DType dtOf(ncclDataType_t t) {
  return t == ncclFloat16 ? DType::kF16 : (t == ncclFloat32 ? DType::kF32 : DType::kBF16);
}
inline size_t esOf(ncclDataType_t t) {
  return t == ncclFloat32 ? 4 : 2;
}
inline const char* typeName(ncclDataType_t t) {
  return t == ncclFloat32 ? "f32" : (t == ncclFloat16 ? "f16" : "bf16");
}

// ref[m,n] (+)= sum_k A[m,k] B(k,n) and absRef[m,n] (+)= |that product|, in fp64.
static __global__ void refAccumKernel(int M, int N, int K, const void* A, const void* B, int kn,
                                      DType ab, double* ref, double* absRef, int accumulate) {
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

static __global__ void addBiasRefKernel(int M, int N, const void* bias, DType bt, double* ref,
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
static __global__ void checkKernel(int rows, int N, int row0, const void* got, DType t,
                                   const double* ref, const double* absRef, double tol, double atol,
                                   unsigned long long* bad, unsigned long long* first) {
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
  int op;  // Op
  int n;
  int M, N, K;
  int layout;  // ncclFusedLayout_t
  ncclDataType_t in, out;
  bool bias;
  int algo;                 // ncclFusedAlgo_t
  bool inplace = false;     // AllGatherGemm: Ashard is this rank's block of Agathered
  bool noGathered = false;  // AllGatherGemm: Agathered is NULL
};

inline std::string name(const Case& c) {
  static const char* ops[] = {"GemmAllReduce", "AllGatherGemm", "GemmReduceScatter"};
  static const char* algos[] = {"auto", "fused", "seq"};
  return std::string(ops[c.op]) + "_n" + std::to_string(c.n) + "_" + std::to_string(c.M) + "x" +
         std::to_string(c.N) + "x" + std::to_string(c.K) + (c.layout ? "_KN" : "_NK") + "_" +
         (c.in == ncclFloat16 ? "f16" : "bf16") + "_to_" + typeName(c.out) +
         (c.bias ? "_bias" : "") + (c.inplace ? "_inplace" : "") + (c.noGathered ? "_noG" : "") +
         "_" + algos[c.algo];
}

// Tolerance of the file comment.
inline void tolerance(const Case& c, double* tol, double* atol) {
  const double u =
      c.out == ncclFloat32 ? 1.0 / (1 << 23) : (c.out == ncclFloat16 ? 1.0 / 2048 : 1.0 / 256);
  *tol = (c.op == kAllGather ? 2 : c.n + 2) * u;
  *atol = (double)c.K * c.n / (1 << 24);
}

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t bytes) {
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) p = nullptr;
  }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

constexpr size_t kSlack = 64;  // poisoned bytes after every output

// One call on every rank of a comm: inputs, outputs, reference, checks. The work of the test
// itself runs on a private non-blocking stream, synchronised before fill() and check()
// return, so no device-wide synchronisation waits for a rank's kernel.
class Problem {
 public:
  // owned < 0: outputs for every rank (threads); else only for that rank (a process).
  explicit Problem(const Case& c, int owned = -1) : c_(c), owned_(owned) {
    const int n = c.n;
    rowsA_ = c.op == kAllGather ? c.M / n : c.M;
    rowsC_ = c.op == kReduceScatter ? c.M / n : c.M;
    if (cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking) != cudaSuccess) {
      err = "cudaStreamCreate failed";
      return;
    }
    const size_t bytesB = (size_t)c.N * c.K * 2;
    for (int r = 0; r < n; ++r) {
      A_.emplace_back(new Buf(bytesA()));
      B_.emplace_back(new Buf(bytesB));
      const bool out = owns(r);
      C_.emplace_back(new Buf(out ? bytesC() + kSlack : 0));
      G_.emplace_back(new Buf(out && c.op == kAllGather ? bytesG() + kSlack : 0));
      if (!A_[r]->p || !B_[r]->p || !C_[r]->p || !G_[r]->p) err = "cudaMalloc failed";
    }
    const size_t refElems = (size_t)c.M * c.N * (c.op == kAllGather ? n : 1);
    bias_.reset(new Buf((size_t)c.N * esOf(c.out)));
    ref_.reset(new Buf(refElems * 8));
    absRef_.reset(new Buf(refElems * 8));
    cnt_.reset(new Buf(16));
    if (!bias_->p || !ref_->p || !absRef_->p || !cnt_->p) err = "cudaMalloc failed";
    cfg = NCCL_FUSED_CONFIG_INITIALIZER;
    cfg.bLayout = c.layout;
    cfg.outType = c.out;
    cfg.bias = c.bias ? bias_->p : nullptr;
    cfg.algo = c.algo;
  }
  ~Problem() {
    if (s_) cudaStreamDestroy(s_);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  const Case& c() const { return c_; }
  bool owns(int r) const { return owned_ < 0 || owned_ == r; }
  size_t bytesA() const { return rowsA_ * c_.K * 2; }
  size_t bytesC() const { return rowsC_ * c_.N * esOf(c_.out); }
  size_t bytesG() const { return (size_t)c_.M * c_.K * 2; }
  void* C(int r) const { return C_[r]->p; }
  // Rank r's A argument: its own buffer, or its block of Agathered when in place.
  const void* Aarg(int r) const {
    return c_.inplace ? static_cast<char*>(G_[r]->p) + r * bytesA() : A_[r]->p;
  }

  // New inputs for every rank (derived from seed only), poisoned outputs, the reference.
  std::string fill(uint64_t seed) {
    if (!err.empty()) return err;
    const int n = c_.n, kn = c_.layout == ncclFusedLayoutKN;
    const DType in = dtOf(c_.in);
    for (int r = 0; r < n; ++r) {
      fillRandom(A_[r]->p, rowsA_, c_.K, c_.K, in, seed * 31 + r, s_);
      fillRandom(B_[r]->p, kn ? c_.K : c_.N, kn ? c_.N : c_.K, kn ? c_.N : c_.K, in,
                 seed * 31 + 100 + r, s_);
      if (!owns(r)) continue;
      cudaMemsetAsync(C_[r]->p, 0xFF, bytesC() + kSlack, s_);
      if (c_.op == kAllGather) cudaMemsetAsync(G_[r]->p, 0xFF, bytesG() + kSlack, s_);
      if (c_.inplace)
        cudaMemcpyAsync((void*)Aarg(r), A_[r]->p, bytesA(), cudaMemcpyDeviceToDevice, s_);
    }
    if (c_.bias) fillRandom(bias_->p, 1, c_.N, c_.N, dtOf(c_.out), seed * 31 + 999, s_);
    double* ref = static_cast<double*>(ref_->p);
    double* absRef = static_cast<double*>(absRef_->p);
    const dim3 blk(16, 16);
    if (c_.op == kAllGather) {
      // Rank q's C = gathered A times B_q: shard p of the rows from A_p.
      const dim3 grd((c_.N + 15) / 16, (unsigned)(rowsA_ + 15) / 16);
      for (int q = 0; q < n; ++q) {
        for (int p = 0; p < n; ++p) {
          const size_t off = ((size_t)q * c_.M + p * rowsA_) * c_.N;
          refAccumKernel<<<grd, blk, 0, s_>>>((int)rowsA_, c_.N, c_.K, A_[p]->p, B_[q]->p, kn, in,
                                              ref + off, absRef + off, 0);
        }
        if (c_.bias)
          addBiasRefKernel<<<256, 256, 0, s_>>>(c_.M, c_.N, bias_->p, dtOf(c_.out),
                                                ref + (size_t)q * c_.M * c_.N,
                                                absRef + (size_t)q * c_.M * c_.N);
      }
    } else {
      const dim3 grd((c_.N + 15) / 16, (c_.M + 15) / 16);
      for (int r = 0; r < n; ++r)
        refAccumKernel<<<grd, blk, 0, s_>>>(c_.M, c_.N, c_.K, A_[r]->p, B_[r]->p, kn, in, ref,
                                            absRef, r > 0);
      if (c_.bias)
        addBiasRefKernel<<<256, 256, 0, s_>>>(c_.M, c_.N, bias_->p, dtOf(c_.out), ref, absRef);
    }
    cudaError_t e = cudaStreamSynchronize(s_);
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? "" : std::string("fill/reference: ") + cudaGetErrorString(e);
  }

  // Rank r's part of the call.
  ncclResult_t call(int r, ncclComm_t comm, cudaStream_t s) const {
    if (c_.op == kAllReduce)
      return ncclGemmAllReduce(A_[r]->p, B_[r]->p, C_[r]->p, c_.M, c_.N, c_.K, c_.in, &cfg, comm,
                               s);
    if (c_.op == kAllGather)
      return ncclAllGatherGemm(Aarg(r), B_[r]->p, C_[r]->p, c_.noGathered ? nullptr : G_[r]->p,
                               c_.M, c_.N, c_.K, c_.in, &cfg, comm, s);
    return ncclGemmReduceScatter(A_[r]->p, B_[r]->p, C_[r]->p, c_.M, c_.N, c_.K, c_.in, &cfg, comm,
                                 s);
  }

  // Rank r's output (after its stream finished): every element, the slack, the gathered A.
  std::string check(int r) {
    const std::string who = "rank " + std::to_string(r) + ": ";
    double tol, atol;
    tolerance(c_, &tol, &atol);
    unsigned long long h[2] = {0, ~0ull};
    cudaMemcpyAsync(cnt_->p, h, 16, cudaMemcpyHostToDevice, s_);
    const int row0 = c_.op == kReduceScatter ? r * (int)rowsC_ : 0;
    const size_t refOff = c_.op == kAllGather ? (size_t)r * c_.M * c_.N : 0;
    checkKernel<<<512, 256, 0, s_>>>(
        (int)rowsC_, c_.N, row0, C_[r]->p, dtOf(c_.out), static_cast<double*>(ref_->p) + refOff,
        static_cast<double*>(absRef_->p) + refOff, tol, atol,
        static_cast<unsigned long long*>(cnt_->p), static_cast<unsigned long long*>(cnt_->p) + 1);
    cudaMemcpyAsync(h, cnt_->p, 16, cudaMemcpyDeviceToHost, s_);
    std::vector<uint8_t> slack(kSlack);
    cudaMemcpyAsync(slack.data(), static_cast<char*>(C_[r]->p) + bytesC(), kSlack,
                    cudaMemcpyDeviceToHost, s_);
    cudaError_t e = cudaStreamSynchronize(s_);
    if (e != cudaSuccess) return who + "check: " + cudaGetErrorString(e);
    if (h[0] != 0) {
      char b[160];
      snprintf(b, sizeof(b), "%llu of %zu elements wrong (first at row %llu col %llu)", h[0],
               rowsC_ * c_.N, h[1] / c_.N, h[1] % c_.N);
      return who + b;
    }
    for (uint8_t x : slack)
      if (x != 0xFF) return who + "bytes after C were written";
    if (c_.op != kAllGather || c_.noGathered) return "";
    // The gathered A: every shard in place, bytes exact, nothing after it written.
    std::vector<uint8_t> g(bytesG() + kSlack), a(bytesA());
    e = cudaMemcpyAsync(g.data(), G_[r]->p, g.size(), cudaMemcpyDeviceToHost, s_);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s_);
    if (e != cudaSuccess) return who + "Agathered download: " + cudaGetErrorString(e);
    for (int p = 0; p < c_.n; ++p) {
      e = cudaMemcpyAsync(a.data(), A_[p]->p, a.size(), cudaMemcpyDeviceToHost, s_);
      if (e == cudaSuccess) e = cudaStreamSynchronize(s_);
      if (e != cudaSuccess) return who + "A download: " + cudaGetErrorString(e);
      if (memcmp(g.data() + p * a.size(), a.data(), a.size()) != 0)
        return who + "Agathered block " + std::to_string(p) + " wrong";
    }
    for (size_t i = bytesG(); i < g.size(); ++i)
      if (g[i] != 0xFF) return who + "bytes after Agathered were written";
    return "";
  }

  // FNV-1a of rank r's C bytes (bit-identity across processes).
  uint64_t hashC(int r) {
    std::vector<uint8_t> h(bytesC());
    if (cudaMemcpyAsync(h.data(), C_[r]->p, h.size(), cudaMemcpyDeviceToHost, s_) != cudaSuccess ||
        cudaStreamSynchronize(s_) != cudaSuccess)
      return 0;
    uint64_t x = 1469598103934665603ull;
    for (uint8_t b : h) x = (x ^ b) * 1099511628211ull;
    return x;
  }

  // GemmAllReduce: every owned rank's C bit-identical to the first one's.
  std::string identical() {
    if (c_.op != kAllReduce) return "";
    int first = -1;
    uint64_t h0 = 0;
    for (int r = 0; r < c_.n; ++r) {
      if (!owns(r)) continue;
      const uint64_t h = hashC(r);
      if (first < 0) {
        first = r;
        h0 = h;
      } else if (h != h0) {
        return "rank " + std::to_string(r) + " differs from rank " + std::to_string(first) +
               " (not bit-identical)";
      }
    }
    return "";
  }

  ncclFusedConfig_t cfg;
  std::string err;  // set when the buffers could not be made

 private:
  Case c_;
  int owned_;
  size_t rowsA_ = 0, rowsC_ = 0;
  cudaStream_t s_ = nullptr;
  std::vector<std::unique_ptr<Buf>> A_, B_, C_, G_;
  std::unique_ptr<Buf> bias_, ref_, absRef_, cnt_;
};

// Polls every rank's stream and async error until all are done, one fails, or timeoutS
// passes (never an unbounded synchronisation on a stream whose kernel may wait for a peer).
inline std::string waitRanks(const std::vector<ncclComm_t>& comms,
                             const std::vector<cudaStream_t>& streams, double timeoutS) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<bool> done(streams.size(), false);
  size_t left = streams.size();
  for (size_t r = 0; r < streams.size(); ++r)
    if (comms[r] == nullptr) {  // a rank of another process
      done[r] = true;
      --left;
    }
  while (left > 0) {
    for (size_t r = 0; r < streams.size(); ++r) {
      if (done[r]) continue;
      const cudaError_t e = cudaStreamQuery(streams[r]);
      if (e == cudaSuccess) {
        done[r] = true;
        --left;
      } else if (e != cudaErrorNotReady) {
        return "rank " + std::to_string(r) + ": CUDA error " + cudaGetErrorString(e);
      }
      ncclResult_t a = ncclSuccess;
      if (ncclCommGetAsyncError(comms[r], &a) == ncclSuccess && a != ncclSuccess &&
          a != ncclInProgress)
        return "rank " + std::to_string(r) + ": async error " + ncclGetErrorString(a) + ": " +
               ncclGetLastError(comms[r]);
    }
    if (left == 0) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeoutS)
      return std::to_string(left) + " ranks not done after " + std::to_string((int)timeoutS) +
             " s (deadlock or lost message)";
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return "";
}

// waitRanks for one rank (a thread that drives only rank r), its failure named by rank.
inline std::string waitRank(int r, ncclComm_t comm, cudaStream_t s, double timeoutS = 60) {
  const std::string e = waitRanks({comm}, {s}, timeoutS);
  return e.empty() ? "" : "rank " + std::to_string(r) + ": " + e;
}

// "" for ncclSuccess, otherwise what rank r's call returned and the comm's last error.
inline std::string callError(int r, ncclComm_t comm, ncclResult_t res) {
  if (res == ncclSuccess) return "";
  return "rank " + std::to_string(r) + ": " + ncclGetErrorString(res) + ": " +
         ncclGetLastError(comm);
}

// Rank r's call (`res`, already issued on s), then the bounded wait for its stream.
inline std::string callAndWaitRank(int r, ncclComm_t comm, cudaStream_t s, ncclResult_t res) {
  const std::string e = callError(r, comm, res);
  return e.empty() ? waitRank(r, comm, s) : e;
}

// One rank of a child process of the multi-process fused tests: the spec ("plan n rank seed"),
// the unique id from the environment variable idEnv, the comm on GPU 0 with a non-blocking
// stream; comms / streams have n entries, set only at this rank's.
struct ChildRank {
  char plan[32] = {};
  int n = 0, me = 0;
  uint64_t seed = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
};

// False (the reason printed after tag) when the spec, the id or the set-up fails.
inline bool childRankInit(const char* spec, const char* idEnv, const char* tag, ChildRank* c) {
  const std::string bad = std::string(tag) + " bad child spec";
  if (!gputest::parseChildSpec(spec, bad.c_str(), c->plan, &c->n, &c->me, &c->seed)) return false;
  ncclUniqueId id;
  if (!gputest::hexToId(getenv(idEnv), &id)) {
    fprintf(stderr, "%s bad %s\n", tag, idEnv);
    return false;
  }
  if (cudaSetDevice(0) != cudaSuccess ||
      cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess ||
      ncclCommInitRank(&c->comm, c->n, id, c->me) != ncclSuccess) {
    fprintf(stderr, "%s rank %d: setup failed: %s\n", tag, c->me, ncclGetLastError(nullptr));
    return false;
  }
  c->comms.assign(c->n, nullptr);
  c->streams.assign(c->n, nullptr);
  c->comms[c->me] = c->comm;
  c->streams[c->me] = c->stream;
  return true;
}

// The child's end and exit status. Unless err is set already, a last AllReduce first: nobody
// tears down while a peer may still wait for this rank's last signals (its proxy sends them
// before the AllReduce's data). Then destroy, or print err and abort.
inline int childRankFinish(ChildRank& c, std::string err, const char* tag) {
  if (err.empty()) {
    colltest::DevBuf b(16);
    if (ncclAllReduce(b.base, b.base, 1, ncclInt32, ncclSum, c.comm, c.stream) != ncclSuccess)
      err = std::string("final barrier: ") + ncclGetLastError(c.comm);
    if (err.empty()) err = waitRanks(c.comms, c.streams, 60);
  }
  if (!err.empty()) {
    fprintf(stderr, "%s rank %d: %s\n", tag, c.me, err.c_str());
    ncclCommAbort(c.comm);
    return 1;
  }
  ncclCommDestroy(c.comm);
  fprintf(stderr, "%s rank %d: all cases passed\n", tag, c.me);
  return 0;
}

// Runs p on the ranks that this one thread drives (comms[r] != nullptr; each rank's call
// issued in turn, no group: fused calls are refused inside groups), `reps` times with fresh
// inputs; with `graph`, after one eager run, the calls are captured once (one graph per
// rank stream) and the graphs replayed. Every output is checked after every run, then
// `extra` (if any) runs. "" or what went wrong.
inline std::string runDriven(Problem& p, const std::vector<ncclComm_t>& comms,
                             const std::vector<cudaStream_t>& streams, uint64_t seed,
                             bool graph = false, int reps = 1,
                             const std::function<std::string()>& extra = nullptr) {
  const int n = (int)comms.size();
  if (!p.err.empty()) return p.err;
  auto issue = [&]() -> std::string {
    for (int r = 0; r < n; ++r) {
      if (!comms[r]) continue;
      const std::string e = callError(r, comms[r], p.call(r, comms[r], streams[r]));
      if (!e.empty()) return e;
    }
    return "";
  };
  std::vector<cudaGraph_t> graphs(n, nullptr);
  std::vector<cudaGraphExec_t> execs(n, nullptr);
  auto release = [&] {
    for (auto x : execs)
      if (x) cudaGraphExecDestroy(x);
    for (auto g : graphs)
      if (g) cudaGraphDestroy(g);
  };
  if (graph) {
    // One checked eager run first: it loads every kernel the call launches (lazy module
    // loading may synchronise the device, which capture forbids) and sets up the fused
    // path's per-comm state outside capture (captured without it, ncclFusedFused records
    // the sequential path).
    std::string e = runDriven(p, comms, streams, seed ^ 0xea9e7, false, 1, extra);
    if (!e.empty()) return "eager run before the capture: " + e;
    // The calls read the buffers at replay time: one capture serves every replay.
    for (int r = 0; r < n; ++r)
      if (comms[r] &&
          cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        return "begin capture failed";
    e = issue();
    // Every capture ends before anything is instantiated (instantiation is refused while a
    // stream of this thread still captures), also when a call failed.
    std::vector<cudaError_t> ended(n);
    for (int r = 0; r < n; ++r)
      if (comms[r]) ended[r] = cudaStreamEndCapture(streams[r], &graphs[r]);
    for (int r = 0; r < n && e.empty(); ++r)
      if (comms[r] && (ended[r] != cudaSuccess || graphs[r] == nullptr))
        e = std::string("end capture failed: ") + cudaGetErrorString(ended[r]);
    for (int r = 0; r < n && e.empty(); ++r) {
      if (!comms[r]) continue;
      const cudaError_t ie = cudaGraphInstantiate(&execs[r], graphs[r], 0);
      if (ie != cudaSuccess) e = std::string("instantiate failed: ") + cudaGetErrorString(ie);
    }
    if (!e.empty()) {
      release();
      return e;
    }
  }
  std::string err;
  for (int rep = 0; rep < reps && err.empty(); ++rep) {
    err = p.fill(seed * 1000 + rep * 17);
    if (!err.empty()) break;
    if (graph) {
      for (int r = 0; r < n && err.empty(); ++r)
        if (comms[r] && cudaGraphLaunch(execs[r], streams[r]) != cudaSuccess)
          err = "graph launch failed";
    } else {
      err = issue();
    }
    if (err.empty()) err = waitRanks(comms, streams, 120);
    for (int r = 0; r < n && err.empty(); ++r)
      if (comms[r]) err = p.check(r);
    if (err.empty()) err = p.identical();
    if (err.empty() && extra) err = extra();
    if (!err.empty() && reps > 1) err = "run " + std::to_string(rep) + ": " + err;
  }
  release();
  return err;
}

// ---- random fused calls mixed with ordinary collectives -----------------------------------
// One collective on the ranks this thread drives (comms[r] != nullptr; grouped), every rank's
// input known here (drawn from the seed) for the check.
struct CollOp {
  int kind = 0;  // 0 AllReduce, 1 AllGather, 2 ReduceScatter, 3 Broadcast
  ncclDataType_t dt = ncclFloat32;
  size_t count = 0;
  int root = 0, n = 0, owned = -1;  // owned: as in Problem
  std::vector<colltest::HostBuf> in;
  std::vector<std::unique_ptr<colltest::DevBuf>> send, recv;
  bool owns(int r) const { return owned < 0 || owned == r; }
  size_t inElems() const { return kind == 2 ? count * n : count; }
  size_t outElems() const { return kind == 1 ? count * n : count; }
  std::string name() const {
    static const char* names[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast"};
    return std::string(names[kind]) + " " + colltest::dtInfo(dt).name + " count " +
           std::to_string(count) + (kind == 3 ? " root " + std::to_string(root) : "");
  }
  // Inputs uploaded, outputs (and 16 bytes after them) poisoned.
  std::string prepare(uint64_t seed) {
    const size_t es = colltest::dtInfo(dt).size;
    in.resize(n);
    for (int r = 0; r < n; ++r) {
      colltest::fillRandom(in[r], dt, colltest::Op::kSum, inElems(), seed + 7919 * r);
      send.emplace_back(new colltest::DevBuf(owns(r) ? inElems() * es + 16 : 0));
      recv.emplace_back(new colltest::DevBuf(owns(r) ? outElems() * es + 16 : 0));
      if (!owns(r)) continue;
      if (!send[r]->base || !recv[r]->base) return "cudaMalloc failed";
      if ((inElems() && mktest::syncMemcpy(send[r]->base, in[r].bytes.data(), inElems() * es,
                                           cudaMemcpyHostToDevice) != cudaSuccess) ||
          mktest::syncMemset(recv[r]->base, 0xA5, outElems() * es + 16) != cudaSuccess)
        return "upload failed";
    }
    return "";
  }
  ncclResult_t issue(const std::vector<ncclComm_t>& comms,
                     const std::vector<cudaStream_t>& streams) {
    ncclResult_t res = ncclGroupStart();
    for (int r = 0; r < n && res == ncclSuccess; ++r) {
      if (!owns(r)) continue;
      void *s = send[r]->base, *d = recv[r]->base;
      if (kind == 0) res = ncclAllReduce(s, d, count, dt, ncclSum, comms[r], streams[r]);
      if (kind == 1) res = ncclAllGather(s, d, count, dt, comms[r], streams[r]);
      if (kind == 2) res = ncclReduceScatter(s, d, count, dt, ncclSum, comms[r], streams[r]);
      if (kind == 3) res = ncclBroadcast(s, d, count, dt, root, comms[r], streams[r]);
    }
    const ncclResult_t g = ncclGroupEnd();
    return res != ncclSuccess ? res : g;
  }
  // Reductions within colltest's rounding bound (integers exact), copies byte for byte.
  std::string check() {
    const size_t es = colltest::dtInfo(dt).size, B = count * es;
    std::vector<const colltest::HostBuf*> ins;
    for (auto& h : in) ins.push_back(&h);
    for (int r = 0; r < n; ++r) {
      if (!owns(r)) continue;
      colltest::HostBuf got;
      got.size = es;
      got.bytes.resize(outElems() * es + 16);
      if (mktest::syncMemcpy(got.bytes.data(), recv[r]->base, got.bytes.size(),
                             cudaMemcpyDeviceToHost) != cudaSuccess)
        return "download failed";
      std::string e;
      if (kind == 0) e = colltest::checkReduction(dt, colltest::Op::kSum, ins, 0, got, count, 0);
      if (kind == 2)
        e = colltest::checkReduction(dt, colltest::Op::kSum, ins, r * count, got, count, 0);
      if (kind == 3) e = colltest::checkBytes(got, 0, in[root], 0, B, "broadcast");
      for (int q = 0; kind == 1 && q < n && e.empty(); ++q)
        e = colltest::checkBytes(got, q * B, in[q], 0, B, "gathered block");
      for (size_t i = outElems() * es; i < got.bytes.size() && e.empty(); ++i)
        if (got.bytes[i] != 0xA5) e = "bytes after the output were written";
      if (!e.empty()) return "rank " + std::to_string(r) + ": " + e;
    }
    return "";
  }
};

// A random fused call on n ranks: every op, shape (tails everywhere, N % 4 != 0 too), input
// and output type, layout, bias, algo (auto, fused, sequential), AllGatherGemm in place.
inline Case randomCase(std::mt19937_64& rng, int n) {
  Case c{};
  c.op = (int)(rng() % 3);
  c.n = n;
  c.layout = (int)(rng() % 2);
  c.M = c.op == kAllReduce ? 1 + (int)(rng() % 320) : n * (1 + (int)(rng() % 80));
  c.N = c.layout == ncclFusedLayoutKN ? 8 * (1 + (int)(rng() % 40)) : 1 + (int)(rng() % 320);
  c.K = 8 * (1 + (int)(rng() % 40));
  c.in = rng() % 2 ? ncclFloat16 : ncclBfloat16;
  const ncclDataType_t outs[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
  c.out = outs[rng() % 3];
  c.bias = rng() % 2;
  c.algo = (int)(rng() % 3);
  const int g = (int)(rng() % 3);
  c.inplace = c.op == kAllGather && g == 1;
  c.noGathered = c.op == kAllGather && g == 2;
  return c;
}

// `calls` random fused calls, each followed by 0-2 random collectives, on the ranks this
// thread drives (comms[r] == nullptr: a rank of another process, which draws the same
// sequence from the same seed). Issued back to back in batches (no host synchronisation
// inside a batch), then every output checked. onFailure runs before any buffer is freed
// (abort the comms there: a failed call may leave kernels waiting). "" or the first failure.
inline std::string runRandomMix(const std::vector<ncclComm_t>& comms,
                                const std::vector<cudaStream_t>& streams, uint64_t seed, int calls,
                                int batch, const std::function<void()>& onFailure,
                                int* nColls = nullptr) {
  const int n = (int)comms.size();
  int owned = -1, driven = 0;
  for (int r = 0; r < n; ++r)
    if (comms[r]) {
      owned = r;
      driven++;
    }
  if (driven == n) owned = -1;
  std::mt19937_64 rng(seed);
  const ncclDataType_t collTypes[] = {ncclFloat32, ncclBfloat16, ncclInt32, ncclFloat16};
  int done = 0, colls = 0;
  for (int b = 0; done < calls; ++b) {
    std::vector<std::unique_ptr<Problem>> fused;
    std::vector<std::unique_ptr<CollOp>> coll;
    std::vector<std::pair<int, size_t>> order;  // (0 fused / 1 collective, index)
    std::string err;
    for (int i = 0; i < batch && done + i < calls && err.empty(); ++i) {
      const Case c = randomCase(rng, n);
      fused.emplace_back(new Problem(c, owned));
      err = fused.back()->fill(rng());
      order.push_back({0, fused.size() - 1});
      for (int k = (int)(rng() % 3); k > 0 && err.empty(); --k) {
        std::unique_ptr<CollOp> o(new CollOp());
        o->kind = (int)(rng() % 4);
        o->dt = collTypes[rng() % 4];
        o->count = rng() % 8 == 0 ? 0 : 1 + rng() % 5000;
        o->root = (int)(rng() % n);
        o->n = n;
        o->owned = owned;
        err = o->prepare(rng());
        coll.push_back(std::move(o));
        order.push_back({1, coll.size() - 1});
      }
    }
    for (size_t i = 0; i < order.size() && err.empty(); ++i) {
      const size_t j = order[i].second;
      if (order[i].first == 0) {
        for (int r = 0; r < n && err.empty(); ++r) {
          if (!comms[r]) continue;
          const ncclResult_t res = fused[j]->call(r, comms[r], streams[r]);
          if (res != ncclSuccess)
            err = name(fused[j]->c()) + " rank " + std::to_string(r) + ": " +
                  ncclGetErrorString(res) + ": " + ncclGetLastError(comms[r]);
        }
      } else if (coll[j]->issue(comms, streams) != ncclSuccess) {
        err = coll[j]->name() + ": " + ncclGetLastError(nullptr);
      }
    }
    if (err.empty()) err = waitRanks(comms, streams, 120);
    for (size_t i = 0; i < fused.size() && err.empty(); ++i) {
      for (int r = 0; r < n && err.empty(); ++r)
        if (comms[r]) err = fused[i]->check(r);
      if (err.empty()) err = fused[i]->identical();
      if (!err.empty()) err = name(fused[i]->c()) + ": " + err;
    }
    for (size_t i = 0; i < coll.size() && err.empty(); ++i) {
      err = coll[i]->check();
      if (!err.empty()) err = coll[i]->name() + ": " + err;
    }
    if (!err.empty()) {
      onFailure();
      return "batch " + std::to_string(b) + " (seed " + std::to_string(seed) + "): " + err;
    }
    done += (int)fused.size();
    colls += (int)coll.size();
  }
  if (nColls) *nColls = colls;
  return "";
}

}  // namespace fusedtest
