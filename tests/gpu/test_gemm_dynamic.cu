// The GEMM engine's dynamic tile schedule (GemmArgs::tileClaim) on plain GEMMs: CTAs claim
// tiles from a device counter instead of walking cta, cta + grid, ... (what the MoE fused
// kernel's dispatch CTAs rely on when they join the GEMM late). Grids of 1 CTA, a few, and
// every SM, also over fewer tiles than CTAs (those CTAs find none and leave); the deep and wide
// pipelines, the lent stage (pipeline 5) and the carried epilogue (6), every output type, beta,
// tile orders, and the tileDone hook (every tile published once the consumers leave on the end
// word). Outputs are poisoned and every element is compared with the fp64 reference; the counter
// must end at tiles + CTAs (each tile claimed once, one failed claim per CTA), which a run on the
// static schedule cannot reach.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "test_gemm_util.cuh"

using namespace gemmtest;
using mk::gemm::GemmArgs;

namespace {

struct DynCase {
  int M, N, K;
  BLayout bl;
  DType ab, dt;
  float beta;
  int budget;    // GemmArgs::smBudget (0: every SM); the grid under tileClaim
  int pipeline;  // GemmArgs::pipeline: 0 automatic, 1 deep ring, 2 wide staging, 5 lent stage,
                 // 6 carried epilogue
  bool order;    // a shuffled hooks.tileOrder
  bool done;     // hooks.tileDone: every tile's flag must be published
};

}  // namespace

TEST(GemmDynamic, PlainGridSizesAndHooks) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  const int sms = smCount();
  const DynCase cases[] = {
      // 15 x 9 tiles: 1 CTA (every tile through one ring), a few, every SM.
      {1800, 2100, 320, BLayout::kNK, DType::kBF16, DType::kBF16, 0.0f, 1, 0, false, false},
      {1800, 2100, 320, BLayout::kNK, DType::kBF16, DType::kBF16, 0.0f, 7, 1, false, true},
      // B[K,N] needs N % 8 == 0 (16-byte rows for TMA): the [K,N] cases use N 2104, 304, 1104.
      {1800, 2104, 320, BLayout::kKN, DType::kF16, DType::kF32, 0.5f, 0, 0, true, false},
      {1800, 2100, 320, BLayout::kNK, DType::kBF16, DType::kF16, 0.0f, 3, 2, true, true},
      // 3 x 2 tiles on every SM (more CTAs than tiles) and on 1 and 4 CTAs.
      {300, 300, 136, BLayout::kNK, DType::kBF16, DType::kBF16, 0.0f, 0, 0, false, true},
      {300, 304, 136, BLayout::kKN, DType::kF16, DType::kF16, -1.0f, 1, 1, false, false},
      {300, 300, 136, BLayout::kNK, DType::kBF16, DType::kF32, 0.0f, 4, 0, true, true},
      // One tile, long K; a tail in every dimension.
      {100, 200, 4160, BLayout::kNK, DType::kBF16, DType::kBF16, 0.0f, 0, 1, false, true},
      {513, 1104, 1024, BLayout::kKN, DType::kBF16, DType::kBF16, 0.0f, 5, 2, false, false},
      // The deep ring lending its last stage to the epilogue (pipeline 5: B [N,K], 16-bit D, no
      // hooks): 1 CTA, every SM with beta, more CTAs than tiles, one k-step a tile.
      {1800, 2100, 320, BLayout::kNK, DType::kBF16, DType::kBF16, 0.0f, 1, 5, false, false},
      {1800, 2104, 320, BLayout::kNK, DType::kF16, DType::kF16, 0.5f, 0, 5, false, false},
      {300, 300, 136, BLayout::kNK, DType::kBF16, DType::kBF16, 0.0f, 0, 5, false, false},
      {513, 1104, 64, BLayout::kNK, DType::kBF16, DType::kBF16, 0.0f, 3, 5, false, false},
      // The carried epilogue (pipeline 6: the same GEMMs as 5): 1 CTA (every tile's second half
      // staged in the next tile's main loop), every SM, one k-step a tile (staged after the
      // first), 3 boxes in the last column block; beta runs the deep ring.
      {1800, 2100, 320, BLayout::kNK, DType::kBF16, DType::kBF16, 0.0f, 1, 6, false, false},
      {1800, 2104, 320, BLayout::kNK, DType::kF16, DType::kF16, 0.0f, 0, 6, false, false},
      {513, 1104, 64, BLayout::kNK, DType::kBF16, DType::kBF16, 0.0f, 3, 6, false, false},
      {300, 440, 136, BLayout::kNK, DType::kBF16, DType::kF16, 0.0f, 1, 6, false, false},
      {300, 440, 136, BLayout::kNK, DType::kF16, DType::kBF16, 0.5f, 2, 6, false, false},
  };
  int32_t* claim = nullptr;
  uint64_t* done = nullptr;
  int32_t* dOrder = nullptr;
  GT_CUDA(cudaMalloc(&claim, sizeof(int32_t)));
  int i = 0;
  for (const DynCase& c : cases) {
    ++i;
    Problem p(c.M, c.N, c.K, c.bl, c.ab, c.dt);
    p.beta = c.beta;
    SCOPED_TRACE("case " + std::to_string(i) + ": " + p.name() + " budget " +
                 std::to_string(c.budget) + " pipeline " + std::to_string(c.pipeline) +
                 (c.order ? " tileOrder" : "") + (c.done ? " tileDone" : ""));
    p.alloc();
    p.randomize(seed + 7919 * i);
    p.reference();
    GemmArgs g = p.args();
    g.smBudget = c.budget;
    g.pipeline = c.pipeline;
    const int tiles = mk::gemm::tilesM(g) * mk::gemm::tilesN(g);
    std::vector<int32_t> order(tiles);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed + i));
    cudaFree(dOrder);
    cudaFree(done);
    dOrder = nullptr;
    done = nullptr;
    GT_CUDA(cudaMalloc(&dOrder, tiles * sizeof(int32_t)));
    GT_CUDA(cudaMalloc(&done, tiles * sizeof(uint64_t)));
    GT_CUDA(cudaMemcpy(dOrder, order.data(), tiles * sizeof(int32_t), cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemset(done, 0, tiles * sizeof(uint64_t)));
    if (c.order) g.hooks.tileOrder = dOrder;
    const uint64_t doneValue = 1000 + i;
    if (c.done) {
      g.hooks.tileDone = done;
      g.hooks.tileDoneValue = doneValue;
    }
    g.tileClaim = claim;
    const int grid = c.budget > 0 && c.budget < sms ? c.budget : sms;
    // Twice: the counter is zeroed in stream order before each launch (a counter left at the
    // previous run's end would give no tile to anyone and leave D poisoned).
    for (int rep = 0; rep < 2; ++rep) {
      p.poison();
      GT_CUDA(cudaMemsetAsync(done, 0, tiles * sizeof(uint64_t), 0));
      GT_CUDA(cudaMemsetAsync(claim, 0, sizeof(int32_t), 0));
      ASSERT_EQ(mk::gemm::launch(g, 0), ncclSuccess);
      GT_CUDA(cudaDeviceSynchronize());
      EXPECT_EQ(p.check(), "") << "run " << rep;
      int32_t got = 0;
      GT_CUDA(cudaMemcpy(&got, claim, sizeof(got), cudaMemcpyDeviceToHost));
      EXPECT_EQ(got, tiles + grid) << "run " << rep << ": every tile claimed once + one per CTA";
      if (c.done) {
        std::vector<uint64_t> flags(tiles);
        GT_CUDA(cudaMemcpy(flags.data(), done, tiles * sizeof(uint64_t), cudaMemcpyDeviceToHost));
        int wrong = 0;
        for (int t = 0; t < tiles; ++t) wrong += flags[t] != doneValue;
        EXPECT_EQ(wrong, 0) << "run " << rep << ": tiles whose tileDone flag was not published";
      }
    }
  }
  cudaFree(dOrder);
  cudaFree(done);
  cudaFree(claim);
}

// Pipeline 0's carried epilogue and lent stage on claimed tiles (MKERNEL_GEMM_AUTO_LEND 2, the
// default, and 1): launch() hands the kernel a counter of its own per device and stream, which
// each launch's last claim resets. Back-to-back launches on one stream (a counter left at tiles +
// grid would give the next launch no tile and leave D poisoned), launches alternating between two
// streams (a counter each), a budget of 7 CTAs, K past kWideMaxK (the carried epilogue there; the
// deep ring with AUTO_LEND 1), and a captured graph (the static walk) replayed; every element
// checked.
TEST(GemmDynamic, AutoClaimsBackToBack) {
  GEMMTEST_REQUIRE_SM90();
  // Claimed tiles only: at a budget of 7, 2000 x 3000 x 1024 would take the unit walk.
  mktest::ScopedEnv units("MKERNEL_GEMM_UNITS_MAXK", "0");
  const uint64_t seed = mktest::testSeed();
  cudaStream_t s[2] = {nullptr, nullptr};
  GT_CUDA(cudaStreamCreateWithFlags(&s[0], cudaStreamNonBlocking));
  GT_CUDA(cudaStreamCreateWithFlags(&s[1], cudaStreamNonBlocking));
  {
    // 16 x 6 tiles: more than one wave at a budget of 7; K 4200 ends in a partial k-step.
    Problem big(2000, 1500, mk::gemm::kWideMaxK + 104, BLayout::kNK, DType::kBF16, DType::kBF16);
    big.alloc();
    big.randomize(seed + 1);
    big.reference();
    for (const char* kind : {"2", "1"}) {
      mktest::ScopedEnv env("MKERNEL_GEMM_AUTO_LEND", kind);
      GemmArgs g = big.args();
      g.smBudget = 7;
      for (int run = 0; run < 4; ++run) {
        SCOPED_TRACE(std::string("K 4200, MKERNEL_GEMM_AUTO_LEND ") + kind + ", run " +
                     std::to_string(run));
        big.poison();
        GT_CUDA(cudaDeviceSynchronize());
        ASSERT_EQ(mk::gemm::launch(g, s[run % 2]), ncclSuccess);
        GT_CUDA(cudaDeviceSynchronize());
        EXPECT_EQ(big.check(), "");
      }
    }
  }
  // 16 x 12 tiles: more than one wave on any Hopper part's SMs.
  Problem p(2000, 3000, 1024, BLayout::kNK, DType::kBF16, DType::kBF16);
  p.alloc();
  p.randomize(seed);
  p.reference();
  for (const char* kind : {"2", "1"}) {
    mktest::ScopedEnv env("MKERNEL_GEMM_AUTO_LEND", kind);
    for (int budget : {0, 7}) {
      GemmArgs g = p.args();
      g.smBudget = budget;
      for (int run = 0; run < 6; ++run) {
        SCOPED_TRACE(std::string("MKERNEL_GEMM_AUTO_LEND ") + kind + ", budget " +
                     std::to_string(budget) + ", run " + std::to_string(run));
        p.poison();
        GT_CUDA(cudaDeviceSynchronize());
        ASSERT_EQ(mk::gemm::launch(g, s[run % 4 < 2 ? 0 : 1]), ncclSuccess);
        GT_CUDA(cudaDeviceSynchronize());
        EXPECT_EQ(p.check(), "");
      }
    }
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  GemmArgs g = p.args();
  GT_CUDA(cudaStreamBeginCapture(s[0], cudaStreamCaptureModeThreadLocal));
  const ncclResult_t captured = mk::gemm::launch(g, s[0]);
  GT_CUDA(cudaStreamEndCapture(s[0], &graph));
  ASSERT_EQ(captured, ncclSuccess);
  GT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 3; ++rep) {
    SCOPED_TRACE("graph replay " + std::to_string(rep));
    p.poison();
    GT_CUDA(cudaDeviceSynchronize());
    GT_CUDA(cudaGraphLaunch(exec, s[1]));
    GT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(p.check(), "");
  }
  // And eager again after the graph: the stream's counter is still at 0.
  p.poison();
  GT_CUDA(cudaDeviceSynchronize());
  ASSERT_EQ(mk::gemm::launch(g, s[0]), ncclSuccess);
  GT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(p.check(), "");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s[0]);
  cudaStreamDestroy(s[1]);
}
