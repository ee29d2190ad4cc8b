// What k kernels side by side, each on its share of the SMs, keep of the GPU's throughput,
// against the same k kernels one after another on all SMs. Every fused path on one GPU runs
// that way (k ranks, each a persistent kernel on SMs / k CTAs, all resident at once), and on
// the H200 it lost per-SM throughput that the sequential paths (each rank's kernel on the
// whole GPU, in turn) keep: ring attention's fused kernel with 4 processes ran at 0.86 of the
// sequential path at 64K, with 2 at 0.98 (session 33), the MoE GEMMs on the ranks' shares
// 22.7 ms against 14.8 (session 28). This bench separates the cause from MPS and from the
// fused kernels' communication: one process, k streams, the stand-alone engines only.
//
//   bench_share_bench [--ranks 1,2,4] [--work attn,gemm] [--seq 65536] [--heads 16]
//                     [--gemm 8192x8192x8192] [--reps 5] [--out FILE] [--commit SHA]
//
// attn: rank r's kernel is its S/k queries (batch 1, --heads heads, head dim 128, bf16,
// non-causal) over all S keys as k sources; "shared" kernels read one k/v buffer (what the
// fused kernel's direct reads do), "own" each a copy of its own (what the sequential path's
// gather gives each rank). gemm: rank r's kernel is the engine's (M/k) x N x K GEMM on its own
// rows of A and one shared B. Rows per work and k:
//   turn    the k kernels on one stream, each on every SM;
//   share   the k kernels on k streams, each on SMs / k (the fused kernels' grids);
//   full    the k kernels on k streams, each on every SM (the sequential paths of ranks that
//           share a GPU, as they run under MPS).
// Times are medians of --reps runs of all k kernels (events around the whole set); the
// ratio column is turn / row (1.0: as fast as the kernels in turn). JSON with command,
// commit, device and date goes to --out (default bench/results/share-<date>.json).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_args.h"
#include "bench_cuda.cuh"
#include "fused/attention/attn.h"
#include "fused/gemm/gemm.h"

#define CK(x) BENCH_CK(x)
#define CKN(x)                                                                       \
  do {                                                                               \
    ncclResult_t r_ = (x);                                                           \
    if (r_ != ncclSuccess) {                                                         \
      fprintf(stderr, "%s:%d %s: ncclResult %d\n", __FILE__, __LINE__, #x, (int)r_); \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

namespace {

__nv_bfloat16* randomBf16(size_t n, uint64_t seed) {
  __nv_bfloat16* p = nullptr;
  CK(cudaMalloc(&p, n * sizeof(__nv_bfloat16)));
  benchcuda::fillKernel<<<1024, 256>>>(p, n, seed);
  CK(cudaGetLastError());
  return p;
}

enum Mode { kTurn = 0, kShare = 1, kFull = 2 };
const char* const kModeName[] = {"turn", "share", "full"};

// One rank's kernel on `stream` with `budget` SMs (0 = all).
struct Launcher {
  virtual ~Launcher() = default;
  virtual void launch(int rank, int budget, cudaStream_t stream) = 0;
};

struct AttnWork : Launcher {
  int k, S, H, D = 128;
  bool own;
  __nv_bfloat16 *q = nullptr, *kv = nullptr, *out = nullptr;
  size_t slice = 0;  // elements of one source (k or v)
  AttnWork(int ranks, int seq, int heads, bool ownCopies)
      : k(ranks), S(seq), H(heads), own(ownCopies) {
    const int local = S / k;
    slice = (size_t)local * H * D;
    q = randomBf16(slice * k, 1);
    // [copy][k|v][source][slice]: one copy shared, or one per rank.
    kv = randomBf16(slice * 2 * k * (own ? k : 1), 2);
    CK(cudaMalloc(&out, slice * k * sizeof(__nv_bfloat16)));
  }
  ~AttnWork() override {
    cudaFree(q);
    cudaFree(kv);
    cudaFree(out);
  }
  void launch(int rank, int budget, cudaStream_t stream) override {
    mk::attn::AttnArgs a;
    const int local = S / k;
    const __nv_bfloat16* base = kv + (own ? (size_t)rank * slice * 2 * k : 0);
    a.q = q + (size_t)rank * slice;
    a.k = base;
    a.v = base + slice * k;
    a.out = out + (size_t)rank * slice;
    a.B = 1;
    a.S = local;
    a.Hq = a.Hkv = H;
    a.D = D;
    a.seq.S = local;
    a.seq.chunks = 1;
    a.seq.nRanks = k;
    a.qRank = rank;
    a.nSrc = k;
    a.srcStride = (int64_t)slice;
    for (int j = 0; j < k; ++j) a.srcRank[j] = j;
    a.smBudget = budget;
    CKN(mk::attn::launch(a, stream));
  }
  double flops() const { return 4.0 * S * (double)S * H * D; }  // all k kernels
};

struct GemmWork : Launcher {
  int k, M, N, K;
  __nv_bfloat16 *A = nullptr, *B = nullptr, *Dm = nullptr;
  GemmWork(int ranks, int m, int n, int kk) : k(ranks), M(m), N(n), K(kk) {
    A = randomBf16((size_t)M * K, 3);
    B = randomBf16((size_t)N * K, 4);
    CK(cudaMalloc(&Dm, (size_t)M * N * sizeof(__nv_bfloat16)));
  }
  ~GemmWork() override {
    cudaFree(A);
    cudaFree(B);
    cudaFree(Dm);
  }
  void launch(int rank, int budget, cudaStream_t stream) override {
    mk::gemm::GemmArgs g;
    const int rows = M / k;
    g.M = rows;
    g.N = N;
    g.K = K;
    g.A = A + (size_t)rank * rows * K;
    g.B = B;
    g.D = Dm + (size_t)rank * rows * N;
    g.smBudget = budget;
    CKN(mk::gemm::launch(g, stream));
  }
  double flops() const { return 2.0 * M * (double)N * K; }
};

// Median ms of `reps` runs of all k kernels in `mode`.
double timeSet(Launcher& w, int k, int sms, Mode mode, int reps, std::vector<cudaStream_t>& st) {
  cudaEvent_t t0, t1;
  std::vector<cudaEvent_t> done(k);
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  for (auto& e : done) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  std::vector<float> ms;
  for (int rep = -1; rep < reps; ++rep) {  // rep -1: warm-up
    CK(cudaEventRecord(t0, st[0]));
    for (int r = 0; r < k; ++r) {
      cudaStream_t s = mode == kTurn ? st[0] : st[r];
      if (s != st[0]) CK(cudaStreamWaitEvent(s, t0, 0));
      w.launch(r, mode == kShare ? std::max(1, sms / k) : 0, s);
      if (s != st[0]) {
        CK(cudaEventRecord(done[r], s));
        CK(cudaStreamWaitEvent(st[0], done[r], 0));
      }
    }
    CK(cudaEventRecord(t1, st[0]));
    CK(cudaEventSynchronize(t1));
    float m = 0;
    CK(cudaEventElapsedTime(&m, t0, t1));
    if (rep >= 0) ms.push_back(m);
  }
  for (auto& e : done) cudaEventDestroy(e);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Row {
  std::string work;
  int k;
  double ms[3];
  double tflops[3];
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ranks = {1, 2, 4};
  std::vector<std::string> works = {"attn", "gemm"};
  int seq = 65536, heads = 16, reps = 5, gm = 8192, gn = 8192, gk = 8192;
  std::string out, commit = "unknown";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--ranks" && more) {
      ranks.clear();
      for (const std::string& x : benchargs::splitList(argv[++i])) ranks.push_back(atoi(x.c_str()));
    } else if (a == "--work" && more) {
      works = benchargs::splitList(argv[++i]);
      for (const std::string& x : works) {
        if (x != "attn" && x != "gemm") {
          fprintf(stderr, "--work: attn or gemm, not %s\n", x.c_str());
          return 2;
        }
      }
    } else if (a == "--seq" && more) {
      seq = atoi(argv[++i]);
    } else if (a == "--heads" && more) {
      heads = atoi(argv[++i]);
    } else if (a == "--gemm" && more) {
      if (sscanf(argv[++i], "%dx%dx%d", &gm, &gn, &gk) != 3) {
        fprintf(stderr, "--gemm MxNxK\n");
        return 2;
      }
    } else if (a == "--reps" && more) {
      reps = std::max(1, atoi(argv[++i]));
    } else if (a == "--out" && more) {
      out = argv[++i];
    } else if (a == "--commit" && more) {
      commit = argv[++i];
    } else {
      fprintf(stderr, "unknown option %s (see the comment at the top of share_bench.cu)\n",
              a.c_str());
      return 2;
    }
  }
  int dev = 0, nDev = 0;
  if (cudaGetDeviceCount(&nDev) != cudaSuccess || nDev == 0) {
    printf("share_bench: no GPU, nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  const int sms = prop.multiProcessorCount;
  const int kMax = *std::max_element(ranks.begin(), ranks.end());
  std::vector<cudaStream_t> st(std::max(1, kMax));
  for (auto& s : st) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  std::vector<Row> rows;
  printf(
      "| work | k | turn ms (TFLOP/s) | share ms (TFLOP/s) | full ms (TFLOP/s) | turn/share | "
      "turn/full |\n");
  printf("|---|---|---|---|---|---|---|\n");
  for (const std::string& wname : works) {
    for (int k : ranks) {
      if (k < 1 || (wname != "gemm" && seq % (k * 128) != 0) ||
          (wname == "gemm" && gm % (k * 128) != 0)) {
        fprintf(stderr, "skipping %s k=%d: the rows do not split into 128-row tiles\n",
                wname.c_str(), k);
        continue;
      }
      const std::vector<std::string> variants =
          wname == "attn" ? std::vector<std::string>{"attn-shared", "attn-own"}
                          : std::vector<std::string>{"gemm"};
      for (const std::string& v : variants) {
        std::unique_ptr<Launcher> w;
        double flops = 0;
        if (v == "gemm") {
          auto g = std::make_unique<GemmWork>(k, gm, gn, gk);
          flops = g->flops();
          w = std::move(g);
        } else {
          auto a = std::make_unique<AttnWork>(k, seq, heads, v == "attn-own");
          flops = a->flops();
          w = std::move(a);
        }
        CK(cudaDeviceSynchronize());
        Row row{v, k, {0, 0, 0}, {0, 0, 0}};
        for (int m = 0; m < 3; ++m) {
          row.ms[m] = timeSet(*w, k, sms, (Mode)m, reps, st);
          row.tflops[m] = flops / (row.ms[m] * 1e-3) / 1e12;
        }
        w.reset();
        CK(cudaDeviceSynchronize());
        printf("| %s | %d | %.2f (%.0f) | %.2f (%.0f) | %.2f (%.0f) | %.3f | %.3f |\n", v.c_str(),
               k, row.ms[0], row.tflops[0], row.ms[1], row.tflops[1], row.ms[2], row.tflops[2],
               row.ms[0] / row.ms[1], row.ms[0] / row.ms[2]);
        fflush(stdout);
        rows.push_back(row);
      }
    }
  }
  if (out.empty()) out = benchargs::utcNow("bench/results/share-%Y%m%d-%H%M%S.json");
  FILE* f = benchargs::openJson(out, "share", argc, argv, commit, prop.name, sms);
  if (f == nullptr) return 1;
  fprintf(f, "  \"seq\": %d,\n  \"heads\": %d,\n  \"gemm\": \"%dx%dx%d\",\n  \"reps\": %d,\n", seq,
          heads, gm, gn, gk, reps);
  fprintf(f, "  \"results\": [\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    fprintf(f, "    {\"work\": \"%s\", \"k\": %d", r.work.c_str(), r.k);
    for (int m = 0; m < 3; ++m)
      fprintf(f, ", \"%s_ms\": %.4f, \"%s_tflops\": %.2f", kModeName[m], r.ms[m], kModeName[m],
              r.tflops[m]);
    fprintf(f, "}%s\n", i + 1 < rows.size() ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  fclose(f);
  printf("wrote %s\n", out.c_str());
  return 0;
}
