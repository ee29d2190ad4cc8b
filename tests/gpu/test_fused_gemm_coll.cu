// GPU tests of ncclGemmAllReduce, ncclAllGatherGemm and ncclGemmReduceScatter: n ranks
// sharing GPU 0 (one thread driving every rank), fresh random inputs per case, poisoned
// outputs, every element compared with an fp64 reference computed independently on the GPU
// (per-rank products summed in fp64), with a tolerance derived from the rounding the call
// may do: each partial rounded to the output type, then n-1 additions in that type
// (test_fused_util.cuh). GemmAllReduce results must also be bit-identical on every rank.
// The wider matrix (threading models, processes, virtual nodes, random mixes, failures) is
// in test_fused_matrix*.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "gpu/test_coll_util.h"
#include "gpu/test_fused_util.cuh"
#include "fused/ops/gemm_coll/gemm_coll.h"  // gemmCollFusedLaunches
#include "mkernel/fused.h"

namespace {

using fusedtest::Buf;
using fusedtest::Case;
using fusedtest::name;

// Runs one case `reps` times (fresh inputs each time; reps > 1 inside a CUDA graph when
// `graph`) on the cached clique of c.n ranks, returns "" or what went wrong (the clique is
// dropped then: a failed call may have left kernels waiting).
std::string runCase(const Case& c, uint64_t seed, bool graph = false, int reps = 1) {
  colltest::Clique& q = colltest::clique(c.n);
  if (!q.ok) return "clique: " + q.why;
  cudaSetDevice(0);
  fusedtest::Problem p(c);
  const std::string err = fusedtest::runDriven(p, q.comms, q.streams, seed, graph, reps);
  if (!err.empty()) colltest::dropClique(c.n);  // before p's buffers are freed
  return err;
}

class FusedGemmColl : public ::testing::TestWithParam<Case> {};

TEST_P(FusedGemmColl, MatchesReference) {
  MKTEST_REQUIRE_GPU();
  const Case& c = GetParam();
  std::string err = runCase(c, ::testing::UnitTest::GetInstance()->random_seed() + c.M * 7 + c.n);
  EXPECT_EQ(err, "") << name(c);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  const int ranks[] = {1, 2, 3, 4, 8};
  for (int op = 0; op < 3; ++op) {
    for (int n : ranks) {
      // Tiles and tails in M, N and K; M a multiple of n*8 so shards stay 16-byte rows.
      v.push_back({op, n, 48 * n, 264, 136, 0, ncclBfloat16, ncclBfloat16, false, 0});
      v.push_back({op, n, 256 * n, 512, 256, 1, ncclFloat16, ncclFloat32, true, 0});
    }
    v.push_back({op, 4, 520, 130, 72, 0, ncclBfloat16, ncclFloat16, true, 2});
    v.push_back({op, 4, 1024, 1024, 1024, 0, ncclBfloat16, ncclBfloat16, true, 1});
    v.push_back({op, 2, 2048, 768, 512, 1, ncclBfloat16, ncclFloat32, false, 2});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedGemmColl, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return name(i.param); });

// Captured once per rank stream, replayed with new inputs.
TEST(FusedGemmCollGraph, ReplaysWithNewInputs) {
  MKTEST_REQUIRE_GPU();
  for (int algo : {ncclFusedSequential, ncclFusedFused}) {
    for (int op = 0; op < 3; ++op) {
      Case c{op, 4, 512, 384, 192, 0, ncclBfloat16, ncclBfloat16, op == 0, algo};
      // One eager call first: the fused path sets up its per-comm state outside capture.
      EXPECT_EQ(runCase(c, 70 + op), "") << name(c) << " (eager)";
      EXPECT_EQ(runCase(c, 77 + op, true, 50), "") << name(c);
    }
  }
}

// The reduce tail (MKERNEL_FUSED_TAIL, helpers off, the static GEMM schedule: the defaults'
// alternatives keep a test): every split of the tiles between the comm CTAs and the tail that
// every CTA reduces (off, one wave, three waves, all tiles, the model's) gives the reference's
// result, and the fused kernel is what ran. 128 tiles at 2048x2048 against ~30 compute CTAs a
// rank, 4 ranks (the GPU's share each): partial tails; 2 ranks: the model's tail covers every
// tile.
TEST(FusedGemmCollTail, EveryTailLengthMatchesReference) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv off("MKERNEL_FUSED_HELPERS", "0");
  mktest::ScopedEnv stat("MKERNEL_FUSED_DYN", "0");
  for (const char* tail : {"0", "1", "3", "1024", "-1"}) {
    mktest::ScopedEnv env("MKERNEL_FUSED_TAIL", tail);
    for (int op : {0, 2}) {
      for (int n : {4, 2}) {
        Case c{op, n, 2048, 2048, 256, 0, ncclBfloat16, ncclBfloat16, op == 0, ncclFusedFused};
        const uint64_t before = mk::fused::gemmCollFusedLaunches(mk::fused::kGcLayoutClique);
        EXPECT_EQ(runCase(c, 900 + n + 10 * op), "") << name(c) << " MKERNEL_FUSED_TAIL=" << tail;
        EXPECT_EQ(mk::fused::gemmCollFusedLaunches(mk::fused::kGcLayoutClique), before + n)
            << name(c) << " MKERNEL_FUSED_TAIL=" << tail << ": the fused kernel did not run";
      }
    }
  }
}

// The helpers (MKERNEL_FUSED_HELPERS=1): the compute CTAs' producer warps reduce during the
// GEMM, with no comm CTA (the model's split) or with forced ones claiming alike; a tall-K
// shape gives the helpers most tiles, a short-K one leaves most to the CTAs' tails.
// (M = 2016: a multiple of 2, 3 and 4, as ReduceScatter requires.)
// Tails in M and N, bias, every out type; the fused kernel is what ran.
TEST(FusedGemmCollHelpers, WithAndWithoutCommCtasMatchReference) {
  MKTEST_REQUIRE_GPU();
  // {comm SMs, MKERNEL_FUSED_DYN, MKERNEL_FUSED_DEBUG}: the static and the dynamic GEMM
  // schedule; the helpers' L2 prefetch on (0) and off (32: a hint, the sums must not change).
  const char* const passes[][3] = {{"-1", "0", "0"}, {"0", "0", "0"}, {"2", "0", "0"},
                                   {"-1", "1", "0"}, {"2", "1", "0"}, {"-1", "1", "32"}};
  mktest::ScopedEnv on("MKERNEL_FUSED_HELPERS", "1");
  for (const auto& pass : passes) {
    const char* comm = pass[0];
    mktest::ScopedEnv sms("MKERNEL_FUSED_COMM_SMS", comm);
    mktest::ScopedEnv dyn("MKERNEL_FUSED_DYN", pass[1]);
    mktest::ScopedEnv dbg("MKERNEL_FUSED_DEBUG", pass[2]);
    for (int op : {0, 2}) {
      for (int n : {4, 3, 2}) {
        for (const Case& c :
             {Case{op, n, 2016, 2048, 1024, 0, ncclBfloat16, ncclBfloat16, op == 0, ncclFusedFused},
              Case{op, n, 384 * n - 24 * n, 776, 64, 1, ncclFloat16, ncclFloat32, true,
                   ncclFusedFused},
              Case{op, n, 256 * n, 1032, 192, 0, ncclBfloat16, ncclFloat16, true,
                   ncclFusedFused}}) {
          const uint64_t before = mk::fused::gemmCollFusedLaunches(mk::fused::kGcLayoutClique);
          EXPECT_EQ(runCase(c, 950 + n + 10 * op), "")
              << name(c) << " comm SMs " << comm << " dyn " << pass[1] << " debug " << pass[2];
          EXPECT_EQ(mk::fused::gemmCollFusedLaunches(mk::fused::kGcLayoutClique), before + n)
              << name(c) << " comm SMs " << comm << " dyn " << pass[1] << " debug " << pass[2]
              << ": the fused kernel did not run";
        }
      }
    }
  }
}

// ncclFusedAuto with ranks as threads follows gcAutoFuses (clique.h): fused with >= 1024 tiles,
// a 16-bit output, the helpers on and K >= 4096 (AllReduce) or K >= 8192 (ReduceScatter);
// sequential below either bound or with the helpers off. Every result is checked; the launch count
// tells which path ran.
TEST(FusedGemmCollAuto, FusesWhereTheRuleHolds) {
  MKTEST_REQUIRE_GPU();
  struct Want {
    Case c;
    const char* helpers;
    bool fused;
  };
  const Want wants[] = {
      {{0, 2, 4096, 8192, 8192, 0, ncclBfloat16, ncclBfloat16, false, ncclFusedAuto}, "1", true},
      {{2, 2, 4096, 8192, 8192, 0, ncclBfloat16, ncclBfloat16, true, ncclFusedAuto}, "1", true},
      {{0, 2, 4096, 8192, 4096, 0, ncclBfloat16, ncclBfloat16, false, ncclFusedAuto}, "1", true},
      {{0, 2, 4096, 8192, 2048, 0, ncclBfloat16, ncclBfloat16, false, ncclFusedAuto}, "1", false},
      {{2, 2, 4096, 8192, 4096, 0, ncclBfloat16, ncclBfloat16, false, ncclFusedAuto}, "1", false},
      {{2, 2, 2048, 8192, 8192, 0, ncclBfloat16, ncclBfloat16, false, ncclFusedAuto}, "1", false},
      {{0, 2, 2048, 8192, 8192, 0, ncclBfloat16, ncclBfloat16, false, ncclFusedAuto}, "1", false},
      {{0, 2, 4096, 8192, 8192, 0, ncclBfloat16, ncclBfloat16, false, ncclFusedAuto}, "0", false}};
  // The rule alone decides: no model, no forced split, one node.
  mktest::ScopedEnv model("MKERNEL_FUSED_AUTO", "0");
  mktest::ScopedEnv sms("MKERNEL_FUSED_COMM_SMS", "-1");
  mktest::ScopedEnv nodes("MKERNEL_EMULATE_NODES", "0");
  for (const Want& w : wants) {
    mktest::ScopedEnv on("MKERNEL_FUSED_HELPERS", w.helpers);
    const uint64_t before = mk::fused::gemmCollFusedLaunches(mk::fused::kGcLayoutClique);
    EXPECT_EQ(runCase(w.c, 1200 + w.c.K / 1024), "") << name(w.c) << " helpers " << w.helpers;
    EXPECT_EQ(mk::fused::gemmCollFusedLaunches(mk::fused::kGcLayoutClique),
              before + (w.fused ? w.c.n : 0))
        << name(w.c) << " helpers " << w.helpers << (w.fused ? ": not fused" : ": fused");
  }
}

// The first call on a fresh communicator, again and again: on the H200 (session 23) one such
// call (3 ranks, helpers on, right after the previous clique was dropped) timed out waiting for
// the owner's final flag of the last tile, where the same sequence had passed before. Each
// round drops the 3-rank clique and runs the case that failed, helpers on and off.
TEST(FusedGemmCollHelpers, FirstCallOnFreshCliques) {
  MKTEST_REQUIRE_GPU();
  for (const char* helpers : {"1", "0"}) {
    mktest::ScopedEnv on("MKERNEL_FUSED_HELPERS", helpers);
    for (int round = 0; round < 10; ++round) {
      colltest::dropClique(3);
      const Case c{2, 3, 1080, 776, 64, 1, ncclFloat16, ncclFloat32, true, ncclFusedFused};
      EXPECT_EQ(runCase(c, 990 + round), "")
          << name(c) << " helpers " << helpers << " round " << round;
    }
  }
}

// A 4-rank clique split into two pairs (as PyTorch subgroups are) whose fused calls run at the
// same time: each pair's grid counts the 4 ranks the live parent comm put on this GPU
// (fusedGpuShare), not its own 2 (sized for 2, the pairs' kernels together ask for the GPU
// twice over, and a rank whose kernel cannot become resident leaves its peer waiting until the
// timeout). Every output checked; the budget is this process's latest fused call's.
TEST(FusedGemmCollSplit, SiblingPairsCountTheParentsRanks) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  colltest::Clique& q = colltest::clique(4);
  ASSERT_TRUE(q.ok) << q.why;
  std::vector<ncclResult_t> res(4, ncclSuccess);
  auto eachRank = [&res](const std::function<ncclResult_t(int)>& fn) {
    std::vector<std::thread> th;
    for (int r = 0; r < 4; ++r)
      th.emplace_back([&, r] {
        cudaSetDevice(0);
        res[r] = fn(r);
      });
    for (auto& t : th) t.join();
  };
  // Destroyed on every exit (a failed ASSERT too): a live pair would count in later tests'
  // shares of the GPU.
  struct Kids {
    std::vector<ncclComm_t> v = std::vector<ncclComm_t>(4, nullptr);
    std::function<void(const std::function<ncclResult_t(int)>&)> each;
    void destroy() {
      each([this](int r) {
        const ncclResult_t d = v[r] ? ncclCommDestroy(v[r]) : ncclSuccess;
        v[r] = nullptr;
        return d;
      });
    }
    ~Kids() { destroy(); }
  } kidsGuard{std::vector<ncclComm_t>(4, nullptr), eachRank};
  std::vector<ncclComm_t>& kids = kidsGuard.v;
  eachRank([&](int r) { return ncclCommSplit(q.comms[r], r / 2, r % 2, &kids[r], nullptr); });
  for (int r = 0; r < 4; ++r) ASSERT_EQ(res[r], ncclSuccess) << "split, rank " << r;
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  std::string err;
  for (int op = 0; op < 3 && err.empty(); ++op) {
    const Case c{op, 2, 1024, 1024, 512, 0, ncclBfloat16, ncclBfloat16, op == 0, ncclFusedFused};
    fusedtest::Problem a(c), b(c);
    const uint64_t before = mk::fused::gemmCollFusedLaunches(mk::fused::kGcLayoutClique);
    err = a.fill(31 + op);
    if (err.empty()) err = b.fill(57 + op);
    // Both pairs issued before either is awaited: pair A's two calls, then pair B's.
    for (int r = 0; r < 4 && err.empty(); ++r)
      err = fusedtest::callError(r, kids[r], (r < 2 ? a : b).call(r % 2, kids[r], q.streams[r]));
    if (err.empty()) err = fusedtest::waitRanks(kids, q.streams, 60);
    for (int r = 0; r < 4 && err.empty(); ++r) err = (r < 2 ? a : b).check(r % 2);
    if (err.empty()) err = a.identical();
    if (err.empty()) err = b.identical();
    EXPECT_EQ(err, "") << name(c);
    EXPECT_EQ(mk::fused::gemmCollFusedLaunches(mk::fused::kGcLayoutClique) - before, 4u)
        << name(c) << ": every call must be the fused kernel";
    EXPECT_LE(mk::fused::gemmCollLastBudget(), sms / 4)
        << name(c) << ": a pair's grid must count the parent comm's 4 ranks on the GPU";
  }
  kidsGuard.destroy();                        // before their parent comms may go
  if (!err.empty()) colltest::dropClique(4);  // a failed call may have left kernels waiting
}

// Bad input is refused before any CUDA call, with a message, and the comm stays usable.
TEST(FusedGemmCollArgs, RefusedAndCommStillWorks) {
  MKTEST_REQUIRE_GPU();
  colltest::Clique& q = colltest::clique(2);
  ASSERT_TRUE(q.ok) << q.why;
  Buf a(4096), b(4096), c(4096);
  ncclFusedConfig_t cfg = NCCL_FUSED_CONFIG_INITIALIZER;
  EXPECT_EQ(
      ncclGemmAllReduce(a.p, b.p, c.p, 16, 16, 12, ncclBfloat16, &cfg, q.comms[0], q.streams[0]),
      ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("multiple of 8"), std::string::npos);
  EXPECT_EQ(ncclGemmReduceScatter(a.p, b.p, c.p, 15, 16, 16, ncclBfloat16, &cfg, q.comms[0],
                                  q.streams[0]),
            ncclInvalidArgument);
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(
      ncclGemmAllReduce(a.p, b.p, c.p, 16, 16, 16, ncclBfloat16, &cfg, q.comms[0], q.streams[0]),
      ncclInvalidUsage);
  ncclGroupEnd();  // may report the refused call: NCCL returns a group's recorded error
  Case ok{0, 2, 64, 64, 64, 0, ncclBfloat16, ncclBfloat16, false, 0};
  EXPECT_EQ(runCase(ok, 5), "");
}

}  // namespace
