// Correctness of the Hopper GEMM engine (fused/gemm) against an fp64 reference and cuBLAS:
// tails, both B layouts, every input/output type, beta != 0, padded and unaligned leading
// dimensions, SM budgets and tile orders. Outputs are poisoned (0xFF = NaN) before each run
// and every element is checked.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <random>

#include "fused/gemm/primitives.cuh"  // GemmParams, buildParams
#include "test_gemm_util.cuh"

using namespace gemmtest;
using mk::gemm::GemmArgs;

namespace {

bool sm90(std::string* why) {
  if (!mktest::haveGpu(why)) return false;
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major != 9 || minor != 0) {
    *why = "GEMM engine needs sm_90 (found sm_" + std::to_string(major * 10 + minor) + ")";
    return false;
  }
  return true;
}

#define REQUIRE_SM90()                                            \
  do {                                                            \
    std::string why_;                                             \
    if (!sm90(&why_)) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)

// Runs one problem through the engine (its args, then `edit`) and checks it; returns "" on
// success.
std::string runAndCheck(Problem& p, uint64_t seed,
                        const std::function<void(GemmArgs&)>& edit = nullptr) {
  p.alloc();
  p.randomize(seed);
  p.poison();
  p.reference();
  GemmArgs g = p.args();
  if (edit) edit(g);
  ncclResult_t r = mk::gemm::launch(g, 0);
  if (r != ncclSuccess) return "launch failed: " + std::to_string((int)r);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return std::string("kernel failed: ") + cudaGetErrorString(e);
  return p.check();
}

// Whether buildParams resolves `g` (as runAndCheck launches it) to params that `ok` accepts:
// a request honoured, not only tolerated.
bool resolvesTo(const GemmArgs& g, const std::function<bool(const mk::gemm::GemmParams&)>& ok) {
  mk::gemm::GemmParams gp;
  int32_t grid = 0;
  return mk::gemm::buildParams(g, &gp, &grid) == ncclSuccess && ok(gp);
}

const DType kIn[] = {DType::kBF16, DType::kF16};
const DType kOut[] = {DType::kBF16, DType::kF16, DType::kF32};
const BLayout kLayouts[] = {BLayout::kKN, BLayout::kNK};

// The ping-pong tests' problems (GemmCorrectness.PingPong, PingPong192): the `fixed` shapes,
// then 24 drawn ones with tails in M, N and K; both B layouts and input types, 16-bit outputs,
// alpha, beta (C separate), padded leading dimensions (D by 0 or 8 elements). tmaD: N drawn as a
// multiple of 8 (16-byte rows, the TMA store), else any N (odd N unpadded: the direct-store
// epilogue). run(p, n, budget) runs and checks problem n with a drawn SM budget (0: all).
template <class Run>
void forPingProblems(uint64_t seed, const std::vector<std::array<int, 3>>& fixed, bool tmaD,
                     Run&& run) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return lo + (int)(rng() % (uint64_t)(hi - lo + 1)); };
  const int kRandom = 24;
  const int budgets[] = {0, 1, 3, 7};
  for (int n = 0; n < (int)fixed.size() + kRandom; ++n) {
    int M, N, K;
    if (n < (int)fixed.size()) {
      M = fixed[n][0];
      N = fixed[n][1];
      K = fixed[n][2];
    } else {
      M = pick(1, 1100);
      N = tmaD ? 8 * pick(1, 162) : pick(1, 1300);
      K = 8 * pick(1, 200);
    }
    const BLayout bl = kLayouts[rng() % 2];
    const DType in = kIn[rng() % 2];
    const DType out = (rng() % 2) ? DType::kBF16 : DType::kF16;
    // B[K,N] needs 16-byte rows.
    const int64_t padB = bl == BLayout::kKN ? (8 - N % 8) % 8 : 0;
    const int64_t padD = (rng() % 3 == 0) ? 0 : 8;
    Problem p(M, N, K, bl, in, out, (rng() % 2) ? 8 : 0, padB, padD);
    p.alpha = (rng() % 2) ? 1.0f : -0.5f;
    p.beta = (rng() % 3 == 0) ? 0.75f : 0.0f;
    run(p, n, budgets[rng() % 4]);
  }
}

}  // namespace

// Small problem, all paths touched once: the compute-sanitizer target.
TEST(GemmSmall, TailsBetaBothLayouts) {
  REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  for (BLayout bl : kLayouts) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      Problem p(129, 264, 72, bl, DType::kBF16, dt);
      p.beta = 0.5f;
      SCOPED_TRACE(p.name());
      EXPECT_EQ(runAndCheck(p, seed), "");
      // One CTA (or one CTA pair) for all tiles, each pipeline: stages are given back and
      // loaded again, the pattern racecheck needs to see the stage handshake (one tile per CTA
      // reuses none); pairs: the partner's multicasts and remote releases too.
      for (int pipeline : {1, 2, 3, 4, 5, 6})
        for (int cluster : {1, 2}) {
          // the wide split, the ping-pong consumers and pairs are 16-bit D only; the 192-column
          // ping-pong units and the lent stage are never paired; the lent stage and the carried
          // epilogue take B [N,K] only (M = 129: the second row block's second warpgroup
          // stages nothing and hands its lent stage back itself; the carried epilogue runs as
          // the deep ring with beta != 0, so beta 0 below too)
          if ((pipeline >= 2 || cluster == 2) && dt == DType::kF32) continue;
          if ((pipeline == 4 || pipeline == 5) && cluster == 2) continue;
          if (pipeline >= 5 && bl != BLayout::kNK) continue;
          Problem q(129, 264, 72, bl, DType::kBF16, dt);
          // pipeline 4: beta 0 (its TMA-staged epilogue) with B [N,K], 0.5 (its register
          // stores) with B [K,N], so that both run here
          q.beta = pipeline == 6 || (pipeline == 4 && bl == BLayout::kNK) ? 0.0f : 0.5f;
          SCOPED_TRACE("budget " + std::to_string(cluster) + ", pipeline " +
                       std::to_string(pipeline) + ", cluster " + std::to_string(cluster));
          EXPECT_EQ(runAndCheck(q, seed + pipeline,
                                [pipeline, cluster](GemmArgs& g) {
                                  g.pipeline = pipeline;
                                  g.cluster = cluster;
                                  g.smBudget = cluster;
                                }),
                    "");
        }
    }
  }
}

TEST(GemmCorrectness, AllTypesLayoutsBetaTails) {
  REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  const int shapes[][3] = {{128, 256, 64},   {1, 1, 8},        {127, 255, 72},  {300, 520, 136},
                           {777, 1500, 264}, {64, 2056, 1024}, {1000, 72, 512}, {513, 769, 8}};
  int n = 0;
  for (auto& s : shapes)
    for (DType ab : kIn)
      for (DType dt : kOut)
        for (BLayout bl : kLayouts)
          for (float beta : {0.0f, -0.75f}) {
            // N must give 16-byte B rows for B[K,N]; pad ldb otherwise.
            const int64_t padB = bl == BLayout::kKN ? (8 - s[1] % 8) % 8 : 0;
            Problem p(s[0], s[1], s[2], bl, ab, dt, 0, padB, 0);
            p.beta = beta;
            SCOPED_TRACE(p.name());
            EXPECT_EQ(runAndCheck(p, seed + (++n)), "");
          }
}

TEST(GemmCorrectness, PaddedLeadingDimsAndAlpha) {
  REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  for (BLayout bl : kLayouts)
    for (DType dt : kOut) {
      // ldb must stay a multiple of 8: N=700 needs +4 for B[K,N], K=200 needs +0 for B[N,K].
      Problem p(383, 700, 200, bl, DType::kBF16, dt, /*padA=*/24,
                /*padB=*/bl == BLayout::kKN ? 44 : 40, /*padD=*/64);
      p.alpha = 0.5f;
      p.beta = 2.0f;
      SCOPED_TRACE(p.name());
      EXPECT_EQ(runAndCheck(p, seed), "");
    }
}

// D rows not 16-byte aligned: the engine falls back to the direct-store epilogue.
TEST(GemmCorrectness, UnalignedOutputFallback) {
  REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  for (DType dt : kOut) {
    Problem p(200, 301, 96, BLayout::kNK, DType::kF16, dt, 0, 0, /*padD=*/0);
    p.beta = 1.0f;
    SCOPED_TRACE(p.name());
    EXPECT_EQ(runAndCheck(p, seed), "");
  }
}

// C aliases D: C = A·B + beta·C in place.
TEST(GemmCorrectness, InPlaceBeta) {
  REQUIRE_SM90();
  for (int pipeline : {0, 3, 4})
    for (DType dt : kOut) {
      if (pipeline >= 3 && dt == DType::kF32) continue;  // ping-pong: 16-bit D only
      // Pipeline 4 stores by TMA or 16-byte groups of 8 columns from registers: 16-byte rows
      // and width (the others: the direct epilogue's 4-byte padding).
      const bool tmaOnly = pipeline == 4;
      Problem p(520, tmaOnly ? 1032 : 1030, 128, BLayout::kNK, DType::kBF16, dt, 0, 0,
                tmaOnly ? 8 : 2);
      p.beta = 0.25f;
      SCOPED_TRACE(p.name() + " pipeline " + std::to_string(pipeline));
      p.alloc();
      p.randomize(mktest::testSeed());
      GT_CUDA(cudaMemset(p.D, 0xFF, p.bytesD()));  // poison padding columns too
      GT_CUDA(cudaMemcpy2D(p.D, p.ldd * p.esD(), p.C, p.ldd * p.esD(), p.N * p.esD(), p.M,
                           cudaMemcpyDeviceToDevice));
      p.reference();
      {
        // The padding must hold the poison before the launch (setup check).
        std::vector<uint8_t> h(p.bytesD());
        GT_CUDA(cudaMemcpy(h.data(), p.D, p.bytesD(), cudaMemcpyDeviceToHost));
        size_t dirty = 0;
        for (int m = 0; m < p.M; ++m)
          for (size_t b = p.N * p.esD(); b < p.ldd * p.esD(); ++b)
            dirty += h[m * p.ldd * p.esD() + b] != 0xFF;
        ASSERT_EQ(dirty, 0u) << "padding not poisoned before launch";
      }
      GemmArgs g = p.args();
      g.C = p.D;
      g.pipeline = pipeline;
      ASSERT_EQ(mk::gemm::launch(g, 0), ncclSuccess);
      GT_CUDA(cudaDeviceSynchronize());
      EXPECT_EQ(p.check(), "");
    }
}

// Narrow padding (ldd = N + 2) with C separate, C aliasing D, and beta = 0: which of them
// writes past N (diagnostic companion of InPlaceBeta; prints the first dirty element).
TEST(GemmCorrectness, NarrowPaddingVariants) {
  REQUIRE_SM90();
  for (int variant = 0; variant < 3; ++variant) {
    Problem p(520, 1030, 128, BLayout::kNK, DType::kBF16, DType::kBF16, 0, 0, 2);
    p.beta = variant == 2 ? 0.0f : 0.25f;
    SCOPED_TRACE(testing::Message() << (variant == 0   ? "separate C"
                                        : variant == 1 ? "C == D"
                                                       : "beta 0"));
    p.alloc();
    p.randomize(mktest::testSeed());
    GT_CUDA(cudaMemset(p.D, 0xFF, p.bytesD()));
    if (variant == 1)
      GT_CUDA(cudaMemcpy2D(p.D, p.ldd * p.esD(), p.C, p.ldd * p.esD(), p.N * p.esD(), p.M,
                           cudaMemcpyDeviceToDevice));
    p.reference();
    GemmArgs g = p.args();
    if (variant == 1) g.C = p.D;
    ASSERT_EQ(mk::gemm::launch(g, 0), ncclSuccess);
    GT_CUDA(cudaDeviceSynchronize());
    std::vector<uint16_t> h(p.bytesD() / 2);
    GT_CUDA(cudaMemcpy(h.data(), p.D, p.bytesD(), cudaMemcpyDeviceToHost));
    int dirty = 0, firstRow = -1;
    for (int m = 0; m < p.M; ++m)
      for (int n = p.N; n < p.ldd; ++n)
        if (h[(size_t)m * p.ldd + n] != 0xFFFF) {
          if (firstRow < 0) {
            firstRow = m;
            printf(
                "[gemm-diag] variant %d: first dirty padding at m=%d n=%d: 0x%04x (row start "
                "0x%04x)\n",
                variant, m, n, h[(size_t)m * p.ldd + n], h[(size_t)m * p.ldd]);
          }
          ++dirty;
        }
    EXPECT_EQ(dirty, 0);
  }
}

// SM budgets, raster group sizes, caller tile orders and row-block rotation.
TEST(GemmCorrectness, BudgetsAndTileOrders) {
  REQUIRE_SM90();
  // The tile walk's budgets (at 1 and 7 CTAs pipeline 0 would take the unit walk here, whose
  // budgets PingPong192 covers).
  mktest::ScopedEnv units("MKERNEL_GEMM_UNITS_MAXK", "0");
  int sms = 0;
  GT_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const uint64_t seed = mktest::testSeed();
  Problem p(1800, 2100, 320, BLayout::kNK, DType::kBF16, DType::kBF16);
  p.alloc();
  p.randomize(seed);
  p.reference();
  const int tiles = mk::gemm::tilesM(p.args()) * mk::gemm::tilesN(p.args());
  std::vector<int32_t> order(tiles);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  int32_t* dOrder = nullptr;
  GT_CUDA(cudaMalloc(&dOrder, tiles * sizeof(int32_t)));
  GT_CUDA(cudaMemcpy(dOrder, order.data(), tiles * sizeof(int32_t), cudaMemcpyHostToDevice));
  struct Case {
    int budget, groupM, rot;
    bool order;
  } cases[] = {{1, 0, 0, false},       {7, 3, 0, false},    {sms - 16, 0, 0, false},
               {sms, 1, 0, false},     {sms, 16, 5, false}, {sms, 0, -3, false},
               {sms - 16, 0, 0, true}, {3, 0, 0, true}};
  for (const Case& c : cases) {
    GemmArgs g = p.args();
    g.smBudget = c.budget;
    g.groupM = c.groupM;
    g.hooks.rowBlockOffset = c.rot;
    if (c.order) g.hooks.tileOrder = dOrder;
    SCOPED_TRACE(testing::Message() << "budget=" << c.budget << " groupM=" << c.groupM
                                    << " rot=" << c.rot << " order=" << c.order);
    p.poison();
    ASSERT_EQ(mk::gemm::launch(g, 0), ncclSuccess);
    GT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(p.check(), "");
  }
  cudaFree(dOrder);
}

// Both shared-memory splits forced (GemmArgs::pipeline): the wide epilogue writes a whole
// half-tile of boxes per barrier, so tiles clipped at N (fewer boxes), SM budgets that give a
// CTA several tiles (the box rotation carries across tiles) and beta all go through it.
TEST(GemmCorrectness, BothPipelines) {
  REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  // 257 x 440: one row of the last row block; the last column block's half-tile is 3 boxes (the
  // carried epilogue carries one).
  const int shapes[][3] = {
      {300, 300, 136}, {513, 1100, 1024}, {256, 2048, 4160}, {129, 72, 64}, {257, 440, 200}};
  int n = 0;
  for (auto& s : shapes)
    for (DType dt : {DType::kBF16, DType::kF16})
      for (BLayout bl : kLayouts)
        for (int pipeline : {1, 2, 3, 4, 5, 6})
          for (int budget : {0, 3}) {
            // pipeline 4 stores 16-byte groups only (16-byte rows: N % 8 == 0 here); pipelines 5, 6
            // (the lent stage, the carried epilogue) take B [N,K] only
            if (pipeline == 4 && s[1] % 8 != 0) continue;
            if (pipeline >= 5 && bl != BLayout::kNK) continue;
            // B[K,N] needs 16-byte rows: pad ldb when N is not a multiple of 8.
            const int64_t padB = bl == BLayout::kKN ? (8 - s[1] % 8) % 8 : 0;
            Problem p(s[0], s[1], s[2], bl, DType::kBF16, dt, 0, padB, 0);
            p.beta = (n % 3 == 0) ? 0.5f : 0.0f;
            p.alpha = (n % 4 == 1) ? -0.75f : 1.0f;  // the epilogues' unit-alpha paths and not
            SCOPED_TRACE(p.name() + " pipeline " + std::to_string(pipeline) + " budget " +
                         std::to_string(budget));
            EXPECT_EQ(runAndCheck(p, seed + (++n),
                                  [&](GemmArgs& g) {
                                    g.pipeline = pipeline;
                                    g.smBudget = budget;
                                  }),
                      "");
          }
}

// Ping-pong consumers (GemmArgs::pipeline = 3): each consumer WG owns one 128x128 half of a
// tile and they take turns in the main loop. Random shapes with tails in M, N and K (a tile
// whose right half is past N, a row block of fewer than 64 rows), both B layouts, both input
// types and 16-bit outputs, alpha, beta (C separate), padded and odd leading dimensions (the
// direct-store fallback), SM budgets from 1 (one CTA walks every tile: the order barriers
// and the stage ring cross many units) to an odd count and all SMs; every other shape as CTA
// pairs (session 43: odd row-block counts leave a pair's second CTA past M; budget 1 becomes
// one pair); every element against the fp64 reference, outputs poisoned.
TEST(GemmCorrectness, PingPong) {
  REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  const std::vector<std::array<int, 3>> fixed = {{128, 256, 64}, {1, 1, 8},
                                                 {129, 128, 72}, {64, 129, 1024},
                                                 {300, 520, 8},  {1024, 1024, 1024}};
  forPingProblems(seed, fixed, false, [&](Problem& p, int n, int drawn) {
    const int cluster = 1 + n % 2;
    const int budget = drawn == 0 ? 0 : std::max(cluster, drawn);  // whole pairs
    SCOPED_TRACE(p.name() + " ping-pong budget " + std::to_string(budget) + " cluster " +
                 std::to_string(cluster));
    EXPECT_EQ(runAndCheck(p, seed + 1000 + n,
                          [&](GemmArgs& g) {
                            g.pipeline = 3;
                            g.smBudget = budget;
                            g.cluster = cluster;
                          }),
              "");
  });
  // The calls above really ran the ping-pong kernel, and pipeline 0 still never picks it.
  Problem p(1024, 2048, 1024, BLayout::kNK, DType::kBF16, DType::kBF16);
  p.alloc();
  GemmArgs g = p.args();
  mk::gemm::GemmParams gp;
  int32_t grid = 0;
  g.pipeline = 3;
  ASSERT_EQ(mk::gemm::buildParams(g, &gp, &grid), ncclSuccess);
  EXPECT_EQ(gp.pingpong, 1);
  EXPECT_EQ(gp.cluster, 1);
  {
    // Pairs asked for by the environment: pipeline 3 runs paired too, on whole pairs.
    mktest::ScopedEnv pairs("MKERNEL_GEMM_CLUSTER", "2");
    g.smBudget = 7;
    ASSERT_EQ(mk::gemm::buildParams(g, &gp, &grid), ncclSuccess);
    EXPECT_EQ(gp.pingpong, 1);
    EXPECT_EQ(gp.cluster, 2);
    EXPECT_EQ(grid, 6);
    g.smBudget = 0;
  }
  g.pipeline = 0;
  ASSERT_EQ(mk::gemm::buildParams(g, &gp, &grid), ncclSuccess);
  EXPECT_EQ(gp.pingpong, 0);
  // What it does not implement is refused before launch, never run wrong.
  g.pipeline = 3;
  g.dType = DType::kF32;
  EXPECT_EQ(mk::gemm::launch(g, 0), ncclInvalidArgument);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Ping-pong over whole 128x192 units (GemmArgs::pipeline = 4, gemm_pingunit.cuh): the
// PingPong test's draws without pairs or hooks and with 16-byte rows (N and ldd multiples of 8:
// D leaves through TMA stores, or from registers 8 columns at a time with beta != 0 or
// regStores 1, which the fixed shapes and every other drawn one run too), plus fixed shapes at the
// unit edges: one unit (192), two (384), N inside the first unit's third 64-column group (136), one
// unit and 8 columns (200), a last unit of 136 columns (520), 584 = 3 units and 8 columns; budgets
// 1, 3 and 7 give the warpgroups odd and even unit counts and one CTA every unit; alpha, beta (C
// separate); every element against the fp64 reference, outputs poisoned. Then the same draws on
// 176-column units (MKERNEL_GEMM_UNIT_NARROW=1, B [N,K]; [K,N] keeps 192), whose last 48 columns
// leave from registers, with their own edges: one unit (176), two (352), one and 8 columns (184),
// N inside the third 64-column group (136), 1408 = 8 units (the rule's default fit).
TEST(GemmCorrectness, PingPong192) {
  REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  const std::vector<std::array<int, 3>> fixed = {
      {128, 384, 64}, {1, 8, 8},       {129, 200, 72},    {64, 136, 1024},
      {300, 520, 8},  {200, 584, 128}, {1024, 960, 1024}, {128, 192, 64},
      {128, 176, 64}, {129, 352, 72},  {300, 184, 8},     {64, 1408, 1024}};
  for (const char* narrow : {"0", "1"}) {
    mktest::ScopedEnv env("MKERNEL_GEMM_UNIT_NARROW", narrow);
    forPingProblems(seed, fixed, true, [&](Problem& p, int n, int budget) {
      SCOPED_TRACE(p.name() + " ping-pong units budget " + std::to_string(budget) +
                   " MKERNEL_GEMM_UNIT_NARROW=" + narrow);
      for (int reg : {0, 1}) {
        if (reg == 1 && n >= (int)fixed.size() && n % 2 == 0) continue;
        SCOPED_TRACE(reg ? "register stores" : "TMA stores");
        bool resolved = false;
        EXPECT_EQ(runAndCheck(p, seed + 3000 + n,
                              [&](GemmArgs& g) {
                                g.pipeline = 4;
                                g.smBudget = budget;
                                g.regStores = reg;
                                // the epilogue and unit width asked for are what the kernel runs
                                const int width = narrow[0] == '1' && g.bLayout == BLayout::kNK
                                                      ? mk::gemm::kPingUnitNarrowN
                                                      : mk::gemm::kPingUnitN;
                                resolved = resolvesTo(g, [&](const mk::gemm::GemmParams& q) {
                                  return q.pingpong == 2 && q.unitN == width &&
                                         q.tilesN == (g.N + width - 1) / width &&
                                         q.regStores == (reg == 1 && g.beta == 0.0f ? 1 : 0);
                                });
                              }),
                  "");
        EXPECT_TRUE(resolved);
      }
    });
  }
  // The 176-column edges again on B [N,K], which the draws above give each fixed shape only half
  // the time: one unit, one and 8 columns, two, N inside the register-stored last 48 columns
  // (136), 8 units; beta (every column from registers), alpha, padded rows, both epilogues.
  {
    mktest::ScopedEnv env("MKERNEL_GEMM_UNIT_NARROW", "1");
    const int edges[][3] = {
        {128, 176, 64}, {300, 184, 72}, {129, 352, 136}, {64, 136, 1024}, {200, 1408, 256}};
    int e = 0;
    for (const auto& s : edges) {
      for (int reg : {0, 1}) {
        Problem q(s[0], s[1], s[2], BLayout::kNK, DType::kBF16, DType::kBF16, 0, 0, e % 2 ? 8 : 0);
        q.alpha = e % 3 == 0 ? -0.5f : 1.0f;
        q.beta = e % 4 == 1 ? 0.75f : 0.0f;
        SCOPED_TRACE(q.name() + " 176-column units, B [N,K], edge " + std::to_string(e));
        bool resolved = false;
        EXPECT_EQ(runAndCheck(q, seed + 3500 + e,
                              [&](GemmArgs& g) {
                                g.pipeline = 4;
                                g.smBudget = e % 3 == 0 ? 0 : 3;
                                g.regStores = reg;
                                resolved = resolvesTo(g, [&](const mk::gemm::GemmParams& r) {
                                  return r.pingpong == 2 && r.unitN == mk::gemm::kPingUnitNarrowN;
                                });
                              }),
                  "");
        EXPECT_TRUE(resolved);
        ++e;
      }
    }
  }
  // Pairs asked for by the environment are not taken by the unit walk, and what it does not
  // implement is refused before launch.
  Problem p(1024, 2048, 1024, BLayout::kNK, DType::kBF16, DType::kBF16);
  p.alloc();
  GemmArgs g = p.args();
  mk::gemm::GemmParams gp;
  int32_t grid = 0;
  g.pipeline = 4;
  {
    mktest::ScopedEnv pairs("MKERNEL_GEMM_CLUSTER", "2");
    ASSERT_EQ(mk::gemm::buildParams(g, &gp, &grid), ncclSuccess);
  }
  EXPECT_EQ(gp.pingpong, 2);
  EXPECT_EQ(gp.cluster, 1);
  EXPECT_EQ(gp.tilesN, (2048 + 191) / 192);
  EXPECT_EQ(mk::gemm::tilesN(g), gp.tilesN);  // the host helper counts the same tiles
  g.hooks.rowBlockOffset = 1;
  EXPECT_EQ(mk::gemm::launch(g, 0), ncclInvalidArgument);
  g.hooks.rowBlockOffset = 0;
  g.ldd = 2048 + 4;  // 8-byte rows: no 16-byte stores (pipeline 4 has no other epilogue)
  EXPECT_EQ(mk::gemm::launch(g, 0), ncclInvalidArgument);
  g.ldd = 0;
  g.dType = DType::kF32;
  EXPECT_EQ(mk::gemm::launch(g, 0), ncclInvalidArgument);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // Pipeline 0 takes the unit walk where its units load the CTAs at least as evenly as tiles
  // (512 x 768 on 4 CTAs: 4 units a CTA, 768 columns, as its 3 tiles would) and computes the same.
  mktest::ScopedEnv maxK("MKERNEL_GEMM_UNITS_MAXK", nullptr);
  mktest::ScopedEnv cl("MKERNEL_GEMM_CLUSTER", nullptr);
  mktest::ScopedEnv sk("MKERNEL_GEMM_STREAMK", nullptr);
  Problem u(512, 768, 1024, BLayout::kNK, DType::kBF16, DType::kBF16);
  bool units = false;
  EXPECT_EQ(runAndCheck(u, seed + 5000,
                        [&](GemmArgs& a) {
                          a.pipeline = 0;
                          a.smBudget = 4;
                          units = resolvesTo(
                              a, [](const mk::gemm::GemmParams& q) { return q.pingpong == 2; });
                        }),
            "");
  EXPECT_TRUE(units) << "pipeline 0 did not take the unit walk at 512 x 768 x 1024 on 4 CTAs";
}

// CTA pairs (GemmArgs::cluster = 2: B tiles split between the two CTAs of a cluster and
// multicast to both): odd and even row-block counts (the last pair's second CTA past M), tails
// in N and K, both B layouts, both 16-bit outputs and input types, beta, the deep, wide and
// ping-pong pipelines, SM budgets that give each pair several positions, one pair, or an odd
// budget; the carried epilogue (pipeline 6); every element against the fp64 reference. Also the
// same through MKERNEL_GEMM_CLUSTER=2 (cluster = 0).
TEST(GemmCorrectness, ClusterPairs) {
  REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  const int shapes[][3] = {{300, 520, 64},   {129, 72, 136},    {1024, 2048, 1024},
                           {640, 1100, 200}, {2432, 1536, 512}, {128, 256, 64}};
  int n = 0;
  for (auto& s : shapes)
    for (BLayout bl : kLayouts)
      for (int pipeline : {1, 2, 3, 6})
        for (int budget : {0, 2, 7}) {
          if (pipeline == 6 && bl != BLayout::kNK) continue;  // the carried epilogue: B [N,K]
          const DType in = (n % 2) ? DType::kF16 : DType::kBF16;
          const DType out = (n % 3) ? DType::kBF16 : DType::kF16;
          // B[K,N] rows must be 16-byte multiples (N = 1100 is not); D keeps N = 1100 (the
          // direct-store epilogue).
          const int64_t padB = bl == BLayout::kKN ? (8 - s[1] % 8) % 8 : 0;
          Problem p(s[0], s[1], s[2], bl, in, out, 0, padB, 0);
          p.beta = (n % 4 == 1) ? 0.5f : 0.0f;
          SCOPED_TRACE(p.name() + " pairs, pipeline " + std::to_string(pipeline) + " budget " +
                       std::to_string(budget));
          EXPECT_EQ(runAndCheck(p, seed + (++n),
                                [&](GemmArgs& g) {
                                  g.cluster = 2;
                                  g.pipeline = pipeline;
                                  g.smBudget = budget;
                                }),
                    "");
        }
  // The calls above really ran as pairs (the unpaired kernel would pass them too): the
  // parameters resolve to 2 and an even grid, from the argument and from the environment.
  {
    Problem p(1024, 2048, 1024, BLayout::kNK, DType::kBF16, DType::kBF16);
    p.alloc();
    GemmArgs g = p.args();
    g.cluster = 2;
    g.smBudget = 7;
    mk::gemm::GemmParams gp;
    int32_t grid = 0;
    ASSERT_EQ(mk::gemm::buildParams(g, &gp, &grid), ncclSuccess);
    EXPECT_EQ(gp.cluster, 2);
    EXPECT_EQ(grid, 6);  // whole pairs within the budget
    g.cluster = 0;
    mktest::ScopedEnv pairs("MKERNEL_GEMM_CLUSTER", "2");
    ASSERT_EQ(mk::gemm::buildParams(g, &gp, &grid), ncclSuccess);
    EXPECT_EQ(gp.cluster, 2);
    g.dType = DType::kF32;  // never paired: the environment leaves it unpaired
    ASSERT_EQ(mk::gemm::buildParams(g, &gp, &grid), ncclSuccess);
    EXPECT_EQ(gp.cluster, 1);
  }
  mktest::ScopedEnv env("MKERNEL_GEMM_CLUSTER", "2");
  for (auto& s : shapes) {
    Problem p(s[0], s[1], s[2], BLayout::kNK, DType::kBF16, DType::kBF16, 8, 8, 8);
    SCOPED_TRACE(p.name() + " MKERNEL_GEMM_CLUSTER=2, padded");
    EXPECT_EQ(runAndCheck(p, seed + (++n)), "");
  }
  // fp32 D is never paired: the environment leaves it unpaired rather than refusing it. (N=296:
  // B [K,N] unpadded needs 16-byte rows for its TMA descriptor.)
  Problem f(513, 296, 128, BLayout::kKN, DType::kBF16, DType::kF32, 0, 0, 0);
  SCOPED_TRACE(f.name() + " MKERNEL_GEMM_CLUSTER=2, fp32 D");
  EXPECT_EQ(runAndCheck(f, seed + (++n)), "");
}

// GemmArgs::storeHint: D's TMA stores with an L2 evict-first policy change no output. Random
// shapes with tails, both layouts, every out type, the pipelines each takes (the wide staging
// only 16-bit D, the carried epilogue and the lent stage where B is [N,K] and D 16-bit), bands of
// 8 or 32 row blocks; buildParams must honour the request wherever D goes through TMA stores,
// resolve 0 (automatic) by autoStoreHint and 2 to no policy. Case 1 is a D of 128 MB at K = 512,
// which outgrows the L2 (the automatic policy on); the drawn ones fit it (off).
TEST(GemmCorrectness, StoreHint) {
  REQUIRE_SM90();
  mktest::ScopedEnv maxK("MKERNEL_GEMM_HINT_MAXK", nullptr);
  const uint64_t seed = mktest::testSeed();
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return lo + (int)(rng() % (uint64_t)(hi - lo + 1)); };
  for (int n = 0; n < 24; ++n) {
    const bool big = n == 1;
    const int M = n == 0 ? 1024 : (big ? 8192 : pick(1, 1100));
    const int N = n == 0 ? 2048 : (big ? 8192 : 8 * pick(1, 162));
    const int K = n == 0 ? 1024 : (big ? 512 : 8 * pick(1, 200));
    const BLayout bl = n <= 1 ? BLayout::kNK : kLayouts[rng() % 2];
    const DType out = n <= 1 ? DType::kBF16 : kOut[rng() % 3];
    const bool nk16 = bl == BLayout::kNK && out != DType::kF32;
    std::vector<int> pipelines = {0, 1};
    if (out != DType::kF32) pipelines.push_back(2);
    if (nk16) pipelines.insert(pipelines.end(), {5, 6});
    const int pipeline = n == 0 ? 6 : pipelines[rng() % pipelines.size()];
    const int hint = n == 0 ? 1 : (big ? 0 : (int)(rng() % 3)), band = (rng() % 2) ? 32 : 8;
    Problem p(M, N, K, bl, kIn[rng() % 2], out, 0, 0, (rng() % 2) ? 8 : 0);
    SCOPED_TRACE(p.name() + " pipeline " + std::to_string(pipeline) + " storeHint " +
                 std::to_string(hint) + " groupM " + std::to_string(band));
    bool resolved = false;
    EXPECT_EQ(
        runAndCheck(p, seed + n,
                    [&](GemmArgs& g) {
                      g.storeHint = hint;
                      g.groupM = band;
                      g.pipeline = pipeline;
                      mk::gemm::DeviceLimits lim;
                      const int want =
                          hint == 1 || (hint == 0 && mk::gemm::deviceLimits(&lim) == ncclSuccess &&
                                        mk::gemm::autoStoreHint(g, lim.l2Bytes) == 1);
                      // Pipeline 0 may resolve to the unit walk (pipeline 4), whose
                      // stores carry no policy (only the cooperative kernels' do).
                      resolved = resolvesTo(g, [&](const mk::gemm::GemmParams& q) {
                        return q.useTmaStore == 1 && q.storeHint == (q.pingpong == 2 ? 0 : want) &&
                               q.groupM == band;
                      });
                    }),
        "");
    EXPECT_TRUE(resolved) << "D's TMA stores do not carry the policy asked, or the band differs";
    if (big) {  // the automatic policy is on here on any L2 below 128 MB
      mk::gemm::DeviceLimits lim;
      ASSERT_EQ(mk::gemm::deviceLimits(&lim), ncclSuccess);
      if (lim.l2Bytes < (int64_t)M * N * 2) {
        GemmArgs g = p.args();
        g.pipeline = pipeline;
        EXPECT_TRUE(resolvesTo(
            g, [](const mk::gemm::GemmParams& q) { return q.storeHint == 1 || q.pingpong == 2; }))
            << "storeHint 0 with a D larger than the L2 (" << lim.l2Bytes << " bytes)";
      }
    }
  }
  // The ping-pong consumers store D their own way: the hint is dropped, the output as right.
  Problem q(700, 1032, 520, BLayout::kNK, DType::kBF16, DType::kBF16);
  bool dropped = false;
  EXPECT_EQ(runAndCheck(q, seed + 100,
                        [&](GemmArgs& g) {
                          g.storeHint = 1;
                          g.pipeline = 3;
                          dropped = resolvesTo(
                              g, [](const mk::gemm::GemmParams& r) { return r.storeHint == 0; });
                        }),
            "");
  EXPECT_TRUE(dropped) << "the ping-pong consumers' stores carry no policy";
}

// The epilogue storing D from the accumulators (GemmArgs::regStores = 1): random shapes with
// tails in M, N (multiples of 8, the 16-byte stores; a tile's columns end anywhere in it) and
// K, both B layouts and input types, 16-bit outputs, alpha, padded D, the three cooperative
// splits unpaired and as CTA pairs, SM budgets from one CTA (or pair) walking every tile; then
// the requests buildParams must turn down (beta, fp32 D, N % 8, ping-pong), which run the TMA
// or direct epilogue and must be just as right.
TEST(GemmCorrectness, RegisterStores) {
  REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return lo + (int)(rng() % (uint64_t)(hi - lo + 1)); };
  const int budgets[] = {0, 1, 2, 7};
  for (int n = 0; n < 30; ++n) {
    const int M = n == 0 ? 1024 : pick(1, 1100), N = n == 0 ? 2048 : 8 * pick(1, 162);
    const int K = n == 0 ? 1024 : 8 * pick(1, 200);
    const BLayout bl = kLayouts[rng() % 2];
    const DType in = kIn[rng() % 2];
    const DType out = (rng() % 2) ? DType::kBF16 : DType::kF16;
    const int pipeline = (int)(rng() % 3), cluster = 1 + (int)(rng() % 2);
    const int budget = budgets[rng() % 4] * cluster;
    Problem p(M, N, K, bl, in, out, (rng() % 2) ? 8 : 0, 0, (rng() % 2) ? 8 : 0);
    p.alpha = (rng() % 2) ? 1.0f : -0.5f;
    SCOPED_TRACE(p.name() + " pipeline " + std::to_string(pipeline) + " cluster " +
                 std::to_string(cluster) + " budget " + std::to_string(budget));
    bool resolved = false;
    EXPECT_EQ(runAndCheck(p, seed + n,
                          [&](GemmArgs& g) {
                            g.regStores = 1;
                            g.pipeline = pipeline;
                            g.cluster = cluster;
                            g.smBudget = budget;
                            resolved = resolvesTo(g, [](const mk::gemm::GemmParams& q) {
                              return q.regStores == 1 && q.storeWarps == 0;
                            });
                          }),
              "");
    EXPECT_TRUE(resolved) << "the request was not honoured where D allows it";
  }
  // Turned down: each runs another epilogue, checked like the rest.
  struct Refused {
    int N;
    DType out;
    float beta;
    int pipeline;
  };
  const Refused refused[] = {{520, DType::kBF16, 0.5f, 0},
                             {520, DType::kF32, 0.0f, 1},
                             {1100, DType::kBF16, 0.0f, 2},
                             {520, DType::kF16, 0.0f, 3}};
  for (const Refused& r : refused) {
    const int64_t padB = (8 - r.N % 8) % 8;
    Problem p(300, r.N, 136, BLayout::kKN, DType::kBF16, r.out, 0, padB, 0);
    p.beta = r.beta;
    SCOPED_TRACE(p.name() + " refused, pipeline " + std::to_string(r.pipeline));
    int resolved = -1;
    EXPECT_EQ(runAndCheck(p, seed + 100 + r.pipeline,
                          [&](GemmArgs& g) {
                            g.regStores = 1;
                            g.pipeline = r.pipeline;
                            mk::gemm::GemmParams gp;
                            int32_t grid = 0;
                            if (mk::gemm::buildParams(g, &gp, &grid) == ncclSuccess)
                              resolved = gp.regStores;
                          }),
              "");
    EXPECT_EQ(resolved, 0);
  }
}

// Large shapes against cuBLAS (same inputs, fp32 accumulation both) and the fp64 reference.
TEST(GemmCorrectness, LargeVsCublas) {
  REQUIRE_SM90();
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const uint64_t seed = mktest::testSeed();
  const int shapes[][3] = {{4096, 4096, 4096}, {2048, 8192, 1024}, {1000, 3000, 2056}};
  for (auto& s : shapes)
    for (BLayout bl : kLayouts)
      for (DType dt : {DType::kBF16, DType::kF32}) {
        Problem p(s[0], s[1], s[2], bl, DType::kBF16, dt);
        p.beta = dt == DType::kF32 ? 0.5f : 0.0f;
        SCOPED_TRACE(p.name());
        ASSERT_EQ(runAndCheck(p, seed), "");
        // cuBLAS, column-major: D^T[N,M] = op(B) * A^T.
        void* out = nullptr;
        GT_CUDA(cudaMalloc(&out, p.bytesD()));
        GT_CUDA(cudaMemcpy(out, p.C, p.bytesD(), cudaMemcpyDeviceToDevice));
        const float alpha = p.alpha, beta = p.beta;
        const cudaDataType ct = dt == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
        ASSERT_EQ(
            cublasGemmEx(h, bl == BLayout::kNK ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, p.N, p.M,
                         p.K, &alpha, p.B, CUDA_R_16BF, (int)p.ldb, p.A, CUDA_R_16BF, (int)p.lda,
                         &beta, out, ct, (int)p.ldd, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
        GT_CUDA(cudaDeviceSynchronize());
        // cuBLAS meets the same tolerance against fp64, so engine and cuBLAS agree within it.
        EXPECT_EQ(p.check(out), "") << "(cuBLAS vs reference)";
        cudaFree(out);
      }
  cublasDestroy(h);
}

// Argument errors are reported before launch and leave the device untouched.
TEST(GemmCorrectness, LaunchRejectsBadArgs) {
  REQUIRE_SM90();
  Problem p(128, 256, 60, BLayout::kNK, DType::kBF16, DType::kBF16);
  p.alloc();
  GemmArgs g = p.args();
  EXPECT_EQ(mk::gemm::launch(g, 0), ncclInvalidArgument);  // K % 8 != 0
  g.K = 64;
  g.A = static_cast<char*>(p.A) + 2;
  EXPECT_EQ(mk::gemm::launch(g, 0), ncclInvalidArgument);  // misaligned A
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}
