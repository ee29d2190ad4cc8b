// ncclMoeDispatchFfnCombine (include/mkernel/fused.h) on ranks sharing GPU 0, one thread per
// rank. Each case draws fresh tokens, expert weights and routing (uniform, one hot expert,
// experts left empty, -1 slots, tokens with every slot -1), token counts that are not tile
// multiples, poisons every output and buffer with NaN, and checks every rank's counts and
// offsets and EVERY element of its y against a host reference (test_moe_util.h), independently of
// the library: per routed slot, h = x W1^T in fp64, rounded to inType where the implementation
// stores h (w1 [K,N]; with [N,K] GEMM1 applies SwiGLU to its fp32 accumulators), act =
// silu(gate) * up in fp32 from that h, rounded to inType,
// out = act W2^T in fp64 rounded to inType (every combine takes the experts' outputs so), and
// y[t] = sum_j w[t][j] out_j. Also: graph capture replayed with new routing and inputs, a
// receiver's bound exceeded and a bad expert id (both reported through ncclCommGetAsyncError
// while the peers complete with correct results), and the API's argument rules.
//
// Tolerance per element: |got - ref| <= rIn * absRef + sum_j |w_j| (rIn |out_j| + sIn)
// + uOut * |ref| (+ fp16's subnormal step), absRef = sum_j |w_j| sum_i |act_i W2_ci|. rIn is one
// ulp of inType relative (2^-7 bf16, 2^-10 fp16), sIn its subnormal step (2^-24 fp16, 0 bf16):
// the library accumulates in fp32, so a stored h, act or out element may round to the neighbour
// of the reference's (rarely: only near a rounding boundary); even if every one did, the error
// stays inside the first two terms. uOut covers the final rounding to outType. A token whose
// slots are all -1 (absRef = 0) must be exactly 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "common/test_util.h"
#include "gpu/test_fused_util.cuh"
#include "gpu/test_moe_clique_cases.h"
#include "gpu/test_moe_util.h"
#include "gpu/test_thread_team.h"
#include "mkernel/fused.h"

namespace {

using fusedtest::esOf;
using fusedtest::waitRank;
using namespace moetest;  // the problem classes (FfnCase, FfnProblem, ...)

std::string callAndWait(gputest::Team& t, FfnProblem& p, int r) {
  return fusedtest::callAndWaitRank(r, t.comms[r], t.streams[r],
                                    p.call(r, t.comms[r], t.streams[r]));
}

// One call per rank thread, then every rank checked (in parallel, one rank per thread).
std::string runAndCheck(gputest::Team& t, FfnProblem& p) {
  const std::string err = t.run([&](int r) { return callAndWait(t, p, r); });
  if (!err.empty()) return err;
  return t.run([&](int r) { return p.check(r); });
}

class MoeFfnThreads : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
};

TEST_P(MoeFfnThreads, RandomRoutingEveryElementChecked) {
  const int n = GetParam();
  const uint64_t seed = mktest::testSeed() ^ (0xff17ull * n);
  SCOPED_TRACE("seed " + std::to_string(seed) +
               " (MKTEST_SEED=" + std::to_string(mktest::testSeed()) + " repeats it)");
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  std::mt19937_64 rng(seed);
  const int eprs[] = {1, 3, 8};
  const int ks[] = {1, 2, 6};
  const ncclDataType_t outs[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
  for (int i = 0; i < 6; ++i) {
    FfnCase c;
    c.n = n;
    c.epr = eprs[(i + n) % 3];
    c.k = ks[(i + n / 2) % 3];
    c.H = i % 3 == 2 ? 128 : 64;
    c.I = i < 3 ? 32 : 64;
    c.in = i % 2 ? ncclFloat16 : ncclBfloat16;
    c.out = outs[i % 3];  // with c.in: every (in, out) pair once
    c.layout = (i / 2) % 2 ? ncclFusedLayoutKN : ncclFusedLayoutNK;
    c.routing = (Routing)((i / 2 + n) % 3);
    c.minT = 37;
    c.maxT = 300;
    FfnProblem p(c);
    ASSERT_EQ(drawRunTwice(p, rng, i == 4 && n > 1 ? n - 1 : -1, [&] { return runAndCheck(t, p); }),
              "")
        << caseName(c);
  }
}

INSTANTIATE_TEST_SUITE_P(MoeFfn, MoeFfnThreads, ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// Captured once per rank thread (after an eager call), replayed with new routing, tokens and
// weights written into the same buffers: every replay checked.
TEST(MoeFfnGraph, ReplaysWithNewRouting) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const uint64_t seed = mktest::testSeed() ^ 0x9af;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 4;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  FfnCase c{n, 2, 6, 64, 32, ncclBfloat16, ncclBfloat16, ncclFusedLayoutKN, kUniform, 37, 200};
  FfnProblem p(c);
  std::mt19937_64 rng(seed);
  // Enough for any routing: every slot of every rank on one expert, plus the padding.
  const size_t rows = (size_t)n * c.maxT * c.k + (size_t)c.epr * NCCL_MOE_ROW_ALIGN;
  DrawOpts o;
  o.fixedRows = rows;
  ASSERT_EQ(p.draw(rng(), o), "");
  ASSERT_EQ(runAndCheck(t, p), "") << "eager call";
  std::vector<cudaGraphExec_t> execs;
  std::string err = captureEachRank(t, p, &execs);
  if (err.empty()) err = replayFfnWithNewRouting(t, p, rng, rows, 3, &execs);
  EXPECT_EQ(err, "");
}

// Rank 1's bound is one row short: it receives nothing (counts 0), its comm reports the
// overflow naming the op and the rows; its peers complete, their slots routed to rank 1's
// experts contribute zeros and every other slot is correct.
TEST(MoeFfnOverflow, ReportedPeersComplete) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "5000");  // a peer left waiting fails fast
  const uint64_t seed = mktest::testSeed() ^ 0x0f2;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 3, tight = 1;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  FfnCase c{n, 2, 2, 64, 32, ncclBfloat16, ncclFloat32, ncclFusedLayoutNK, kUniform, 37, 120};
  FfnProblem p(c);
  DrawOpts o;
  o.tight = tight;
  ASSERT_EQ(p.draw(seed, o), "");
  expectFfnOverflowReported(t, p, tight);
}

// One topkIdx entry of rank 2 is E + 5: its comm reports the slot and the id; the slot counts
// as unused everywhere (layouts without it) and contributes nothing; every other slot of every
// rank is correct.
TEST(MoeFfnBadId, ReportedOtherSlotsCorrect) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "5000");
  const uint64_t seed = mktest::testSeed() ^ 0xbad;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 3, bad = 2;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  FfnCase c{n, 2, 3, 64, 32, ncclFloat16, ncclBfloat16, ncclFusedLayoutKN, kUniform, 37, 120};
  FfnProblem p(c);
  DrawOpts o;
  o.badRank = bad;
  ASSERT_EQ(p.draw(seed, o), "");
  expectFfnBadIdReported(t, p, bad, false);
}

// The rules of the whole layer beyond the dispatch's, refused before any CUDA work.
TEST(MoeFfnArgs, RulesRefusedWithAMessage) {
  MKTEST_REQUIRE_GPU();
  gputest::Team t(2);
  ASSERT_TRUE(t.ok) << t.why;
  FfnCase c{2, 2, 2, 64, 32, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 37, 60};
  FfnProblem p(c);
  ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xa56, DrawOpts()), "");
  Rank& d = p.rank(0);
  const ncclMoeFfnBuffers_t good = p.buffers(0);
  ncclComm_t comm = t.comms[0];
  struct Args {
    const float* wts;
    const void* w2;
    void* y;
    ncclMoeFfnBuffers_t buf;
    bool noBuf;
    size_t inter;
  };
  const Args ok{d.dwts.as<float>(), d.dw2.p, d.dy.p, good, false, 32};
  auto refused = [&](Args a, const std::string& what) {
    const ncclResult_t res = ncclMoeDispatchFfnCombine(
        d.dx.p, d.didx.as<int>(), a.wts, d.dw1.p, a.w2, a.y, a.noBuf ? nullptr : &a.buf, d.T, 64,
        a.inter, 4, 2, ncclBfloat16, nullptr, comm, t.streams[0]);
    EXPECT_EQ(res, ncclInvalidArgument) << what;
    const std::string m = ncclGetLastError(comm);
    EXPECT_NE(m.find(what), std::string::npos) << what << ": " << m;
    EXPECT_NE(m.find("ncclMoeDispatchFfnCombine"), std::string::npos) << m;
  };
  Args a = ok;
  a.inter = 36;
  refused(a, "inter=36");
  a.inter = size_t(1) << 30;
  refused(a, "below 2^30");
  const std::string nulls = "buf->act and buf->out must not be NULL";
  a = ok;
  a.w2 = nullptr;
  refused(a, nulls);
  a = ok;
  a.y = nullptr;
  refused(a, nulls);
  a = ok;
  a.buf.act = nullptr;
  refused(a, nulls);
  a = ok;
  a.buf.out = nullptr;
  refused(a, nulls);
  a = ok;
  a.wts = nullptr;
  refused(a, "topkWeights must not be NULL");
  a = ok;
  a.y = static_cast<char*>(d.dy.p) + 8;
  refused(a, "w2, y, buf->act and buf->out must be 16-byte aligned");
  a = ok;
  a.buf.out = d.dout.as<float>() + 1;
  refused(a, "w2, y, buf->act and buf->out must be 16-byte aligned");
  a = ok;
  a.buf.h = nullptr;
  refused(a, "buf->h");
  a = ok;
  a.noBuf = true;
  refused(a, "buf must not be NULL");
  // Nothing ran: the poisoned outputs are untouched.
  int32_t cnt = 0;
  uint32_t y = 0;
  ASSERT_EQ(cudaMemcpy(&cnt, d.dcnt.p, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&y, d.dy.p, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ((uint32_t)cnt, 0x5a5a5a5au);
  EXPECT_EQ(y, 0xffffffffu);
}

}  // namespace
