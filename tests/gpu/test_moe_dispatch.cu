// ncclMoeDispatchGemm (include/mkernel/fused.h) on ranks sharing GPU 0, one thread per rank.
// Each case draws fresh routing (uniform, one hot expert, experts left empty, -1 slots), token
// counts that are not tile multiples, and checks every rank's whole output against a host
// reference derived from the routing alone: counts, offsets, the source and weight of every
// row, every received token row (exact), -1 sources on padding rows, and every element of y
// against a double-precision product of the same bf16/fp16 inputs. Outputs are poisoned
// first. Also: graph capture replayed with new routing, a receiver's bound exceeded (reported
// through ncclCommGetAsyncError, nothing received), ncclCommAbort while a peer never comes,
// and the argument rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#include <chrono>
#include <thread>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "common/test_util.h"
#include "gpu/test_fused_util.cuh"
#include "gpu/test_proc_util.h"
#include "gpu/test_moe_clique_cases.h"
#include "gpu/test_moe_util.h"
#include "gpu/test_thread_team.h"
#include "mkernel/fused.h"

namespace {

using namespace moetest;  // the problem classes (MoeCase, MoeProblem, ...)

using fusedtest::waitRank;

std::string runOnce(gputest::Team& t, MoeProblem& p) {
  std::string err = t.run([&](int r) {
    return fusedtest::callAndWaitRank(r, t.comms[r], t.streams[r],
                                      p.call(r, t.comms[r], t.streams[r]));
  });
  for (int r = 0; r < t.n && err.empty(); ++r) err = p.check(r);
  return err;
}

class MoeDispatchThreads : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
};

TEST_P(MoeDispatchThreads, RandomRoutingEveryRowChecked) {
  const int n = GetParam();
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  const uint64_t seed = mktest::testSeed() ^ (0x30eull * n);
  std::mt19937_64 rng(seed);
  const int eprs[] = {1, 2, 3, 16};
  const int ks[] = {1, 2, 8};
  for (int i = 0; i < 6; ++i) {
    MoeCase c;
    c.n = n;
    c.epr = eprs[(i + n) % 4];
    c.k = ks[i % 3];
    c.H = i % 2 ? 136 : 64;
    c.N = i % 3 == 1 ? 200 : 128;
    c.in = i % 2 ? ncclFloat16 : ncclBfloat16;
    const ncclDataType_t outs[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
    c.out = i < 2 ? c.in : outs[i % 3];
    c.layout = i % 4 == 3 ? ncclFusedLayoutKN : ncclFusedLayoutNK;
    c.routing = (Routing)(i % 3);
    c.maxT = 150;
    MoeProblem p(c);
    ASSERT_EQ(p.draw(rng(), true, (int)(rng() % 200)), "") << caseName(c);
    ASSERT_EQ(runOnce(t, p), "") << caseName(c);
    // Back to back with new routing on the same buffers.
    ASSERT_EQ(p.draw(rng(), false, 0), "") << caseName(c);
    ASSERT_EQ(runOnce(t, p), "") << caseName(c) << " (second call)";
  }
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeDispatchThreads, ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// Captured once per rank thread (after an eager call), replayed with new routing written
// into the same input buffers: every replay checked.
TEST(MoeDispatchGraph, ReplaysWithNewRouting) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 4;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  MoeCase c{n, 2, 4, 64, 128, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 100};
  MoeProblem p(c);
  std::mt19937_64 rng(mktest::testSeed() ^ 0x9a9);
  const size_t rows = 4096;  // > 4 ranks x 100 tokens x 4 slots + 2 experts' padding
  ASSERT_EQ(p.draw(rng(), true, 0, -1, rows), "");
  ASSERT_EQ(runOnce(t, p), "");
  std::vector<cudaGraphExec_t> execs;
  ASSERT_EQ(captureEachRank(t, p, &execs), "");
  EXPECT_EQ(replayWithNewRouting(t, p, rng, rows, &execs), "");
}

// Rank 1's bound is one row short: it receives nothing (counts 0) and its comm reports the
// overflow naming the operation; the other ranks' calls complete and check out.
TEST(MoeDispatchOverflow, ReportedNeverDropped) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 3;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  MoeCase c{n, 2, 2, 64, 64, ncclBfloat16, ncclFloat32, ncclFusedLayoutNK, kUniform, 120};
  MoeProblem p(c);
  ASSERT_EQ(p.draw(mktest::testSeed() ^ 0x0f1, true, 0, 1), "");
  expectOverflowReported(t, p);
}

// Rank 0 calls, rank 1 never does: rank 0's dispatch kernel waits on the device for rank 1's
// counts until ncclCommAbort from another thread ends it (within 5 s, long before
// MKERNEL_TIMEOUT_MS), and the GPU stays usable: a new pair of ranks then dispatches and
// checks out.
TEST(MoeDispatchAbort, PeerNeverComes) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "120000");
  MoeCase c{2, 2, 2, 64, 64, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 50};
  {
    MoeProblem p(c);
    ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xab0, true, 0), "");
    expectAbortEndsLonelyCall(p, "dispatch kernel", [] {});
  }
  if (::testing::Test::HasFatalFailure()) return;
  gputest::Team t(2);
  ASSERT_TRUE(t.ok) << t.why;
  MoeProblem p(c);
  ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xab1, true, 0), "");
  const std::string err = t.run([&](int r) -> std::string {
    const ncclResult_t res = p.call(r, t.comms[r], t.streams[r]);
    if (res != ncclSuccess) return "call failed: " + std::string(ncclGetErrorString(res));
    return waitRank(r, t.comms[r], t.streams[r]);
  });
  ASSERT_EQ(err, "");
  EXPECT_EQ(p.check(0), "");
  EXPECT_EQ(p.check(1), "");
}

// Every rule of the header is checked before any CUDA call (ncclInvalidArgument).
TEST(MoeDispatchArgs, RulesRefusedWithAMessage) {
  MKTEST_REQUIRE_GPU();
  gputest::Team t(2);
  ASSERT_TRUE(t.ok) << t.why;
  MoeCase c{2, 2, 2, 64, 64, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 10};
  MoeProblem p(c);
  ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xa55, true, 0), "");
  RankData& d = p.rank(0);
  ncclMoeRecv_t recv{d.dxr, d.dy, d.dcnt, d.doff, d.dsrc, d.drw, d.maxRows};
  ncclMoeConfig_t cfg = NCCL_MOE_CONFIG_INITIALIZER;
  ncclComm_t comm = t.comms[0];
  cudaStream_t s = t.streams[0];
  auto call = [&](int E, int k, size_t H, ncclDataType_t in, const ncclMoeConfig_t* cf,
                  const ncclMoeRecv_t* rv) {
    return ncclMoeDispatchGemm(d.dx, d.didx, d.dwts, d.dw1, rv, d.T, H, 64, E, k, in, cf, comm, s);
  };
  EXPECT_EQ(call(3, 2, 64, ncclBfloat16, &cfg, &recv), ncclInvalidArgument);  // E % n
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("multiple of nranks"), std::string::npos);
  EXPECT_EQ(call(4, 0, 64, ncclBfloat16, &cfg, &recv), ncclInvalidArgument);     // k
  EXPECT_EQ(call(4, 2, 60, ncclBfloat16, &cfg, &recv), ncclInvalidArgument);     // H % 8
  EXPECT_EQ(call(4, 2, 64, ncclFloat32, &cfg, &recv), ncclInvalidArgument);      // inType
  EXPECT_EQ(call(2048, 2, 64, ncclBfloat16, &cfg, &recv), ncclInvalidArgument);  // E max
  ncclMoeConfig_t bad = cfg;
  bad.magic = 0;
  EXPECT_EQ(call(4, 2, 64, ncclBfloat16, &bad, &recv), ncclInvalidArgument);
  bad = cfg;
  bad.outType = ncclInt8;
  EXPECT_EQ(call(4, 2, 64, ncclBfloat16, &bad, &recv), ncclInvalidArgument);
  ncclMoeRecv_t r2 = recv;
  r2.y = nullptr;
  EXPECT_EQ(call(4, 2, 64, ncclBfloat16, &cfg, &r2), ncclInvalidArgument);
  r2 = recv;
  r2.maxRows = 0;
  EXPECT_EQ(call(4, 2, 64, ncclBfloat16, &cfg, &r2), ncclInvalidArgument);
  EXPECT_EQ(call(4, 2, 64, ncclBfloat16, &cfg, nullptr), ncclInvalidArgument);
  // Nothing ran: the poisoned outputs are untouched.
  int32_t cnt[2];
  ASSERT_EQ(cudaMemcpy(cnt, d.dcnt, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ((uint32_t)cnt[0], 0x5a5a5a5au);
}

}  // namespace
