// The GEMM engine's stream-K tail (GemmArgs::streamK, fused/gemm/streamk.h) on plain GEMMs:
// shapes whose tiles are not a whole number of waves of the SM budget, so that the last one to
// two waves are split into k-step ranges and some tiles are summed by two CTAs through the
// workspace. Tails in M, N and K (K not a multiple of 64), one- and two-k-step tiles, every
// output type, both B layouts, alpha and beta (also in place), budgets of 1, 2, a few and every
// SM, the MKERNEL_GEMM_STREAMK default, a non-blocking stream (its own workspace), and launches
// back to back without a synchronisation (each a new epoch: a finisher that did not wait for
// this launch's partial would add the previous launch's). Outputs are poisoned and every element
// is compared with the fp64 reference (test_gemm_util.cuh).
#include <cstdint>
#include <string>
#include <vector>

#include "fused/gemm/primitives.cuh"  // GemmParams, buildParams
#include "fused/gemm/streamk.h"
#include "test_gemm_util.cuh"

using namespace gemmtest;
using mk::gemm::GemmArgs;

namespace {

// Bounds a finisher's wait for its contributor (GemmArgs::hooks.wait; the default is 300 s): a
// part that is never published fails the case in seconds (the tile is then not stored and stays
// poisoned) instead of stalling the run.
constexpr uint64_t kWaitNs = 20ull * 1000 * 1000 * 1000;

struct SkCase {
  int M, N, K;
  BLayout bl;
  DType ab, dt;
  float alpha, beta;
  int budget;      // GemmArgs::smBudget (0: every SM)
  int pipeline;    // 0 automatic, 1 deep ring, 2 wide staging
  bool mustSplit;  // the plan must split some tile over two CTAs (else: checked to be off/whole)
};

// The schedule the engine runs for `g` (the grid as buildParams computes it).
mk::gemm::SkPlan planOf(const GemmArgs& g, int sms) {
  const int tiles = mk::gemm::tilesM(g) * mk::gemm::tilesN(g);
  const int budget = g.smBudget > 0 && g.smBudget < sms ? g.smBudget : sms;
  const int grid = tiles < budget ? tiles : budget;
  return mk::gemm::skMakePlan(tiles, (g.K + mk::gemm::kTileK - 1) / mk::gemm::kTileK, grid, true);
}

// True when some tile of the plan is computed by more than one CTA.
bool splits(const mk::gemm::SkPlan& s) {
  for (int c = 1; c < s.grid; ++c)
    if (mk::gemm::skRangeStart(s, c) % s.kIt != 0) return true;
  return false;
}

}  // namespace

TEST(GemmStreamK, ShapesTypesLayoutsBudgets) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  const int sms = smCount();
  const SkCase cases[] = {
      // 8 x 6 = 48 tiles on 7 CTAs: 35 data-parallel, 13 stream-K (K = 1000: 16 k-steps, the
      // last one 40 deep).
      {1000, 1300, 1000, BLayout::kNK, DType::kBF16, DType::kBF16, 1.0f, 0.0f, 7, 0, true},
      {1000, 1304, 1000, BLayout::kKN, DType::kBF16, DType::kF32, 0.75f, 0.0f, 7, 0, true},
      {1000, 1300, 1000, BLayout::kNK, DType::kF16, DType::kF16, 1.0f, 0.5f, 7, 1, true},
      {1000, 1304, 1000, BLayout::kKN, DType::kF16, DType::kBF16, -1.5f, -1.0f, 7, 2, true},
      {1000, 1300, 1000, BLayout::kNK, DType::kBF16, DType::kF32, 1.0f, 2.0f, 5, 0, true},
      // 3 x 3 tiles on 2 CTAs: 6 data-parallel, 3 stream-K (1.5 tiles each: the middle one
      // split), K = 200: 4 k-steps.
      {300, 600, 200, BLayout::kNK, DType::kBF16, DType::kBF16, 1.0f, 0.0f, 2, 0, true},
      {300, 600, 200, BLayout::kKN, DType::kBF16, DType::kF32, 1.0f, 0.25f, 2, 1, true},
      // Two k-steps (K = 72): 1-step parts; one k-step (K = 40): nothing to split, whole tiles.
      // ([K,N] B needs 16-byte rows for TMA: N = 1304.)
      {1000, 1300, 72, BLayout::kNK, DType::kBF16, DType::kBF16, 1.0f, 0.0f, 7, 0, true},
      {1000, 1304, 40, BLayout::kKN, DType::kF16, DType::kF32, 1.0f, 0.5f, 7, 0, false},
      // Budget 1 (one wave of everything: data-parallel), and every SM: 16 x 9 = 144 tiles.
      {300, 600, 200, BLayout::kNK, DType::kBF16, DType::kBF16, 1.0f, 0.0f, 1, 0, false},
      {2000, 2300, 1024, BLayout::kNK, DType::kBF16, DType::kBF16, 1.0f, 0.0f, 0, 0, sms < 144},
      {2000, 2304, 1000, BLayout::kKN, DType::kBF16, DType::kF32, 1.0f, 1.0f, 0, 0, sms < 144},
      // Long K: 66 k-steps.
      {520, 780, 4200, BLayout::kNK, DType::kBF16, DType::kBF16, 1.0f, 0.0f, 3, 2, true},
  };
  int i = 0;
  for (const SkCase& c : cases) {
    ++i;
    Problem p(c.M, c.N, c.K, c.bl, c.ab, c.dt);
    p.alpha = c.alpha;
    p.beta = c.beta;
    SCOPED_TRACE("case " + std::to_string(i) + ": " + p.name() + " budget " +
                 std::to_string(c.budget) + " pipeline " + std::to_string(c.pipeline));
    p.alloc();
    p.randomize(seed + 7919 * i);
    p.reference();
    GemmArgs g = p.args();
    g.smBudget = c.budget;
    g.pipeline = c.pipeline;
    g.streamK = 1;
    g.hooks.wait.timeoutNs = kWaitNs;
    const mk::gemm::SkPlan plan = planOf(g, sms);
    EXPECT_EQ(splits(plan), c.mustSplit) << "the case does not exercise what it claims";
    // The engine resolves the same plan (GemmParams::sk) for the kernel.
    {
      mk::gemm::GemmParams prm;
      int32_t grid = 0;
      ASSERT_EQ(mk::gemm::buildParams(g, &prm, &grid), ncclSuccess);
      EXPECT_EQ(grid, plan.grid);
      EXPECT_EQ(prm.sk.units, plan.units);
      EXPECT_EQ(prm.sk.dpTiles, plan.dpTiles);
    }
    for (int rep = 0; rep < 2; ++rep) {
      p.poison();
      ASSERT_EQ(mk::gemm::launch(g, 0), ncclSuccess);
      GT_CUDA(cudaDeviceSynchronize());
      EXPECT_EQ(p.check(), "") << "run " << rep;
    }
  }
}

// In place (C = D, beta != 0), the MKERNEL_GEMM_STREAMK default (streamK = 0), and a
// non-blocking stream.
TEST(GemmStreamK, InPlaceEnvAndStream) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  Problem p(1000, 1300, 1000, BLayout::kNK, DType::kBF16, DType::kF32);
  p.beta = 0.5f;
  p.alloc();
  p.randomize(seed + 11);
  p.reference();
  cudaStream_t s = nullptr;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int mode = 0; mode < 3; ++mode) {
    SCOPED_TRACE(mode == 0 ? "in place" : mode == 1 ? "MKERNEL_GEMM_STREAMK=1" : "own stream");
    mktest::ScopedEnv env("MKERNEL_GEMM_STREAMK", mode == 1 ? "1" : nullptr);
    GemmArgs g = p.args();
    g.smBudget = 7;
    g.streamK = mode == 1 ? 0 : 1;
    g.hooks.wait.timeoutNs = kWaitNs;
    if (mode == 0) {
      // C aliased to D: D holds C's values first.
      GT_CUDA(cudaMemcpy(p.D, p.C, p.bytesD(), cudaMemcpyDeviceToDevice));
      g.C = nullptr;
    } else {
      p.poison();
    }
    ASSERT_EQ(mk::gemm::launch(g, mode == 2 ? s : 0), ncclSuccess);
    GT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(p.check(), "");
  }
  cudaStreamDestroy(s);
}

// Launches back to back on one stream, no synchronisation in between: three problems, each
// launched twice in a row (6 epochs), then every output checked. A finisher must wait for its
// contributor's part of this launch (flag >= this epoch), not take the previous launch's.
TEST(GemmStreamK, BackToBackEpochs) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  const int kProblems = 3;
  std::vector<Problem*> ps;
  for (int i = 0; i < kProblems; ++i) {
    // B[K,N] needs N % 8 == 0 (16-byte rows): 1304 there.
    ps.push_back(new Problem(1000, i == 1 ? 1304 : 1300, 1000, i == 1 ? BLayout::kKN : BLayout::kNK,
                             DType::kBF16, i == 2 ? DType::kF32 : DType::kBF16));
    ps.back()->alloc();
    ps.back()->randomize(seed + 101 * i);
    ps.back()->reference();
    ps.back()->poison();
  }
  GT_CUDA(cudaDeviceSynchronize());
  for (int rep = 0; rep < 2; ++rep) {
    for (int i = 0; i < kProblems; ++i) {
      GemmArgs g = ps[i]->args();
      g.smBudget = 7;
      g.streamK = 1;
      g.hooks.wait.timeoutNs = kWaitNs;
      ASSERT_EQ(mk::gemm::launch(g, 0), ncclSuccess);
    }
  }
  GT_CUDA(cudaDeviceSynchronize());
  for (int i = 0; i < kProblems; ++i) {
    SCOPED_TRACE("problem " + std::to_string(i) + ": " + ps[i]->name());
    EXPECT_EQ(ps[i]->check(), "");
    delete ps[i];
  }
}

// Under stream capture the engine runs the GEMM data-parallel (the workspace's epoch is a host
// counter that a replayed graph would not advance): a captured stream-K GEMM replayed twice
// must give the full result each time (with new operands before the second replay).
TEST(GemmStreamK, CapturedGraphReplays) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  Problem p(1000, 1300, 1000, BLayout::kNK, DType::kBF16, DType::kBF16);
  p.alloc();
  p.randomize(seed + 13);
  p.reference();
  cudaStream_t s = nullptr;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  GemmArgs g = p.args();
  g.smBudget = 7;
  g.streamK = 1;
  g.hooks.wait.timeoutNs = kWaitNs;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const ncclResult_t r = mk::gemm::launch(g, s);
  GT_CUDA(cudaStreamEndCapture(s, &graph));
  ASSERT_EQ(r, ncclSuccess);
  GT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 2; ++rep) {
    if (rep > 0) {  // new operands: a replay must not reuse anything of the previous one
      p.randomize(seed + 17);
      p.reference();
    }
    p.poison();
    GT_CUDA(cudaDeviceSynchronize());
    GT_CUDA(cudaGraphLaunch(exec, s));
    GT_CUDA(cudaStreamSynchronize(s));
    EXPECT_EQ(p.check(), "") << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}
