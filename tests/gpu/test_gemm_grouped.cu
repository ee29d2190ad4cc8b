// Grouped GEMM of the engine (GemmArgs::groups, the MoE experts' GEMM): group g multiplies its
// rows of A by its own B_g, with starts and counts in device memory. Random group sizes
// (empty, single rows, several tiles, one hot group), gaps between groups that must stay
// untouched, both B layouts, 16-bit and fp32 outputs, beta, SM budgets, and the SwiGLU
// epilogue (D = silu(gate) * up of the product's two halves). Every valid row is compared
// with an fp64 reference; D is poisoned first.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "test_gemm_util.cuh"
#include "fused/gemm/dtype_built.h"
#include "fused/gemm/primitives.cuh"  // GemmParams, buildParams

using namespace gemmtest;
using mk::gemm::GemmArgs;

namespace {

// Rows marked 0 (outside every group and its last tile) must still hold the poison bytes.
__global__ void guardKernel(const uint8_t* D, int64_t rowBytes, const uint8_t* mark, int64_t rows,
                            unsigned long long* touched) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * rowBytes;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / rowBytes;
    if (mark[r] == 0 && D[i] != 0xFF) atomicAdd(touched, 1ull);
  }
}

struct GroupedCase {
  int groups, N, K;
  BLayout bl;
  DType dt;
  float beta;
  int budget;
  bool hot;             // one group takes most rows
  bool swiglu = false;  // GemmArgs::swiglu: D [M, N/2]
  float alpha = 1.0f;
  int padD = 0;      // ldd = D's width + padD (odd: the direct-store epilogue); pads stay poisoned
  int pipeline = 0;  // GemmArgs::pipeline (1 deep, 2 wide epilogue staging, 3 ping-pong)
  bool dynamic = false;   // GemmArgs::tileClaim: the dynamic tile schedule
  int groupM = 0;         // GemmArgs::groupM (row blocks per raster band; 0 automatic)
  int storeHint = 0;      // GemmArgs::storeHint (1 evict-first, 2 none, 0 automatic)
  int cluster = 0;        // GemmArgs::cluster (2: CTA pairs)
  int wantCluster = 0;    // nonzero: buildParams must resolve GemmParams::cluster to it
  int wantPingpong = -1;  // >= 0: buildParams must resolve GemmParams::pingpong to it
  int wantCarry = -1;     // >= 0: buildParams must resolve GemmParams::carry to it
  int wantClaims = -1;    // >= 0: autoClaims must answer it (1: the launch claims its tiles)
  int wantUnitN = 0;      // nonzero: buildParams must resolve GemmParams::unitN to it
  bool endAtM = false;    // the last group ends at D's last row, M not a tile multiple
};

// A case as the failure traces name it.
std::string describe(const GroupedCase& c) {
  return std::to_string(c.groups) + " groups, N=" + std::to_string(c.N) +
         " K=" + std::to_string(c.K) + (c.bl == BLayout::kKN ? " B[g][K,N]" : " B[g][N,K]") +
         " out " + mk::gemm::dtypeName(c.dt) + " budget " + std::to_string(c.budget) +
         (c.swiglu ? " swiglu" : "") + " pipeline " + std::to_string(c.pipeline) +
         (c.cluster == 2 ? " pairs" : "") + (c.dynamic ? " claimed" : "") +
         (c.endAtM ? " ending at M" : "");
}

// ref [rows][N] (the product) -> act [rows][N/2] = silu(gate) * up, in fp64.
__global__ void swigluRefKernel(int64_t rows, int N, const double* ref, double* act) {
  const int half = N / 2;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * half;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / half, j = i - r * half;
    const double g = ref[r * N + j], u = ref[r * N + half + j];
    act[i] = g / (1.0 + exp(-g)) * u;
  }
}

std::string runGrouped(const GroupedCase& c, uint64_t seed) {
  if (!mk::gemm::dtypeBuilt(c.dt)) {  // a -DMK_BUILD_F16=OFF build (bf16-only GPU calls)
    printf("[ skipped  ] %s: fp16 kernels not in this build\n", describe(c).c_str());
    return "";
  }
  std::mt19937_64 rng(seed);
  const int64_t tm = mk::gemm::kTileM;
  std::vector<int32_t> start(c.groups), count(c.groups);
  std::vector<uint8_t> mark;  // per row: 0 guard, 1 valid, 2 padding of a group's last tile
  int64_t cur = 0;
  for (int g = 0; g < c.groups; ++g) {
    if (rng() % 3 == 0) {  // a guard tile before this group
      mark.insert(mark.end(), tm, 0);
      cur += tm;
    }
    int n = (int)(rng() % 5 == 0 ? 0 : 1 + rng() % 300);
    if (c.hot && g == 1) n = 1000 + (int)(rng() % 200);
    // endAtM: D ends at most half-way into the last group's last tile, so one warpgroup's half
    // of that tile lies wholly past M.
    const bool last = c.endAtM && g == c.groups - 1;
    if (last) n = (int)(tm * (rng() % 3) + 1 + rng() % (tm / 2));
    start[g] = (int32_t)cur;
    count[g] = n;
    const int64_t span = last ? n : (n + tm - 1) / tm * tm;
    for (int64_t r = 0; r < span; ++r) mark.push_back(r < n ? 1 : 2);
    cur += span;
  }
  // A trailing guard tile: inside D, or with endAtM past it (D's buffers hold it, GemmArgs::M
  // does not: a store past M would land there).
  mark.insert(mark.end(), tm, 0);
  if (!c.endAtM) cur += tm;
  const int M = (int)cur, N = c.N, K = c.K, G = c.groups;
  const int64_t dRows = (int64_t)mark.size();  // D's and C's buffers: M rows, or M + a tile
  const int W = c.swiglu ? N / 2 : N;          // D's width
  const int64_t lda = K, ldb = c.bl == BLayout::kKN ? N : K, ldd = W + c.padD;
  const int64_t bRows = c.bl == BLayout::kKN ? K : N;
  const size_t esD = c.dt == DType::kF32 ? 4 : 2;

  void *A = nullptr, *B = nullptr, *C = nullptr, *D = nullptr;
  int32_t *dStart = nullptr, *dCount = nullptr;
  uint8_t* dMark = nullptr;
  double* ref = nullptr;
  CmpResult* cmp = nullptr;
  unsigned long long* touched = nullptr;
  int32_t* claim = nullptr;
  int64_t claimWant = 0;  // dynamic: every tile claimed once, plus one failed claim per CTA
  std::string err;
  auto ck = [&](cudaError_t e, const char* what) {
    if (e != cudaSuccess && err.empty()) err = std::string(what) + ": " + cudaGetErrorString(e);
    return e == cudaSuccess;
  };
  if (ck(cudaMalloc(&A, (size_t)M * lda * 2), "A") &&
      ck(cudaMalloc(&B, (size_t)G * bRows * ldb * 2), "B") &&
      ck(cudaMalloc(&C, (size_t)dRows * ldd * esD), "C") &&
      ck(cudaMalloc(&D, (size_t)dRows * ldd * esD), "D") &&
      ck(cudaMalloc(&dStart, G * sizeof(int32_t)), "start") &&
      ck(cudaMalloc(&dCount, G * sizeof(int32_t)), "count") &&
      ck(cudaMalloc(&dMark, mark.size()), "mark") &&
      ck(cudaMalloc(&ref, (size_t)(300 + 1200) * (N + W) * sizeof(double)), "ref") &&
      ck(cudaMalloc(&cmp, sizeof(CmpResult)), "cmp") &&
      ck(cudaMalloc(&touched, sizeof(unsigned long long)), "touched") &&
      ck(cudaMalloc(&claim, sizeof(int32_t)), "claim") &&
      ck(cudaMemset(claim, 0, sizeof(int32_t)), "claim zero")) {
    fillRandom(A, M, K, lda, DType::kBF16, seed * 4 + 1);
    fillRandom(B, (int64_t)G * bRows, c.bl == BLayout::kKN ? N : K, ldb, DType::kBF16,
               seed * 4 + 2);
    fillRandom(C, M, W, ldd, c.dt, seed * 4 + 3);
    cudaMemset(D, 0xFF, (size_t)dRows * ldd * esD);
    cudaMemcpy(dStart, start.data(), G * sizeof(int32_t), cudaMemcpyHostToDevice);
    cudaMemcpy(dCount, count.data(), G * sizeof(int32_t), cudaMemcpyHostToDevice);
    cudaMemcpy(dMark, mark.data(), mark.size(), cudaMemcpyHostToDevice);
    GemmArgs g;
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = A;
    g.B = B;
    g.bLayout = c.bl;
    g.abType = DType::kBF16;
    g.D = D;
    g.dType = c.dt;
    g.beta = c.beta;
    g.C = c.beta != 0.0f ? C : nullptr;
    g.smBudget = c.budget;
    g.groups.num = G;
    g.groups.rowStart = dStart;
    g.groups.rowCount = dCount;
    g.swiglu = c.swiglu;
    g.alpha = c.alpha;
    g.ldd = ldd;
    g.pipeline = c.pipeline;
    g.groupM = c.groupM;
    g.storeHint = c.storeHint;
    g.cluster = c.cluster;
    if (c.wantCluster != 0 || c.wantPingpong >= 0 || c.wantCarry >= 0 || c.wantUnitN != 0) {
      mk::gemm::GemmParams gp;
      int32_t grid = 0;
      if (mk::gemm::buildParams(g, &gp, &grid) != ncclSuccess)
        err = "buildParams failed";
      else if (c.wantCluster != 0 && gp.cluster != c.wantCluster)
        err = "the call did not resolve to cluster " + std::to_string(c.wantCluster);
      else if (c.wantPingpong >= 0 && gp.pingpong != c.wantPingpong)
        err = "the call did not resolve to pingpong " + std::to_string(c.wantPingpong);
      else if (c.wantUnitN != 0 && gp.unitN != c.wantUnitN)
        err = "the call did not resolve to " + std::to_string(c.wantUnitN) + "-column units";
      // The kernel carries only through its store threads (storeWarps 1, beta 0).
      else if (c.wantCarry >= 0 && (gp.carry != c.wantCarry ||
                                    (c.wantCarry == 1 && (gp.storeWarps != 1 || gp.beta != 0.0f))))
        err = "the call did not resolve to carry " + std::to_string(c.wantCarry) +
              " (with store threads)";
    }
    if (c.wantClaims >= 0 && mk::gemm::autoClaims(g, c.budget) != (c.wantClaims == 1))
      err = std::string("autoClaims did not answer ") + (c.wantClaims == 1 ? "true" : "false");
    if (c.dynamic) {
      g.tileClaim = claim;
      int sms = 0;
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
      int64_t tiles = 0;
      for (int gi = 0; gi < G; ++gi) tiles += (count[gi] + tm - 1) / tm * mk::gemm::tilesN(g);
      claimWant = tiles + (c.budget > 0 && c.budget < sms ? c.budget : sms);
    }
    const ncclResult_t r = err.empty() ? mk::gemm::launch(g, 0) : ncclSuccess;
    if (r != ncclSuccess) err = "launch failed: " + std::to_string((int)r);
    if (err.empty()) ck(cudaDeviceSynchronize(), "grouped GEMM");
  }
  // Every group's valid rows against its own reference.
  for (int gi = 0; gi < G && err.empty(); ++gi) {
    if (count[gi] == 0) continue;
    const char* a = static_cast<const char*>(A) + (size_t)start[gi] * lda * 2;
    const char* b = static_cast<const char*>(B) + (size_t)gi * bRows * ldb * 2;
    const char* cc = static_cast<const char*>(C) + (size_t)start[gi] * ldd * esD;
    const char* d = static_cast<const char*>(D) + (size_t)start[gi] * ldd * esD;
    dim3 grid((N + 15) / 16, (count[gi] + 15) / 16), block(16, 16);
    refKernel<<<grid, block>>>(count[gi], N, K, a, lda, b, ldb, c.bl, DType::kBF16, cc, ldd, c.dt,
                               c.alpha, c.beta, ref);
    CmpResult init = {0, ~0ull, 0, 0, 0};
    cudaMemcpy(cmp, &init, sizeof(init), cudaMemcpyHostToDevice);
    // A product's fp32 accumulation error is ~2e-5 sqrt(K); SwiGLU scales it by about |gate|
    // + |up| (both below ~sqrt(K) for these inputs).
    const double accTol = 2e-5 * std::sqrt((double)K);
    const double atol =
        (c.swiglu ? accTol * 3 * std::sqrt((double)K) : accTol) + (c.dt == DType::kF32 ? 0 : 1e-3);
    const double* want = ref;
    if (c.swiglu) {
      double* act = ref + (size_t)count[gi] * N;
      swigluRefKernel<<<256, 256>>>(count[gi], N, ref, act);
      want = act;
    }
    compareKernel<<<256, 256>>>(count[gi], W, d, ldd, c.dt, want, outRtol(c.dt), atol, cmp);
    CmpResult res;
    if (!ck(cudaMemcpy(&res, cmp, sizeof(res), cudaMemcpyDeviceToHost), "compare")) break;
    if (res.bad != 0)
      err = "group " + std::to_string(gi) + " (start " + std::to_string(start[gi]) + ", " +
            std::to_string(count[gi]) + " rows): " + std::to_string(res.bad) +
            " bad elements, first at row " + std::to_string(res.firstBad / W);
    else if (res.padTouched != 0)
      err = "group " + std::to_string(gi) + ": " + std::to_string(res.padTouched) +
            " elements written past D's width";
  }
  if (err.empty() && c.dynamic) {
    int32_t got = 0;
    if (ck(cudaMemcpy(&got, claim, sizeof(got), cudaMemcpyDeviceToHost), "claim") &&
        got != claimWant)
      err = "tile claim counter " + std::to_string(got) + ", want " + std::to_string(claimWant) +
            " (tiles + CTAs)";
  }
  if (err.empty()) {
    cudaMemset(touched, 0, sizeof(unsigned long long));
    guardKernel<<<256, 256>>>(static_cast<const uint8_t*>(D), ldd * (int64_t)esD, dMark, dRows,
                              touched);
    unsigned long long t = 0;
    if (ck(cudaMemcpy(&t, touched, sizeof(t), cudaMemcpyDeviceToHost), "guard") && t != 0)
      err = std::to_string(t) + " bytes written outside the groups' tiles";
  }
  cudaFree(A);
  cudaFree(B);
  cudaFree(C);
  cudaFree(D);
  cudaFree(dStart);
  cudaFree(dCount);
  cudaFree(dMark);
  cudaFree(ref);
  cudaFree(cmp);
  cudaFree(touched);
  cudaFree(claim);
  return err;
}

}  // namespace

TEST(GemmGrouped, RandomGroupsLayoutsTypes) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  const GroupedCase cases[] = {
      {1, 264, 136, BLayout::kNK, DType::kBF16, 0.0f, 0, false},
      {5, 72, 64, BLayout::kNK, DType::kBF16, 0.0f, 0, false},
      {5, 520, 1024, BLayout::kKN, DType::kBF16, 0.0f, 0, false},
      {17, 264, 264, BLayout::kNK, DType::kF32, 0.0f, 0, true},
      {17, 136, 200, BLayout::kKN, DType::kF16, 0.5f, 3, true},
      {40, 256, 128, BLayout::kNK, DType::kBF16, -1.0f, 7, false},
      // SwiGLU epilogue: D [M, N/2]. I = N/2 a tile multiple, with a column tail (I = 200:
      // the second tile's gate rows run into up rows, its columns past I are never stored),
      // a small I below one tile, fp16 out, SM budgets, a hot group.
      {3, 512, 256, BLayout::kNK, DType::kBF16, 0.0f, 0, false, true},
      {9, 400, 136, BLayout::kNK, DType::kBF16, 0.0f, 5, true, true},
      {5, 48, 64, BLayout::kNK, DType::kF16, 0.0f, 0, false, true},
      {17, 272, 264, BLayout::kNK, DType::kF16, 0.0f, 3, true, true},
      // alpha applied once, before silu; padded rows (TMA store) and odd ldd (direct stores).
      {4, 384, 128, BLayout::kNK, DType::kBF16, 0.0f, 0, false, true, 0.5f, 8},
      {4, 272, 200, BLayout::kNK, DType::kF16, 0.0f, 0, false, true, 1.0f, 1},
      // The wide epilogue staging (pipeline 2): plain both layouts, beta, SwiGLU, odd ldd.
      {5, 520, 1024, BLayout::kKN, DType::kBF16, 0.0f, 0, false, false, 1.0f, 0, 2},
      {17, 136, 200, BLayout::kNK, DType::kF16, 0.5f, 3, true, false, 1.0f, 0, 2},
      {9, 400, 136, BLayout::kNK, DType::kBF16, 0.0f, 5, true, true, 1.0f, 0, 2},
      {4, 272, 200, BLayout::kNK, DType::kF16, 0.0f, 0, false, true, 1.0f, 1, 2},
      // A last column block of at most 128 columns (N % 256 in 1..128, as 72, 264 and 520
      // above): beta with both B layouts, the direct-store epilogue, fp32 out, exactly 128
      // columns (N 384, 640, 1408: the small MoE model's I), budgets, the deep ring (pipeline 1).
      {17, 384, 200, BLayout::kKN, DType::kF16, 0.5f, 3, true},
      {17, 384, 200, BLayout::kNK, DType::kF16, 0.5f, 3, true},
      {9, 330, 520, BLayout::kNK, DType::kF32, -1.0f, 0, true, false, 1.0f, 1},
      {9, 300, 136, BLayout::kNK, DType::kBF16, 0.0f, 0, true, false, 1.0f, 1},
      {12, 1408, 328, BLayout::kNK, DType::kF32, 0.0f, 0, true},
      {6, 640, 256, BLayout::kNK, DType::kBF16, 0.0f, 5, false, false, 1.0f, 0, 1},
      // The ping-pong consumers (pipeline 3, 16-bit D; session 31): a last column block of at
      // most 128 columns is one half tile, whose empty half WG1 skips (N 72, 330, 384, 520,
      // 640, 1408), and without a tail (256); both layouts, beta, alpha, the direct-store
      // epilogue (odd ldd), budgets, a hot group.
      {5, 520, 1024, BLayout::kKN, DType::kBF16, 0.0f, 0, false, false, 1.0f, 0, 3},
      {17, 384, 200, BLayout::kNK, DType::kF16, 0.5f, 3, true, false, 1.0f, 0, 3},
      {17, 384, 200, BLayout::kKN, DType::kBF16, 0.0f, 1, true, false, -0.5f, 0, 3},
      {9, 330, 520, BLayout::kNK, DType::kBF16, -1.0f, 0, true, false, 1.0f, 1, 3},
      {12, 1408, 328, BLayout::kNK, DType::kBF16, 0.0f, 0, true, false, 1.0f, 0, 3},
      {40, 256, 128, BLayout::kNK, DType::kBF16, -1.0f, 7, false, false, 1.0f, 0, 3},
      {5, 72, 64, BLayout::kNK, DType::kF16, 0.0f, 0, false, false, 0.5f, 0, 3},
      {6, 640, 256, BLayout::kKN, DType::kF16, 0.0f, 5, false, false, 1.0f, 0, 3},
      // The 192-column units (pipeline 4, 16-bit D with 16-byte rows; session 57): a last unit
      // of 136 columns (520), two whole units (384), less than one (72, 136), both layouts, beta
      // (the register stores) and alpha, padded rows, budgets of 1, 3, 5 and 7 CTAs (odd and even
      // unit counts a CTA), a hot group, N 1408 (the small MoE model's I: a last unit of 64
      // columns; 176-column units under MKERNEL_GEMM_UNIT_NARROW 2, GemmGrouped.NarrowUnits).
      {5, 520, 1024, BLayout::kKN, DType::kBF16, 0.0f, 0, false, false, 1.0f, 0, 4},
      {17, 384, 200, BLayout::kNK, DType::kF16, 0.5f, 3, true, false, 1.0f, 0, 4},
      {17, 384, 200, BLayout::kKN, DType::kBF16, 0.0f, 1, true, false, -0.5f, 8, 4},
      {12, 1408, 328, BLayout::kNK, DType::kBF16, 0.0f, 0, true, false, 1.0f, 0, 4},
      {40, 256, 128, BLayout::kNK, DType::kBF16, -1.0f, 7, false, false, 1.0f, 0, 4},
      {5, 72, 64, BLayout::kNK, DType::kF16, 0.0f, 0, false, false, 0.5f, 0, 4},
      {9, 136, 520, BLayout::kKN, DType::kBF16, 0.0f, 5, true, false, 1.0f, 8, 4},
      // The carried epilogue (pipeline 6, B [N,K], 16-bit D; session 58): one CTA and a few
      // (every tile's second half carried into the next tile, across groups), all SMs, a last
      // column block of at most 128 columns (1408, 520, 72: nothing carried), of 184 (440: one
      // box of it carried), whole tiles (256), alpha, padded rows; beta and an odd ldd (the
      // kernel then runs the deep ring's epilogue).
      {17, 520, 264, BLayout::kNK, DType::kBF16, 0.0f, 1, true, false, 1.0f, 0, 6},
      {9, 440, 264, BLayout::kNK, DType::kBF16, 0.0f, 3, true, false, 1.0f, 0, 6},
      {12, 1408, 328, BLayout::kNK, DType::kBF16, 0.0f, 0, true, false, 1.0f, 0, 6},
      {40, 256, 128, BLayout::kNK, DType::kF16, 0.0f, 7, false, false, 1.0f, 0, 6},
      {5, 72, 64, BLayout::kNK, DType::kF16, 0.0f, 3, false, false, 0.5f, 0, 6},
      {9, 520, 1024, BLayout::kNK, DType::kBF16, 0.0f, 5, true, false, 1.0f, 8, 6},
      {17, 384, 200, BLayout::kNK, DType::kF16, 0.5f, 3, true, false, 1.0f, 0, 6},
      {9, 330, 520, BLayout::kNK, DType::kBF16, 0.0f, 0, true, false, 1.0f, 1, 6},
  };
  int i = 0;
  for (const GroupedCase& c : cases) {
    SCOPED_TRACE("case " + std::to_string(i) + ": " + describe(c));
    EXPECT_EQ(runGrouped(c, seed + 7919 * (++i)), "");
  }
}

// 176-column units (pipeline 4 with MKERNEL_GEMM_UNIT_NARROW, session 63): setting 2's exact
// fits (1408 = 8 units, 352 = 2) and, forced with setting 1, units whose last one ends
// inside its whole 64-column boxes (200: 24 columns), inside the register-stored 48 columns
// (520: 168 of 176; 136: one 8-column group of them) or is less than a box (72); beta (every
// column from registers, the half set of groups included), alpha, padded rows, budgets, a hot
// group; B [K,N] keeps 192 columns. Each case checks the width buildParams resolved.
TEST(GemmGrouped, NarrowUnits) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  const int kN = mk::gemm::kPingUnitNarrowN, kW = mk::gemm::kPingUnitN;
  GroupedCase fits[] = {
      {12, 1408, 328, BLayout::kNK, DType::kBF16, 0.0f, 0, true, false, 1.0f, 0, 4},
      {17, 352, 200, BLayout::kNK, DType::kBF16, 0.5f, 3, true, false, 1.0f, 0, 4},
      {9, 1408, 520, BLayout::kNK, DType::kBF16, 0.0f, 5, false, false, -0.5f, 8, 4},
  };
  GroupedCase forced[] = {
      {5, 200, 1024, BLayout::kNK, DType::kBF16, 0.0f, 1, false, false, 1.0f, 0, 4},
      {17, 520, 200, BLayout::kNK, DType::kBF16, 0.0f, 3, true, false, 1.0f, 8, 4},
      {17, 520, 200, BLayout::kNK, DType::kBF16, -1.0f, 7, true, false, 0.5f, 0, 4},
      {9, 136, 264, BLayout::kNK, DType::kBF16, 0.0f, 0, false, false, 1.0f, 0, 4},
      {5, 72, 64, BLayout::kNK, DType::kF16, 0.0f, 0, false, false, 0.5f, 0, 4},
      {5, 520, 1024, BLayout::kKN, DType::kBF16, 0.0f, 0, false, false, 1.0f, 0, 4},
  };
  int i = 0;
  {
    mktest::ScopedEnv env("MKERNEL_GEMM_UNIT_NARROW", "2");
    for (GroupedCase& c : fits) {
      c.wantUnitN = kN;
      SCOPED_TRACE("MKERNEL_GEMM_UNIT_NARROW=2, case " + std::to_string(i) + ": " + describe(c));
      EXPECT_EQ(runGrouped(c, seed + 7907 * (++i)), "");
    }
  }
  mktest::ScopedEnv env("MKERNEL_GEMM_UNIT_NARROW", "1");
  for (GroupedCase& c : forced) {
    c.wantUnitN = c.bl == BLayout::kNK ? kN : kW;
    SCOPED_TRACE("MKERNEL_GEMM_UNIT_NARROW=1, case " + std::to_string(i) + ": " + describe(c));
    EXPECT_EQ(runGrouped(c, seed + 7907 * (++i)), "");
  }
}

// The dynamic tile schedule (GemmArgs::tileClaim: CTAs claim tiles from a device counter, the
// MoE fused kernel's late-joining CTAs): 1 CTA, a few, and every SM (more CTAs than tiles:
// those find none and leave), both layouts, beta, fp32 out, SwiGLU, the wide staging, and the
// direct-store epilogue. The counter must end at tiles + CTAs (each tile claimed once, one
// failed claim per CTA): a run on the static schedule cannot pass.
TEST(GemmGrouped, DynamicTileClaim) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  GroupedCase cases[] = {
      {5, 520, 1024, BLayout::kKN, DType::kBF16, 0.0f, 1, false},
      {5, 72, 64, BLayout::kNK, DType::kBF16, 0.0f, 0, false},
      {17, 264, 264, BLayout::kNK, DType::kF32, 0.0f, 3, true},
      {17, 136, 200, BLayout::kKN, DType::kF16, 0.5f, 0, true},
      {40, 256, 128, BLayout::kNK, DType::kBF16, -1.0f, 7, false},
      {9, 400, 136, BLayout::kNK, DType::kBF16, 0.0f, 5, true, true},
      {4, 272, 200, BLayout::kNK, DType::kF16, 0.0f, 0, false, true, 1.0f, 1},
      {5, 520, 1024, BLayout::kNK, DType::kBF16, 0.0f, 2, true, false, 1.0f, 0, 2},
      {17, 136, 200, BLayout::kNK, DType::kF16, 0.5f, 0, true, false, 1.0f, 0, 1},
      {17, 520, 264, BLayout::kNK, DType::kBF16, 0.0f, 3, true, false, 1.0f, 0, 6},
  };
  int i = 0;
  for (GroupedCase& c : cases) {
    c.dynamic = true;
    SCOPED_TRACE("dynamic case " + std::to_string(i) + ": " + describe(c));
    EXPECT_EQ(runGrouped(c, seed + 104729 * (++i)), "");
  }
}

// The L2 choices grouped GEMMs take under MKERNEL_GEMM_GROUP_BAND / _HINT, set explicitly: bands
// of 3, 16 and 64 row blocks (a hot group of 8-10 row blocks walked in several bands, in one, or
// with a band larger than any group), D's stores evict-first or with no policy, on the static walk
// and on claimed tiles, both epilogue stagings; then the automatic choice with the settings on
// (the D here fits the L2, so the policy stays off: the bands and claims are what changes).
TEST(GemmGrouped, BandsAndStoreHint) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  GroupedCase cases[] = {
      {9, 520, 264, BLayout::kNK, DType::kBF16, 0.0f, 0, true},
      {9, 520, 264, BLayout::kNK, DType::kBF16, 0.0f, 0, true},
      {17, 264, 136, BLayout::kNK, DType::kF16, 0.5f, 3, true},
      {5, 1408, 200, BLayout::kNK, DType::kBF16, 0.0f, 0, true, false, 1.0f, 0, 2},
      {5, 1408, 200, BLayout::kKN, DType::kBF16, 0.0f, 0, true},
      {9, 400, 136, BLayout::kNK, DType::kBF16, 0.0f, 5, true, true},
  };
  const int bands[] = {3, 16, 64, 16, 64, 3};
  const int hints[] = {1, 2, 1, 1, 1, 2};
  int i = 0;
  for (int dyn = 0; dyn < 2; ++dyn) {
    for (size_t j = 0; j < sizeof(cases) / sizeof(cases[0]); ++j) {
      GroupedCase c = cases[j];
      c.groupM = bands[j];
      c.storeHint = hints[j];
      c.dynamic = dyn == 1;
      SCOPED_TRACE("case " + std::to_string(j) + (c.dynamic ? " claimed" : " static") +
                   ": groupM " + std::to_string(c.groupM) + " storeHint " +
                   std::to_string(c.storeHint) + ", N=" + std::to_string(c.N) +
                   (c.swiglu ? " swiglu" : "") + " pipeline " + std::to_string(c.pipeline));
      EXPECT_EQ(runGrouped(c, seed + 15485863 * (++i)), "");
    }
  }
  mktest::ScopedEnv band("MKERNEL_GEMM_GROUP_BAND", "64");
  mktest::ScopedEnv hint("MKERNEL_GEMM_GROUP_HINT", "1");
  mktest::ScopedEnv claim("MKERNEL_GEMM_GROUP_CLAIM", "1");
  for (size_t j = 0; j < sizeof(cases) / sizeof(cases[0]); ++j) {
    SCOPED_TRACE("automatic, settings on: case " + std::to_string(j));
    EXPECT_EQ(runGrouped(cases[j], seed + 15485863 * (++i)), "");
  }
}

// MKERNEL_GEMM_GROUP_UNITS=1 (session 57): pipeline 0 walks a grouped GEMM's 192-column units
// where the rule allows (16-bit D with 16-byte rows, beta 0, no SwiGLU), even with claimed tiles
// asked for by MKERNEL_GEMM_GROUP_CLAIM=1 (the unit walk is static), and keeps the tiles
// otherwise (beta, SwiGLU, fp32 D); every case against the fp64 reference.
TEST(GemmGrouped, UnitWalkSetting) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  mktest::ScopedEnv units("MKERNEL_GEMM_GROUP_UNITS", "1");
  mktest::ScopedEnv claim("MKERNEL_GEMM_GROUP_CLAIM", "1");
  mktest::ScopedEnv cl("MKERNEL_GEMM_CLUSTER", nullptr);
  mktest::ScopedEnv sk("MKERNEL_GEMM_STREAMK", nullptr);
  GroupedCase cases[] = {
      {9, 520, 264, BLayout::kNK, DType::kBF16, 0.0f, 3, true},
      {17, 1408, 200, BLayout::kKN, DType::kF16, 0.0f, 5, true},
      {5, 384, 136, BLayout::kNK, DType::kBF16, 0.5f, 3, true},
      {9, 400, 136, BLayout::kNK, DType::kBF16, 0.0f, 3, true, true},
      {9, 264, 136, BLayout::kNK, DType::kF32, 0.0f, 3, true},
  };
  const int want[] = {2, 2, 0, 0, 0};
  for (size_t j = 0; j < sizeof(cases) / sizeof(cases[0]); ++j) {
    GroupedCase c = cases[j];
    c.wantPingpong = want[j];
    SCOPED_TRACE("case " + std::to_string(j) + ": want pingpong " + std::to_string(want[j]));
    EXPECT_EQ(runGrouped(c, seed + 32452843 * (j + 1)), "");
  }
}

// MKERNEL_GEMM_GROUP_CARRY=1 (session 58): pipeline 0 runs a grouped GEMM with B [N,K], a 16-bit D
// and beta 0 on the carried epilogue, on the static walk and on tiles claimed under
// MKERNEL_GEMM_GROUP_CLAIM=1, and keeps the tiles otherwise (B [K,N], beta, SwiGLU, fp32 D); then
// the default settings (2), which carry or take the units by shape; every case against the fp64
// reference.
TEST(GemmGrouped, CarriedEpilogueSetting) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  mktest::ScopedEnv carry("MKERNEL_GEMM_GROUP_CARRY", "1");
  mktest::ScopedEnv units("MKERNEL_GEMM_GROUP_UNITS", nullptr);
  mktest::ScopedEnv cl("MKERNEL_GEMM_CLUSTER", nullptr);
  mktest::ScopedEnv sk("MKERNEL_GEMM_STREAMK", nullptr);
  GroupedCase cases[] = {
      {9, 520, 264, BLayout::kNK, DType::kBF16, 0.0f, 3, true},
      {17, 1408, 200, BLayout::kNK, DType::kF16, 0.0f, 5, true},
      {17, 1408, 200, BLayout::kKN, DType::kF16, 0.0f, 5, true},
      {5, 384, 136, BLayout::kNK, DType::kBF16, 0.5f, 3, true},
      {9, 400, 136, BLayout::kNK, DType::kBF16, 0.0f, 3, true, true},
      {9, 264, 136, BLayout::kNK, DType::kF32, 0.0f, 3, true},
  };
  const int want[] = {1, 1, 0, 0, 0, 0};
  int i = 0;
  for (const char* claimed : {"0", "1"}) {
    mktest::ScopedEnv claim("MKERNEL_GEMM_GROUP_CLAIM", claimed);
    for (size_t j = 0; j < sizeof(cases) / sizeof(cases[0]); ++j) {
      GroupedCase c = cases[j];
      c.wantCarry = want[j];
      c.wantClaims = claimed[0] == '1';  // every case: grouped, unhooked, unpaired
      SCOPED_TRACE("case " + std::to_string(j) + " (MKERNEL_GEMM_GROUP_CLAIM " + claimed +
                   "): want carry " + std::to_string(want[j]));
      EXPECT_EQ(runGrouped(c, seed + 49979687 * (++i)), "");
    }
  }
  // Setting 2 (the default, session 60): the carry past kWideMaxK or at N >= 4096 only, and
  // there only where MKERNEL_GEMM_GROUP_UNITS' default (session 61: K <= 2048 and N >= 2048) does
  // not take the call for the units (pingpong 2).
  mktest::ScopedEnv carry2("MKERNEL_GEMM_GROUP_CARRY", nullptr);
  mktest::ScopedEnv claim("MKERNEL_GEMM_GROUP_CLAIM", nullptr);
  GroupedCase byRule[] = {
      {3, 264, 4160, BLayout::kNK, DType::kBF16, 0.0f, 3, true},
      {3, 4096, 2056, BLayout::kNK, DType::kF16, 0.0f, 3, true},
      {9, 1408, 200, BLayout::kNK, DType::kBF16, 0.0f, 3, true},
      {3, 4096, 136, BLayout::kNK, DType::kF16, 0.0f, 3, true},
      {5, 2056, 2048, BLayout::kKN, DType::kBF16, 0.0f, 3, true},
  };
  const struct { int carry, pingpong; } wantByRule[] = {{1, 0}, {1, 0}, {0, 0}, {0, 2}, {0, 2}};
  for (size_t j = 0; j < sizeof(byRule) / sizeof(byRule[0]); ++j) {
    GroupedCase c = byRule[j];
    c.wantCarry = wantByRule[j].carry;
    c.wantPingpong = wantByRule[j].pingpong;
    c.wantClaims = 0;
    SCOPED_TRACE("default settings, case " + std::to_string(j) + ": want carry " +
                 std::to_string(c.wantCarry) + ", pingpong " + std::to_string(c.wantPingpong));
    EXPECT_EQ(runGrouped(c, seed + 49979687 * (++i)), "");
  }
}

// One small case per grouped pipeline (3 groups of at most 300 rows, 2 CTAs, so each CTA walks
// several tiles or units and carries across them), sized for compute-sanitizer within a device
// call: racecheck of CarriedEpilogueSetting ran past 390 s without a summary (session 62).
TEST(GemmGrouped, SanitizerSized) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  mktest::ScopedEnv cl("MKERNEL_GEMM_CLUSTER", nullptr);
  mktest::ScopedEnv sk("MKERNEL_GEMM_STREAMK", nullptr);
  const struct {
    int pipeline;
    float beta;
    const char* what;
  } runs[] = {{1, 0.0f, "deep ring"},
              {2, 0.0f, "wide staging"},
              {3, 0.0f, "ping-pong"},
              {4, 0.0f, "192-column units, staged"},
              {4, 0.5f, "units, register stores"},
              {6, 0.0f, "carried epilogue"}};
  int i = 0;
  for (const auto& r : runs) {
    GroupedCase c{3, 440, 192, BLayout::kNK, DType::kBF16, r.beta, 2, false};
    c.pipeline = r.pipeline;
    SCOPED_TRACE(std::string(r.what) + ": " + describe(c));
    EXPECT_EQ(runGrouped(c, seed + 86028121 * (++i)), "");
  }
}

// D ends inside the last group's last tile (M not a tile multiple; session 59): every grouped
// pipeline clips its stores at M, and the poisoned tile past M (in D's buffer, outside
// GemmArgs::M) stays untouched. The last group's count leaves the second half of its last tile
// (one warpgroup's rows) wholly past M. The automatic choice, the deep ring, the wide staging,
// SwiGLU, the ping-pong consumers, the 192-column units (a last unit of 56 columns) and the
// carried epilogue (a carried half of one box, or none); both layouts, the three outputs, beta
// and alpha; then claimed tiles and CTA pairs.
TEST(GemmGrouped, LastGroupEndsAtM) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  GroupedCase cases[] = {
      {5, 520, 264, BLayout::kNK, DType::kBF16, 0.0f, 0, false},
      {5, 520, 264, BLayout::kKN, DType::kF16, 0.5f, 3, false, false, 1.0f, 0, 1},
      {9, 330, 136, BLayout::kNK, DType::kF32, 0.0f, 0, true, false, 1.0f, 0, 1},
      {9, 400, 200, BLayout::kNK, DType::kBF16, 0.0f, 3, true, false, 1.0f, 0, 2},
      {5, 400, 136, BLayout::kNK, DType::kBF16, 0.0f, 0, false, true},
      {9, 520, 264, BLayout::kKN, DType::kBF16, 0.0f, 3, true, false, 1.0f, 0, 3},
      {9, 440, 264, BLayout::kNK, DType::kF16, 0.0f, 5, true, false, 1.0f, 0, 4},
      {9, 440, 264, BLayout::kNK, DType::kBF16, 0.0f, 3, true, false, 1.0f, 0, 6},
      {5, 72, 64, BLayout::kNK, DType::kF16, 0.0f, 1, false, false, 0.5f, 0, 6},
  };
  int i = 0;
  auto run = [&](GroupedCase c) {
    c.endAtM = true;
    SCOPED_TRACE("case " + std::to_string(i) + ": " + describe(c));
    EXPECT_EQ(runGrouped(c, seed + 15485863 * (++i)), "");
  };
  for (const GroupedCase& c : cases) run(c);
  for (int j : {0, 1, 7}) {  // the tiles, the deep ring, the carried epilogue: claimed
    GroupedCase c = cases[j];
    c.dynamic = true;
    run(c);
  }
  for (int j : {0, 1, 3}) {  // pairs: a last pair whose second tile lies past M
    GroupedCase c = cases[j];
    c.cluster = 2;
    c.budget = 2 * (j + 1);
    run(c);
  }
}

// CTA pairs (GemmArgs::cluster 2): each group's row tiles pair up (a pair's CTAs share the
// group's B, half loaded by each and multicast), so a group of an odd tile count ends in a pair
// whose second tile lies past the group: that CTA must store nothing (its rows are a guard tile,
// the next group's or past D; guardKernel and the next group's comparison see any write). Random
// counts (0 to 3 tiles, a hot group of 8-10), both layouts, both 16-bit outputs, beta, alpha,
// the direct-store epilogue (odd ldd), budgets of one pair to a few, the deep ring and the wide
// staging; then MKERNEL_GEMM_CLUSTER=2 pairing the automatic choice (with
// MKERNEL_GEMM_GROUP_CLAIM=1, which pairs must override: they walk the static schedule).
TEST(GemmGrouped, CtaPairs) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  const GroupedCase cases[] = {
      {5, 520, 1024, BLayout::kKN, DType::kBF16, 0.0f, 0, false},
      {5, 72, 64, BLayout::kNK, DType::kBF16, 0.0f, 2, false},
      {17, 264, 264, BLayout::kNK, DType::kF16, 0.0f, 0, true},
      {17, 136, 200, BLayout::kKN, DType::kF16, 0.5f, 6, true},
      {40, 256, 128, BLayout::kNK, DType::kBF16, -1.0f, 7, false},
      {9, 330, 520, BLayout::kNK, DType::kBF16, -1.0f, 0, true, false, 1.0f, 1},
      {6, 640, 256, BLayout::kNK, DType::kBF16, 0.0f, 5, false, false, 0.5f, 0, 1},
      {5, 520, 1024, BLayout::kNK, DType::kBF16, 0.0f, 3, true, false, 1.0f, 0, 2},
      {17, 384, 200, BLayout::kKN, DType::kF16, 0.5f, 0, true, false, 1.0f, 0, 2},
  };
  int i = 0;
  for (GroupedCase c : cases) {
    c.cluster = 2;
    SCOPED_TRACE("pairs case " + std::to_string(i) + ": " + describe(c));
    EXPECT_EQ(runGrouped(c, seed + 104723 * (++i)), "");
  }
  mktest::ScopedEnv pairs("MKERNEL_GEMM_CLUSTER", "2");
  mktest::ScopedEnv claim("MKERNEL_GEMM_GROUP_CLAIM", "1");
  for (size_t j = 0; j < 4; ++j) {
    GroupedCase c = cases[j];
    c.wantCluster = 2;  // paired by the environment, not claimed
    SCOPED_TRACE("MKERNEL_GEMM_CLUSTER=2: case " + std::to_string(j));
    EXPECT_EQ(runGrouped(c, seed + 104723 * (++i)), "");
  }
}
