// The grouped GEMM of bench/gemm_bench.cu (--groups G, the MoE experts' GEMM; one translation
// unit): G groups of M/G rows each, starting on 128-row boundaries, each with its own B [N,K]
// (B as [G][N][K]), the same FLOPs as the shape when G divides M. Its variants are timed
// interleaved with the plain engine's runs (main's rep loop calls timeRep), and every variant but
// the default is first checked element by element against the default's output. Kept apart from
// main's shape loop, which holds the plain engine's variants.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_cuda.cuh"
#include "fused/gemm/gemm.h"
#include "gemm_bench_report.cuh"
#include "gemm_bench_util.cuh"

namespace gemmbench {

// One way of running the grouped GEMM: GemmArgs::pipeline, groupM, storeHint and cluster (0:
// the engine's choice), on claimed tiles or the static walk.
struct GroupedVariant {
  std::string label;
  int pipeline, groupM, storeHint;
  bool claimed;
  int cluster;
  std::vector<float> ms;  // one timed run per rep
  float maxdiff;          // max relative difference from the default's output
};

class GroupedBench {
 public:
  // groups 0: nothing to run (every call below is then a no-op).
  GroupedBench(const Shape& sh, int groups, cudaStream_t stream) : sh_(sh), stream_(stream) {
    G_ = groups > 0 ? groups : 0;
    if (G_ == 0) return;
    rows_ = sh.M / G_;
    span_ = (rows_ + 127) / 128 * 128;
    bytesD_ = (size_t)G_ * span_ * sh.N * 2;
    ck(cudaMalloc(&A_, (size_t)G_ * span_ * sh.K * 2));
    ck(cudaMalloc(&B_, (size_t)G_ * sh.N * sh.K * 2));
    ck(cudaMalloc(&D_, bytesD_));
    ck(cudaMalloc(&claims_, sizeof(int32_t)));
    ck(cudaMalloc(&dmax_, sizeof(float)));
    benchcuda::fillKernel<<<2048, 256, 0, stream>>>((__nv_bfloat16*)A_, (size_t)G_ * span_ * sh.K,
                                                    77);
    benchcuda::fillKernel<<<2048, 256, 0, stream>>>((__nv_bfloat16*)B_, (size_t)G_ * sh.N * sh.K,
                                                    78);
    std::vector<int32_t> meta(2 * G_);  // [starts G][counts G]
    for (int g = 0; g < G_; ++g) meta[g] = g * span_, meta[G_ + g] = rows_;
    ck(cudaMalloc(&meta_, meta.size() * sizeof(int32_t)));
    ck(cudaMemcpy(meta_, meta.data(), meta.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    ck(cudaEventCreate(&ev_[0]));
    ck(cudaEventCreate(&ev_[1]));
    add("default", 0, 0, 0, false);
  }
  ~GroupedBench() {
    if (G_ == 0) return;
    cudaFree(A_);
    cudaFree(B_);
    cudaFree(D_);
    cudaFree(Dchk_);
    cudaFree(claims_);
    cudaFree(dmax_);
    cudaFree(meta_);
    cudaEventDestroy(ev_[0]);
    cudaEventDestroy(ev_[1]);
  }
  GroupedBench(const GroupedBench&) = delete;
  GroupedBench& operator=(const GroupedBench&) = delete;

  int groups() const { return G_; }
  int rows() const { return rows_; }

  // pipes: the deep ring, the wide staging, the ping-pong consumers, the 192-column units and the
  // carried epilogue (B here is [G][N][K], as pipeline 6 needs); claim: claimed tiles; band > 0 and
  // hint: the L2 choices of MKERNEL_GEMM_GROUP_BAND / _HINT set explicitly (bands of `band` row
  // blocks, D evict-first, both together, and with claim both on claimed tiles); pairs: as CTA
  // pairs (GemmArgs::cluster 2, each group's B tiles loaded half by each CTA and multicast to
  // both), with pipes the wide staging paired too.
  void addVariants(bool pipes, bool claim, int band, bool hint, bool pairs) {
    if (G_ == 0) return;
    if (pipes) {
      // The deep ring too: past K 4096 it was the grouped default until the carried epilogue took
      // its place (MKERNEL_GEMM_GROUP_CARRY).
      add("deep ring", 1, 0, 0, false);
      wide_ = add("wide staging", 2, 0, 0, false);
      ping_ = add("ping-pong", 3, 0, 0, false);
      add("192-column units", 4, 0, 0, false);
      add("carried epilogue", 6, 0, 0, false);
    }
    if (pairs) add("as CTA pairs", 0, 0, 0, false, 2);
    if (pairs && pipes) add("wide staging as CTA pairs", 2, 0, 0, false, 2);
    if (claim) claim_ = add("on claimed tiles", 0, 0, 0, true);
    // storeHint 2 = no policy, so a band variant measures the band alone whatever the default.
    const std::string b = "bands of " + std::to_string(band);
    if (band > 0) add(b + ", no L2 hint", 0, band, 2, false);
    if (hint) add("D evict-first", 0, 0, 1, false);
    if (band > 0 && hint) add(b + " + D evict-first", 0, band, 1, false);
    if (band > 0 && hint && claim) add(b + " + D evict-first, claimed tiles", 0, band, 1, true);
  }

  // Every variant but the default once into a poisoned buffer (NaN where nothing is written)
  // against the default's output, also poisoned first. Rows past a group's count are computed
  // from A's padding rows by every variant alike, so the whole buffer must agree.
  void check() {
    if (G_ == 0 || vars_.size() < 2) return;
    if (Dchk_ == nullptr) ck(cudaMalloc(&Dchk_, bytesD_));
    ck(cudaMemsetAsync(D_, 0xFF, bytesD_, stream_));
    run(vars_[0], D_);
    for (size_t v = 1; v < vars_.size(); ++v) {
      ck(cudaMemsetAsync(Dchk_, 0xFF, bytesD_, stream_));
      if (vars_[v].claimed) ck(cudaMemsetAsync(claims_, 0, sizeof(int32_t), stream_));
      run(vars_[v], Dchk_);
      ck(cudaMemsetAsync(dmax_, 0, sizeof(float), stream_));
      diffKernel<<<1024, 256, 0, stream_>>>((__nv_bfloat16*)Dchk_, (__nv_bfloat16*)D_, bytesD_ / 2,
                                            dmax_);
      ck(cudaMemcpyAsync(&vars_[v].maxdiff, dmax_, sizeof(float), cudaMemcpyDeviceToHost, stream_));
      ck(cudaStreamSynchronize(stream_));
    }
  }

  // One timed run of each variant (a claimed run's counter zeroed outside its timed window).
  void timeRep() {
    for (GroupedVariant& v : vars_) {
      if (v.claimed) ck(cudaMemsetAsync(claims_, 0, sizeof(int32_t), stream_));
      ck(cudaEventRecord(ev_[0], stream_));
      run(v, D_);
      ck(cudaEventRecord(ev_[1], stream_));
      ck(cudaEventSynchronize(ev_[1]));
      float ms = 0;
      ck(cudaEventElapsedTime(&ms, ev_[0], ev_[1]));
      v.ms.push_back(ms);
    }
  }

  // The row's grouped fields (0 where not run), and a line per variant.
  void finish(Row* row) const {
    row->grouped = row->groupedWide = row->groupedPing = row->groupedClaim = 0.0;
    if (G_ == 0) return;
    row->grouped = tflops(0);
    row->groupedWide = wide_ > 0 ? tflops(wide_) : 0.0;
    row->groupedPing = ping_ > 0 ? tflops(ping_) : 0.0;
    row->groupedClaim = claim_ > 0 ? tflops(claim_) : 0.0;
    for (size_t v = 1; v < vars_.size(); ++v) {
      const GroupedVariant& x = vars_[v];
      // (the wide staging and the ping-pong have fields above; pairs, units and the carried
      // epilogue are listed here)
      if (x.cluster != 2 && x.pipeline != 4 && x.pipeline != 6 &&
          (x.pipeline != 0 || (x.groupM == 0 && x.storeHint == 0)))
        continue;
      row->groupedL2.push_back({x.label, x.storeHint, x.groupM, tflops(v), x.maxdiff});
    }
  }
  void print(const Row& row) const {
    if (G_ == 0) return;
    const Shape& s = sh_;
    printf(
        "  %5d x %5d x %5d: grouped %d x %d rows %6.1f TFLOP/s (%.3f of the plain engine, "
        "%.3f of cuBLAS best)\n",
        s.M, s.N, s.K, G_, rows_, row.grouped, row.grouped / row.eng, row.grouped / row.best);
    for (size_t v = 1; v < vars_.size(); ++v)
      printf(
          "  %5d x %5d x %5d: grouped %s %6.1f TFLOP/s (%.3f of the grouped default, max rel "
          "diff from it %.2e)\n",
          s.M, s.N, s.K, vars_[v].label.c_str(), tflops(v), tflops(v) / row.grouped,
          vars_[v].maxdiff);
  }

 private:
  static void ck(cudaError_t e) {
    if (e != cudaSuccess) {
      fprintf(stderr, "grouped bench: %s\n", cudaGetErrorString(e));
      exit(1);
    }
  }
  size_t add(const std::string& label, int pipeline, int groupM, int storeHint, bool claimed,
             int cluster = 0) {
    vars_.push_back({label, pipeline, groupM, storeHint, claimed, cluster, {}, 0.0f});
    return vars_.size() - 1;
  }
  // Grouped FLOPs: G x (M/G) rows, which is the shape's M when G divides it.
  double tflops(size_t v) const {
    const double ms = median(vars_[v].ms);
    return ms > 0 ? 2.0 * G_ * (double)rows_ * sh_.N * sh_.K / (ms * 1e-3) / 1e12 : 0.0;
  }
  void run(const GroupedVariant& v, void* dst) {
    mk::gemm::GemmArgs g;
    g.M = G_ * span_;
    g.N = sh_.N;
    g.K = sh_.K;
    g.A = A_;
    g.B = B_;
    g.D = dst;
    g.groups.num = G_;
    g.groups.rowStart = meta_;
    g.groups.rowCount = meta_ + G_;
    g.pipeline = v.pipeline;
    g.groupM = v.groupM;
    g.storeHint = v.storeHint;
    g.cluster = v.cluster;
    if (v.claimed) g.tileClaim = claims_;  // zeroed by the caller, outside any timed window
    if (mk::gemm::launch(g, stream_) != ncclSuccess) {
      fprintf(stderr, "grouped engine launch failed (%s)\n", v.label.c_str());
      exit(1);
    }
  }

  Shape sh_;
  cudaStream_t stream_;
  int G_ = 0, rows_ = 0, span_ = 0;
  size_t bytesD_ = 0;
  void *A_ = nullptr, *B_ = nullptr, *D_ = nullptr, *Dchk_ = nullptr;
  int32_t *meta_ = nullptr, *claims_ = nullptr;
  float* dmax_ = nullptr;
  cudaEvent_t ev_[2];
  std::vector<GroupedVariant> vars_;
  size_t wide_ = 0, ping_ = 0, claim_ = 0;  // indices into vars_ (0: not asked for)
};

}  // namespace gemmbench
