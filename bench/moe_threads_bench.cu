// ncclMoeDispatchGemm (or, with --ffn, the whole layer ncclMoeDispatchFfnCombine), fused vs
// sequential, with n ranks (default 4) sharing GPU 0 as threads of this process
// (ncclCommInitAll; the clique layout, where the fused kernels run). One run, side by side,
// JSON.
//
// Per shape (H:N:E:k:T, T tokens per rank, N the experts' output width: 2I for GEMM1; with
// --ffn, N is the layer's I) and per algo (sequential = ncclFusedSequential: the dispatch
// kernel, then the grouped GEMM(s) and, with --ffn, the combine; fused = ncclFusedFused: one
// kernel per rank), every rank's thread issues --reps calls back to back on its stream after
// --warmup calls; the time of a call is the wall time of the batch (all ranks concurrently,
// from a common start to the last rank's stream done) divided by --reps, the median of
// --trials batches, the two algos' batches interleaved. Routing: each token's k experts
// distinct and uniform (a fresh draw per rank). TFLOP/s per rank: 2 * T * k * N * H / time
// (the rows a rank receives on average; --ffn: 6 * T * k * I * H, both GEMMs). After timing,
// the fused output is compared bit for bit with the sequential one (every expert row of y of
// every rank; --ffn: every rank's layer output; outputs and intermediates set to NaN before
// each algo's first calls): the fused kernels run the same arithmetic.
//
//   bench_moe_threads_bench [--ranks 4] [--shapes 7168:4096:256:8:4096,...] [--ffn]
//                           [--reps 10] [--warmup 2] [--trials 3] [--comm-sms -1] [--out FILE]
// Every wait is bounded (--timeout seconds per batch, 600 by default).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "coll_bench_util.h"
#include "mkernel/fused.h"

using collbench::Json;

namespace {

[[noreturn]] void fatal(const std::string& msg) {
  fprintf(stderr, "moe_threads_bench: FAIL %s\n", msg.c_str());
  fflush(stdout);
  _exit(1);
}
#define MB_CUDA(cmd)                                                        \
  do {                                                                      \
    cudaError_t e_ = (cmd);                                                 \
    if (e_ != cudaSuccess)                                                  \
      fatal(std::string(#cmd) + ": " + cudaGetErrorName(e_) + " at line " + \
            std::to_string(__LINE__));                                      \
  } while (0)

struct Shape {
  int H, N, E, k, T;
};

struct Options {
  int ranks = 4, reps = 10, warmup = 2, trials = 3, commSms = -1, timeoutS = 600;
  bool ffn = false;
  std::string shapes = "7168:4096:256:8:1024,7168:4096:256:8:4096,2048:2816:64:6:4096";
  // --ffn without --shapes: the same layers (I = N / 2).
  std::string ffnShapes = "7168:2048:256:8:1024,7168:2048:256:8:4096,2048:1408:64:6:4096";
  bool shapesGiven = false;
  std::string out;
};

double nowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Waits for stream s without an unbounded wait.
void waitStream(cudaStream_t s, double deadline, ncclComm_t comm) {
  for (;;) {
    const cudaError_t r = cudaStreamQuery(s);
    if (r == cudaSuccess) break;
    if (r != cudaErrorNotReady) fatal(std::string("stream: ") + cudaGetErrorString(r));
    if (nowS() > deadline) fatal("timed out waiting for a rank's stream");
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  ncclResult_t a = ncclSuccess;
  ncclCommGetAsyncError(comm, &a);
  if (a != ncclSuccess) fatal(std::string("async error: ") + ncclGetLastError(comm));
}

__global__ void fillBf16(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    p[i] = __float2bfloat16(((float)(x & 0xffff) / 32768.0f - 1.0f) * scale);
  }
}

struct Rank {
  void *x = nullptr, *w1 = nullptr, *xRecv = nullptr, *y = nullptr;
  // --ffn: w2 [epr][H][I], GEMM1's h [maxRows][2I] and act [maxRows][I], out [maxRows][H] fp32,
  // the layer's output yOut [T][H].
  void *w2 = nullptr, *h = nullptr, *act = nullptr, *out = nullptr, *yOut = nullptr;
  int *idx = nullptr, *cnt = nullptr, *off = nullptr, *src = nullptr;
  float *wts = nullptr, *rw = nullptr;
  size_t maxRows = 0;
  cudaStream_t s = nullptr;
};

void freeRank(Rank& r) {
  for (void* p : {r.x, r.w1, r.xRecv, r.y, r.w2, r.h, r.act, r.out, r.yOut, (void*)r.idx,
                  (void*)r.cnt, (void*)r.off, (void*)r.src, (void*)r.wts, (void*)r.rw})
    if (p) cudaFree(p);
  if (r.s) cudaStreamDestroy(r.s);
  r = Rank{};
}

void setupRank(Rank& d, const Shape& sh, int n, int r, bool ffn) {
  const int epr = sh.E / n;
  MB_CUDA(cudaStreamCreateWithFlags(&d.s, cudaStreamNonBlocking));
  // Uniform routing: the bound is the expected rows with generous slack for the draw's spread
  // and each expert's padding (an overflow is reported, and the bench fails on it).
  d.maxRows = (size_t)sh.T * sh.k * 3 / 2 + (size_t)epr * 128 + 1024;
  MB_CUDA(cudaMalloc(&d.x, (size_t)sh.T * sh.H * 2));
  MB_CUDA(cudaMalloc(&d.w1, (size_t)epr * sh.N * sh.H * 2));
  MB_CUDA(cudaMalloc(&d.xRecv, d.maxRows * sh.H * 2));
  MB_CUDA(cudaMalloc(&d.y, d.maxRows * sh.N * 2));
  MB_CUDA(cudaMalloc(&d.idx, (size_t)sh.T * sh.k * 4));
  MB_CUDA(cudaMalloc(&d.wts, (size_t)sh.T * sh.k * 4));
  MB_CUDA(cudaMalloc(&d.rw, d.maxRows * 4));
  MB_CUDA(cudaMalloc(&d.src, d.maxRows * 12));
  MB_CUDA(cudaMalloc(&d.cnt, epr * 4));
  MB_CUDA(cudaMalloc(&d.off, (epr + 1) * 4));
  fillBf16<<<1024, 256>>>((__nv_bfloat16*)d.x, (size_t)sh.T * sh.H, 0x1234 + r, 1.0f);
  fillBf16<<<1024, 256>>>((__nv_bfloat16*)d.w1, (size_t)epr * sh.N * sh.H, 0x777 + r, 0.05f);
  if (ffn) {  // sh.N is I: w1 [epr][2I][H]
    const size_t I = sh.N;
    MB_CUDA(cudaFree(d.w1));
    MB_CUDA(cudaMalloc(&d.w1, (size_t)epr * 2 * I * sh.H * 2));
    MB_CUDA(cudaMalloc(&d.w2, (size_t)epr * sh.H * I * 2));
    MB_CUDA(cudaMalloc(&d.h, d.maxRows * 2 * I * 2));
    MB_CUDA(cudaMalloc(&d.act, d.maxRows * I * 2));
    MB_CUDA(cudaMalloc(&d.out, d.maxRows * sh.H * 4));
    MB_CUDA(cudaMalloc(&d.yOut, (size_t)sh.T * sh.H * 2));
    fillBf16<<<1024, 256>>>((__nv_bfloat16*)d.w1, (size_t)epr * 2 * I * sh.H, 0x777 + r, 0.05f);
    fillBf16<<<1024, 256>>>((__nv_bfloat16*)d.w2, (size_t)epr * sh.H * I, 0x999 + r, 0.05f);
  }
  MB_CUDA(cudaGetLastError());
  std::mt19937_64 rng(0x5eed + r);
  std::vector<int> idx((size_t)sh.T * sh.k);
  std::vector<float> wts(idx.size());
  std::vector<int> perm(sh.E);
  for (int e = 0; e < sh.E; ++e) perm[e] = e;
  for (int t = 0; t < sh.T; ++t) {
    for (int j = 0; j < sh.k; ++j) {  // k distinct experts: a partial shuffle
      std::swap(perm[j], perm[j + rng() % (sh.E - j)]);
      idx[(size_t)t * sh.k + j] = perm[j];
      wts[(size_t)t * sh.k + j] = 1.0f / sh.k;
    }
  }
  MB_CUDA(cudaMemcpy(d.idx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
  MB_CUDA(cudaMemcpy(d.wts, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice));
  MB_CUDA(cudaDeviceSynchronize());
}

ncclResult_t callRank(const Rank& d, const Shape& sh, int algo, int commSms, bool ffn,
                      ncclComm_t comm) {
  ncclMoeConfig_t cfg = NCCL_MOE_CONFIG_INITIALIZER;
  cfg.algo = algo;
  cfg.commSms = commSms;
  cfg.outType = ncclBfloat16;
  if (ffn) {
    ncclMoeFfnBuffers_t buf{d.xRecv, d.h, d.act, (float*)d.out, d.cnt, d.off, d.maxRows};
    return ncclMoeDispatchFfnCombine(d.x, d.idx, d.wts, d.w1, d.w2, d.yOut, &buf, sh.T, sh.H, sh.N,
                                     sh.E, sh.k, ncclBfloat16, &cfg, comm, d.s);
  }
  ncclMoeRecv_t recv{d.xRecv, d.y, d.cnt, d.off, d.src, d.rw, d.maxRows};
  return ncclMoeDispatchGemm(d.x, d.idx, d.wts, d.w1, &recv, sh.T, sh.H, sh.N, sh.E, sh.k,
                             ncclBfloat16, &cfg, comm, d.s);
}

// One batch: every rank's thread issues `calls` calls, then waits for its stream. Seconds.
double batch(std::vector<Rank>& ranks, const Shape& sh, int algo, int commSms, bool ffn,
             const std::vector<ncclComm_t>& comms, int calls, int timeoutS) {
  const int n = (int)ranks.size();
  std::vector<std::thread> th;
  const double t0 = nowS();
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      if (cudaSetDevice(0) != cudaSuccess) fatal("cudaSetDevice");
      for (int i = 0; i < calls; ++i) {
        const ncclResult_t res = callRank(ranks[r], sh, algo, commSms, ffn, comms[r]);
        if (res != ncclSuccess)
          fatal("rank " + std::to_string(r) + ": " + ncclGetErrorString(res) + ": " +
                ncclGetLastError(comms[r]));
      }
      waitStream(ranks[r].s, t0 + timeoutS, comms[r]);
    });
  for (auto& t : th) t.join();
  return nowS() - t0;
}

// Every output and intermediate of every rank set to NaN (0xff bytes), so that what an algo
// leaves unwritten cannot pass for the other algo's result in the comparison.
void poisonOutputs(std::vector<Rank>& ranks, const Shape& sh, bool ffn) {
  for (Rank& d : ranks) {
    if (ffn) {
      MB_CUDA(cudaMemset(d.yOut, 0xff, (size_t)sh.T * sh.H * 2));
      MB_CUDA(cudaMemset(d.out, 0xff, d.maxRows * sh.H * 4));
      MB_CUDA(cudaMemset(d.act, 0xff, d.maxRows * sh.N * 2));
    } else {
      MB_CUDA(cudaMemset(d.y, 0xff, d.maxRows * sh.N * 2));
    }
  }
  MB_CUDA(cudaDeviceSynchronize());
}

// Every expert row of y of every rank, concatenated (--ffn: every rank's layer output).
std::vector<uint16_t> expertRows(std::vector<Rank>& ranks, const Shape& sh, bool ffn) {
  std::vector<uint16_t> all;
  if (ffn) {
    for (Rank& d : ranks) {
      const size_t first = all.size();
      all.resize(first + (size_t)sh.T * sh.H);
      MB_CUDA(
          cudaMemcpy(all.data() + first, d.yOut, (size_t)sh.T * sh.H * 2, cudaMemcpyDeviceToHost));
    }
    return all;
  }
  const int epr = sh.E / (int)ranks.size();
  for (Rank& d : ranks) {
    std::vector<int> cnt(epr), off(epr + 1);
    MB_CUDA(cudaMemcpy(cnt.data(), d.cnt, epr * 4, cudaMemcpyDeviceToHost));
    MB_CUDA(cudaMemcpy(off.data(), d.off, (epr + 1) * 4, cudaMemcpyDeviceToHost));
    for (int le = 0; le < epr; ++le) {
      const size_t first = all.size();
      all.resize(first + (size_t)cnt[le] * sh.N);
      MB_CUDA(cudaMemcpy(all.data() + first, (uint16_t*)d.y + (size_t)off[le] * sh.N,
                         (size_t)cnt[le] * sh.N * 2, cudaMemcpyDeviceToHost));
    }
  }
  return all;
}

Shape parseShape(const std::string& s) {
  Shape sh{};
  if (sscanf(s.c_str(), "%d:%d:%d:%d:%d", &sh.H, &sh.N, &sh.E, &sh.k, &sh.T) != 5 || sh.H <= 0 ||
      sh.N <= 0 || sh.E <= 0 || sh.k <= 0 || sh.k > sh.E || sh.T <= 0)
    fatal("shape " + s + ": expected H:N:E:k:T, positive, k <= E");
  return sh;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) fatal(a + " needs a value");
      return argv[++i];
    };
    if (a == "--ranks")
      o.ranks = std::stoi(val());
    else if (a == "--shapes")
      o.shapes = val(), o.shapesGiven = true;
    else if (a == "--reps")
      o.reps = std::stoi(val());
    else if (a == "--warmup")
      o.warmup = std::stoi(val());
    else if (a == "--trials")
      o.trials = std::stoi(val());
    else if (a == "--comm-sms")
      o.commSms = std::stoi(val());
    else if (a == "--timeout")
      o.timeoutS = std::stoi(val());
    else if (a == "--out")
      o.out = val();
    else if (a == "--ffn")
      o.ffn = true;
    else
      fatal("unknown option " + a + " (see the header of bench/moe_threads_bench.cu)");
  }
  if (o.ffn && !o.shapesGiven) o.shapes = o.ffnShapes;
  if (o.ranks < 1 || o.reps < 1 || o.warmup < 1 || o.trials < 1) fatal("counts must be >= 1");
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) fatal("no CUDA device");
  MB_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop{};
  MB_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::vector<ncclComm_t> comms(o.ranks);
  std::vector<int> devs(o.ranks, 0);
  if (ncclCommInitAll(comms.data(), o.ranks, devs.data()) != ncclSuccess)
    fatal(std::string("ncclCommInitAll: ") + ncclGetLastError(nullptr));

  Json j;
  j.beginObject();
  j.str("bench", "moe_threads_bench");
  j.str("command", benchargs::commandLine(argc, argv));
  j.str("device", prop.name);
  j.num("ranks", o.ranks);
  j.str("op", o.ffn ? "ncclMoeDispatchFfnCombine (N = I)" : "ncclMoeDispatchGemm");
  j.str("timing", "wall time of --reps back-to-back calls on every rank / reps, median of trials");
  j.beginArray("results");
  std::string table;
  const int algos[2] = {ncclFusedSequential, ncclFusedFused};
  const char* names[2] = {"sequential", "fused"};
  for (const std::string& ss : benchargs::splitList(o.shapes)) {
    const Shape sh = parseShape(ss);
    if (sh.E % o.ranks != 0) fatal("shape " + ss + ": E must be a multiple of --ranks");
    std::vector<Rank> ranks(o.ranks);
    for (int r = 0; r < o.ranks; ++r) setupRank(ranks[r], sh, o.ranks, r, o.ffn);
    double us[2];
    std::vector<uint16_t> y[2];
    for (int a = 0; a < 2; ++a) {
      poisonOutputs(ranks, sh, o.ffn);
      batch(ranks, sh, algos[a], o.commSms, o.ffn, comms, o.warmup, o.timeoutS);
      y[a] = expertRows(ranks, sh, o.ffn);
    }
    std::vector<double> t[2];
    for (int tr = 0; tr < o.trials; ++tr)
      for (int a = 0; a < 2; ++a)
        t[a].push_back(batch(ranks, sh, algos[a], o.commSms, o.ffn, comms, o.reps, o.timeoutS) /
                       o.reps);
    for (int a = 0; a < 2; ++a) {
      std::sort(t[a].begin(), t[a].end());
      us[a] = t[a][t[a].size() / 2] * 1e6;
    }
    const bool same = y[0] == y[1];
    const double flop = (o.ffn ? 6.0 : 2.0) * sh.T * sh.k * (double)sh.N * sh.H;
    j.beginObject();
    j.num("H", sh.H).num("N", sh.N).num("E", sh.E).num("k", sh.k).num("T", sh.T);
    for (int a = 0; a < 2; ++a) {
      j.beginObject(names[a]);
      j.num("us", us[a]).num("tflops_per_rank", flop / (us[a] * 1e-6) / 1e12);
      j.endObject();
    }
    j.num("speedup_fused", us[0] / us[1]);
    j.str("y_bitwise_equal", same ? "yes" : "no");
    j.endObject();
    char line[256];
    snprintf(line, sizeof(line),
             "H=%-5d N=%-5d E=%-4d k=%d T=%-6d  sequential %9.1f us  fused %9.1f us  "
             "speedup %.3fx  y %s\n",
             sh.H, sh.N, sh.E, sh.k, sh.T, us[0], us[1], us[0] / us[1],
             same ? "bitwise equal" : "DIFFERS");
    table += line;
    for (Rank& r : ranks) freeRank(r);
    if (!same) {
      j.endArray().endObject();
      printf("%s\n%s", j.text().c_str(), table.c_str());
      fatal("fused y differs from the sequential y at shape " + ss);
    }
  }
  j.endArray();
  j.endObject();
  if (!o.out.empty()) {
    FILE* f = fopen(o.out.c_str(), "w");
    if (!f) fatal("cannot write " + o.out);
    fprintf(f, "%s\n", j.text().c_str());
    fclose(f);
  }
  printf("%s\n%s", j.text().c_str(), table.c_str());
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  return 0;
}
