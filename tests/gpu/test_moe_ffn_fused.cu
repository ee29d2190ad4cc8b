// ncclMoeDispatchFfnCombine with ncclFusedFused on ranks sharing GPU 0, one thread per rank: the
// fused layer kernel (fused/ops/moe/fused_ffn.cuh: dispatch, GEMM1 with SwiGLU, GEMM2 and
// combine in one persistent kernel per rank). Every case draws fresh tokens, weights and
// routing (uniform, one hot expert, experts left empty, all of a token's experts on one rank;
// -1 slots, tokens with every slot -1, token counts that are not tile multiples, several row
// tiles per expert), poisons every output and buffer, checks every element of every rank's y
// against the host reference of test_moe_util.h, then runs the sequential path on the same
// inputs (y poisoned again), checks it, and compares y bit for bit: the fused kernel runs the
// same engine arithmetic and the same combine sum. Every fused call asserts that the fused
// kernel ran (moeFfnFusedLaunches), every ncclFusedAuto call that it did not. Also: forced
// splits, graph capture replayed with new routing, a receiver's bound exceeded and a bad expert
// id (reported while the peers complete correct), ranks on different paths (an error, not a
// fault), ncclCommAbort while a peer never comes, and the weights in the [K,N] layout (no
// SwiGLU epilogue: the sequential path runs).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include "common/test_util.h"
#include "fused/ops/moe/moe.h"  // moeFfnFusedLaunches
#include "gpu/test_fused_util.cuh"
#include "gpu/test_moe_clique_cases.h"
#include "gpu/test_moe_util.h"
#include "gpu/test_thread_team.h"
#include "mkernel/fused.h"

namespace {

using namespace moetest;

uint64_t launches() {
  return mk::fused::moeFfnFusedLaunches();
}

// Every rank's call with p.algo, then every rank checked; the fused kernel must have run once
// per rank with ncclFusedFused on the [N,K] layout, and never otherwise. callMs: the calls'
// wall time until every rank's stream is done (the checks not included).
std::string runChecked(gputest::Team& t, FfnProblem& p, double* callMs = nullptr) {
  const uint64_t before = launches();
  const auto t0 = std::chrono::steady_clock::now();
  std::string err = t.run([&](int r) {
    return fusedtest::callAndWaitRank(r, t.comms[r], t.streams[r],
                                      p.call(r, t.comms[r], t.streams[r]));
  });
  if (callMs != nullptr)
    *callMs =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (err.empty()) err = t.run([&](int r) { return p.check(r); });
  const uint64_t ran = launches() - before;
  const bool fused = p.algo == ncclFusedFused && p.c().layout == ncclFusedLayoutNK;
  const uint64_t want = fused ? (uint64_t)t.n : 0;
  if (err.empty() && ran != want)
    err = "fused layer kernel launched " + std::to_string(ran) + " times, expected " +
          std::to_string(want);
  return err;
}

// Fused, checked; then sequential on the same inputs, checked; y compared bit for bit.
std::string fusedVsSequential(gputest::Team& t, FfnProblem& p) {
  p.algo = ncclFusedFused;
  std::string err = runChecked(t, p);
  if (!err.empty()) return "fused: " + err;
  std::vector<std::vector<uint8_t>> fused(t.n);
  for (int r = 0; r < t.n && err.empty(); ++r) err = p.readY(r, &fused[r]);
  for (int r = 0; r < t.n && err.empty(); ++r) err = p.poisonY(r);
  if (!err.empty()) return err;
  p.algo = ncclFusedAuto;
  err = runChecked(t, p);
  p.algo = ncclFusedFused;
  if (!err.empty()) return "sequential: " + err;
  for (int r = 0; r < t.n; ++r) {
    std::vector<uint8_t> seq;
    err = p.readY(r, &seq);
    if (!err.empty()) return err;
    for (size_t i = 0; i < seq.size(); ++i)
      if (seq[i] != fused[r][i])
        return "rank " + std::to_string(r) + ": y byte " + std::to_string(i) +
               " differs from the sequential path's";
  }
  return "";
}

class MoeFfnFusedThreads : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
};

TEST_P(MoeFfnFusedThreads, EveryElementCheckedAndBitwiseSequential) {
  const int n = GetParam();
  const uint64_t seed = mktest::testSeed() ^ (0xff5eull * n);
  SCOPED_TRACE("seed " + std::to_string(seed) +
               " (MKTEST_SEED=" + std::to_string(mktest::testSeed()) + " repeats it)");
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  std::mt19937_64 rng(seed);
  const int eprs[] = {1, 3, 8, 2};
  const int ks[] = {1, 2, 6, 8};
  const ncclDataType_t outs[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
  for (int i = 0; i < 6; ++i) {
    FfnCase c;
    c.n = n;
    c.epr = eprs[(i + n) % 4];
    c.k = ks[(i + n / 2) % 4];
    // H: GEMM2's column tiles of 256 (1; 3 with a tail: GEMM2's tiles are twice as wide as
    // GEMM1's gated ones, so a column mix-up leaves columns unwritten); I: GEMM1's SwiGLU
    // tiles of 128 (tails too).
    c.H = i % 3 == 2 ? 640 : (i % 3 == 1 ? 200 : 64);
    c.I = i < 2 ? 32 : (i < 4 ? 320 : 128);
    c.in = i % 2 ? ncclFloat16 : ncclBfloat16;
    c.out = outs[i % 3];
    c.layout = ncclFusedLayoutNK;
    c.routing = (Routing)((i + n) % 4);
    c.minT = 37;
    c.maxT = i % 2 ? 700 : 240;  // several row tiles per expert at the larger counts
    FfnProblem p(c);
    ASSERT_EQ(
        drawRunTwice(p, rng, i == 4 && n > 1 ? n - 1 : -1, [&] { return fusedVsSequential(t, p); }),
        "")
        << caseName(c);
  }
}

INSTANTIATE_TEST_SUITE_P(MoeFfnFused, MoeFfnFusedThreads, ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// The split forced from the config: one dispatch CTA, then all of the rank's CTAs but one; and
// the [K,N] layout, which the fused kernel does not take (the sequential path runs, correct).
TEST(MoeFfnFusedSplit, ForcedCommSmsAndKnLayout) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 4;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  // H 1032: five GEMM2 column tiles, the last 8 columns wide.
  FfnCase c{n, 3, 6, 1032, 256, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kHotExpert, 37, 300};
  std::mt19937_64 rng(mktest::testSeed() ^ 0x5b2);
  for (int sms : {1, 1000}) {
    FfnProblem p(c);
    p.commSms = sms;  // 1000: clamped to the rank's budget less one CTA
    DrawOpts o;
    o.slack = 64;
    ASSERT_EQ(p.draw(rng(), o), "") << "commSms " << sms;
    ASSERT_EQ(fusedVsSequential(t, p), "") << "commSms " << sms;
  }
  c.layout = ncclFusedLayoutKN;
  FfnProblem p(c);
  p.algo = ncclFusedFused;
  ASSERT_EQ(p.draw(rng(), DrawOpts{}), "");
  EXPECT_EQ(runChecked(t, p), "") << "[K,N] weights with ncclFusedFused";
}

// Tile 0 of GEMM1 and tile 0 of GEMM2 held 3 ms before their stores
// (MKERNEL_MOE_FFN_TEST_DELAY_US), so they land after every other tile: GEMM2's tiles of that
// row block must wait for GEMM1's counter, and the combines reading it (on every rank) for
// GEMM2's. A reader that did not wait would take the NaNs that every draw puts into act and
// out, which the element checks catch. Each fused call lasts at least twice the delay: GEMM2's
// tile 0 reads GEMM1's tile 0's rows (the first row block of the first expert with rows), so
// its own delay follows the first one (without that wait the two would overlap).
TEST(MoeFfnFusedLate, ReadersWaitForLateTiles) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  constexpr int kDelayUs = 3000;
  mktest::ScopedEnv delay("MKERNEL_MOE_FFN_TEST_DELAY_US", std::to_string(kDelayUs).c_str());
  std::mt19937_64 rng(mktest::testSeed() ^ 0x1a7e);
  for (int n : {1, 2, 4}) {
    gputest::Team t(n);
    ASSERT_TRUE(t.ok) << t.why;
    // H 640: three GEMM2 column tiles; I 320: three GEMM1 column tiles (tails in both).
    FfnCase c{n, 2, 4, 640, 320, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 150, 400};
    FfnProblem p(c);
    double minMs = 1e30;  // the shortest fused call (the first one carries setup costs too)
    const std::string err = drawRunTwice(p, rng, -1, [&] {
      p.algo = ncclFusedFused;
      double ms = 0;
      std::string e = runChecked(t, p, &ms);
      minMs = std::min(minMs, ms);
      if (e.empty()) e = fusedVsSequential(t, p);  // and bitwise against the sequential path
      return e;
    });
    ASSERT_EQ(err, "") << caseName(c);
    EXPECT_GE(minMs, 2.0 * kDelayUs / 1000.0)
        << "n " << n << ": the delays did not run one after the other";
  }
}

// Captured once per rank thread (after an eager call), replayed with new routing, tokens and
// weights written into the same buffers: every replay checked, the fused kernel in the graph.
TEST(MoeFfnFusedGraph, ReplaysWithNewRouting) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const uint64_t seed = mktest::testSeed() ^ 0x9b1;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 4;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  FfnCase c{n, 2, 6, 768, 128, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 37, 300};
  FfnProblem p(c);
  p.algo = ncclFusedFused;
  std::mt19937_64 rng(seed);
  // Enough for any routing: every slot of every rank on one expert, plus the padding.
  const size_t rows = (size_t)n * c.maxT * c.k + (size_t)c.epr * NCCL_MOE_ROW_ALIGN;
  DrawOpts o;
  o.fixedRows = rows;
  ASSERT_EQ(p.draw(rng(), o), "");
  ASSERT_EQ(runChecked(t, p), "") << "eager call";
  const uint64_t before = launches();
  std::vector<cudaGraphExec_t> execs;
  std::string err = captureEachRank(t, p, &execs);
  EXPECT_EQ(launches() - before, (uint64_t)n) << "the captured call must be the fused kernel";
  if (err.empty()) err = replayFfnWithNewRouting(t, p, rng, rows, 4, &execs);
  EXPECT_EQ(err, "");
}

// Rank 1's bound is one row short: it receives nothing, its comm reports the overflow naming
// the op and the rows (recorded at the end of the fused kernel); its peers complete, their
// slots routed to rank 1's experts contribute zeros and every other slot is correct.
TEST(MoeFfnFusedOverflow, ReportedPeersComplete) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "5000");  // a peer left waiting fails fast
  const uint64_t seed = mktest::testSeed() ^ 0x0f3;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 3, tight = 1;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  FfnCase c{n, 2, 2, 64, 32, ncclBfloat16, ncclFloat32, ncclFusedLayoutNK, kUniform, 37, 120};
  FfnProblem p(c);
  p.algo = ncclFusedFused;
  DrawOpts o;
  o.tight = tight;
  ASSERT_EQ(p.draw(seed, o), "");
  const uint64_t before = launches();
  expectFfnOverflowReported(t, p, tight);
  EXPECT_EQ(launches() - before, (uint64_t)n);
}

// One topkIdx entry of rank 2 is E + 5: its comm reports the slot and the id once the layer is
// done, while its GEMMs still serve its peers' combines; every other slot of every rank is
// correct, rank 2's own y included.
TEST(MoeFfnFusedBadId, ReportedOtherSlotsCorrect) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "5000");
  const uint64_t seed = mktest::testSeed() ^ 0xbae;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 3, bad = 2;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  FfnCase c{n, 2, 3, 64, 32, ncclFloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 37, 120};
  FfnProblem p(c);
  p.algo = ncclFusedFused;
  DrawOpts o;
  o.badRank = bad;
  ASSERT_EQ(p.draw(seed, o), "");
  const uint64_t before = launches();
  // The error is recorded at the kernel's end: even the failing rank's y is complete.
  expectFfnBadIdReported(t, p, bad, true);
  EXPECT_EQ(launches() - before, (uint64_t)n);
}

// Rank 0 passes ncclFusedFused, rank 1 ncclFusedAuto (the sequential path): a caller's
// mistake that must end in errors, not in a fault or a hang. Rank 0's combine finds rank 1's
// slot without its rows and reports that rank 1 ran the sequential path; rank 1's combine waits
// for rank 0's sequential slot until its timeout; the GPU stays usable.
TEST(MoeFfnFusedMixed, PeerOnTheSequentialPathIsAnError) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "3000");
  const int n = 2;
  std::vector<std::string> errs(n);
  {
    gputest::Team t(n);
    ASSERT_TRUE(t.ok) << t.why;
    // Many tokens, k 2 of 4 experts: rank 0 routes some to rank 1's experts for sure.
    FfnCase c{n, 2, 2, 64, 32, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 200, 300};
    FfnProblem p(c);
    p.fusedRank = 0;
    ASSERT_EQ(p.draw(mktest::testSeed() ^ 0x31c, DrawOpts{}), "");
    const std::string err = t.run([&](int r) -> std::string {
      const ncclResult_t res = p.call(r, t.comms[r], t.streams[r]);
      errs[r] = res != ncclSuccess ? std::string("call: ") + ncclGetLastError(t.comms[r])
                                   : fusedtest::waitRank(r, t.comms[r], t.streams[r]);
      return drain(t.streams[r]);
    });
    ASSERT_EQ(err, "");
  }
  EXPECT_NE(errs[0].find("rank 1 ran this call on the sequential path"), std::string::npos)
      << errs[0];
  EXPECT_NE(errs[1], "") << "rank 1 must report its timeout, not end clean";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the CUDA context must stay usable";
}

// Rank 0 calls, rank 1 never does: rank 0's fused kernel waits on the device until
// ncclCommAbort from another thread ends it (within 5 s), and the GPU stays usable: a new pair
// of ranks then runs the fused layer and checks out.
TEST(MoeFfnFusedAbort, PeerNeverComes) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "120000");
  FfnCase c{2, 2, 2, 64, 32, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 37, 50};
  {
    FfnProblem p(c);
    p.algo = ncclFusedFused;
    ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xab4, DrawOpts{}), "");
    const uint64_t before = launches();
    expectAbortEndsLonelyCall(p, "fused layer kernel", [&] { EXPECT_EQ(launches() - before, 1u); });
  }
  if (::testing::Test::HasFatalFailure()) return;
  gputest::Team t(2);
  ASSERT_TRUE(t.ok) << t.why;
  FfnProblem p(c);
  ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xab5, DrawOpts{}), "");
  EXPECT_EQ(fusedVsSequential(t, p), "");
}

}  // namespace
