// ncclMoeDispatchGemm with ncclFusedFused on ranks sharing GPU 0, one thread per rank: the fused
// dispatch + grouped GEMM kernel (fused/ops/moe/fused_moe.cuh). Every case draws fresh routing
// (uniform, one hot expert, experts left empty; -1 slots; token counts that are not tile
// multiples), poisons every output, checks every rank's whole output against the host reference
// of test_moe_util.h (layout, sources, weights, token rows exact, y against a double-precision
// product), then runs the sequential path on the same inputs (outputs poisoned again) and
// compares every row of y bit for bit: the fused kernel runs the same engine arithmetic. Every
// fused call asserts that the fused kernel ran (moeFusedLaunches) and every ncclFusedAuto call
// that it did not (auto keeps the sequential path until the fused kernel is measured faster).
// Also: graph capture replayed with new routing, a receiver's bound exceeded, ncclCommAbort
// while a peer never comes, and forced splits (one dispatch CTA; all but one GEMM CTA).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include "common/test_util.h"
#include "fused/ops/moe/moe.h"  // moeFusedLaunches
#include "gpu/test_fused_util.cuh"
#include "gpu/test_moe_clique_cases.h"
#include "gpu/test_moe_util.h"
#include "gpu/test_proc_util.h"
#include "gpu/test_thread_team.h"
#include "mkernel/fused.h"

namespace {

using namespace moetest;
using fusedtest::waitRank;

uint64_t launches() {
  return mk::fused::moeFusedLaunches();
}

// The rows of y that belong to an expert (offsets and counts as rank r's call wrote them),
// concatenated: padding rows hold unspecified values on both paths and are left out.
std::string expertRows(MoeProblem& p, int r, std::vector<uint8_t>* out) {
  RankData& d = p.rank(r);
  const int epr = p.c().epr;
  const size_t rowBytes = (size_t)p.c().N * fusedtest::esOf(p.c().out);
  std::vector<int32_t> cnt(epr), off(epr + 1);
  std::vector<uint8_t> y(d.maxRows * rowBytes);
  MOE_CUDA(cudaMemcpy(cnt.data(), d.dcnt, epr * 4, cudaMemcpyDeviceToHost));
  MOE_CUDA(cudaMemcpy(off.data(), d.doff, (epr + 1) * 4, cudaMemcpyDeviceToHost));
  MOE_CUDA(cudaMemcpy(y.data(), d.dy, y.size(), cudaMemcpyDeviceToHost));
  out->clear();
  for (int le = 0; le < epr; ++le) {
    if (cnt[le] < 0 || off[le] < 0 || (size_t)off[le] + cnt[le] > d.maxRows)
      return "rank " + std::to_string(r) + ": expert " + std::to_string(le) + " out of bounds";
    out->insert(out->end(), y.begin() + (size_t)off[le] * rowBytes,
                y.begin() + ((size_t)off[le] + cnt[le]) * rowBytes);
  }
  return "";
}

std::string poisonY(MoeProblem& p, int r) {
  RankData& d = p.rank(r);
  MOE_CUDA(mktest::syncMemset(d.dy, 0xa5, d.maxRows * p.c().N * fusedtest::esOf(p.c().out)));
  MOE_CUDA(mktest::syncMemset(d.dxr, 0xa5, d.maxRows * p.c().H * 2));
  return "";
}

// Every rank's call with p.algo, then its checks; the fused kernel must have run once per
// rank with ncclFusedFused and never with ncclFusedAuto.
std::string runChecked(gputest::Team& t, MoeProblem& p) {
  const uint64_t before = launches();
  std::string err = t.run([&](int r) {
    return fusedtest::callAndWaitRank(r, t.comms[r], t.streams[r],
                                      p.call(r, t.comms[r], t.streams[r]));
  });
  for (int r = 0; r < t.n && err.empty(); ++r) err = p.check(r);
  const uint64_t ran = launches() - before;
  const uint64_t want = p.algo == ncclFusedFused ? (uint64_t)t.n : 0;
  if (err.empty() && ran != want)
    err =
        "fused kernel launched " + std::to_string(ran) + " times, expected " + std::to_string(want);
  return err;
}

// Fused, checked; then sequential on the same inputs, checked; y compared bit for bit.
std::string fusedVsSequential(gputest::Team& t, MoeProblem& p) {
  p.algo = ncclFusedFused;
  std::string err = runChecked(t, p);
  if (!err.empty()) return "fused: " + err;
  std::vector<std::vector<uint8_t>> fused(t.n);
  for (int r = 0; r < t.n && err.empty(); ++r) err = expertRows(p, r, &fused[r]);
  for (int r = 0; r < t.n && err.empty(); ++r) err = poisonY(p, r);
  if (!err.empty()) return err;
  p.algo = ncclFusedAuto;
  err = runChecked(t, p);
  p.algo = ncclFusedFused;
  if (!err.empty()) return "sequential: " + err;
  for (int r = 0; r < t.n; ++r) {
    std::vector<uint8_t> seq;
    err = expertRows(p, r, &seq);
    if (!err.empty()) return err;
    if (seq.size() != fused[r].size()) return "rank " + std::to_string(r) + ": row counts differ";
    for (size_t i = 0; i < seq.size(); ++i)
      if (seq[i] != fused[r][i])
        return "rank " + std::to_string(r) + ": y byte " + std::to_string(i) +
               " differs from the sequential path's";
  }
  return "";
}

class MoeFusedThreads : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
};

TEST_P(MoeFusedThreads, EveryRowCheckedAndBitwiseSequential) {
  const int n = GetParam();
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  std::mt19937_64 rng(mktest::testSeed() ^ (0xf0eull * n));
  const int eprs[] = {1, 2, 3, 16};
  const int ks[] = {1, 2, 8, 5};
  for (int i = 0; i < 8; ++i) {
    MoeCase c;
    c.n = n;
    c.epr = eprs[(i + n) % 4];
    c.k = ks[i % 4];
    c.H = i % 2 ? 136 : 256;
    c.N = i % 3 == 1 ? 200 : 384;
    c.in = i % 2 ? ncclFloat16 : ncclBfloat16;
    const ncclDataType_t outs[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
    c.out = i < 2 ? c.in : outs[i % 3];
    c.layout = i % 4 == 3 ? ncclFusedLayoutKN : ncclFusedLayoutNK;
    c.routing = (Routing)(i % 3);
    // Several row tiles per expert at the larger token counts (rows land while tiles run).
    c.maxT = i % 4 == 2 ? 700 : 150;
    MoeProblem p(c);
    ASSERT_EQ(p.draw(rng(), true, (int)(rng() % 200)), "") << caseName(c);
    ASSERT_EQ(fusedVsSequential(t, p), "") << caseName(c);
    // Back to back with new routing on the same buffers.
    ASSERT_EQ(p.draw(rng(), false, 0), "") << caseName(c);
    ASSERT_EQ(fusedVsSequential(t, p), "") << caseName(c) << " (second call)";
  }
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeFusedThreads, ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// The split forced from the config: one dispatch CTA, then all of the rank's CTAs but one.
TEST(MoeFusedSplit, ForcedCommSmsSameBits) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 4;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  MoeCase c{n, 3, 6, 264, 256, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kHotExpert, 400};
  MoeProblem p(c);
  std::mt19937_64 rng(mktest::testSeed() ^ 0x5b1);
  for (int sms : {1, 1000}) {
    p.commSms = sms;  // 1000: clamped to the rank's budget less one GEMM CTA
    ASSERT_EQ(p.draw(rng(), true, 64), "") << "commSms " << sms;
    ASSERT_EQ(fusedVsSequential(t, p), "") << "commSms " << sms;
  }
}

// Captured once per rank thread (after an eager call), replayed with new routing written into
// the same input buffers: every replay checked, and the fused kernel is in the graph.
TEST(MoeFusedGraph, ReplaysWithNewRouting) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 4;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  MoeCase c{n, 2, 4, 64, 128, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 300};
  MoeProblem p(c);
  p.algo = ncclFusedFused;
  std::mt19937_64 rng(mktest::testSeed() ^ 0x9f9);
  const size_t rows = 8192;  // > 4 ranks x 300 tokens x 4 slots + 2 experts' padding
  ASSERT_EQ(p.draw(rng(), true, 0, -1, rows), "");
  ASSERT_EQ(runChecked(t, p), "");
  const uint64_t before = launches();
  std::vector<cudaGraphExec_t> execs;
  ASSERT_EQ(captureEachRank(t, p, &execs), "");
  EXPECT_EQ(launches() - before, (uint64_t)n) << "the captured call must be the fused kernel";
  EXPECT_EQ(replayWithNewRouting(t, p, rng, rows, &execs), "");
}

// Rank 1's bound is one row short: it receives nothing (counts 0), its GEMM has no tile, and
// its comm reports the overflow naming the operation; the other ranks' calls check out.
TEST(MoeFusedOverflow, ReportedNeverDropped) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 3;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  MoeCase c{n, 2, 2, 64, 64, ncclBfloat16, ncclFloat32, ncclFusedLayoutNK, kUniform, 120};
  MoeProblem p(c);
  p.algo = ncclFusedFused;
  ASSERT_EQ(p.draw(mktest::testSeed() ^ 0x0f2, true, 0, 1), "");
  const uint64_t before = launches();
  expectOverflowReported(t, p);
  EXPECT_EQ(launches() - before, (uint64_t)n);
}

// Rank 0 calls, rank 1 never does: rank 0's fused kernel (dispatch CTAs waiting for rank 1's
// counts, GEMM CTAs for the layout) waits on the device until ncclCommAbort from another
// thread ends it (within 5 s, long before MKERNEL_TIMEOUT_MS), and the GPU stays usable: a
// new pair of ranks then runs the fused call and checks out.
TEST(MoeFusedAbort, PeerNeverComes) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "120000");
  MoeCase c{2, 2, 2, 64, 64, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 50};
  {
    MoeProblem p(c);
    p.algo = ncclFusedFused;
    ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xab2, true, 0), "");
    const uint64_t before = launches();
    expectAbortEndsLonelyCall(p, "fused kernel", [&] { EXPECT_EQ(launches() - before, 1u); });
  }
  if (::testing::Test::HasFatalFailure()) return;
  gputest::Team t(2);
  ASSERT_TRUE(t.ok) << t.why;
  MoeProblem p(c);
  ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xab3, true, 0), "");
  EXPECT_EQ(fusedVsSequential(t, p), "");
}

}  // namespace
