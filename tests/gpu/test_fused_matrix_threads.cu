// The test matrix of the fused GEMM + collective calls, part 2: ranks sharing GPU 0 as
// threads of this process, ONE THREAD PER RANK (each thread creates its rank with
// ncclCommInitRank from one shared id and drives it on its own stream, as nccl-tests -t and
// one-thread-per-device frameworks do). Calls meet in the host rendezvous of
// src/coll/rendezvous.h before any kernel that waits for a peer is launched.
//   - FusedMatrix/FusedMatrixThreadPerRank.EveryCall/nN: ranks 1, 2, 3, 4, 8 x the three calls
//     x algo auto and fused x two shapes (tails in M, N, K with N % 4 == 0, where the fused
//     kernel runs, and N % 4 != 0, where it declines), both B layouts, every output type,
//     bias; every other case with a device-wide synchronisation at a random skew right
//     before the call (what nccl-tests does between calls);
//   - FusedMatrix/FusedMatrixThreadPerRankGraph.ReplaysWithNewInputs/nN (2 and 4 ranks): each
//   thread
//     captures its call once (thread-local capture), 50 replays with new inputs;
//   - FusedMatrixThreadPerRankAbort: a rank whose thread never makes its call: the caller
//     gets an error naming that rank at MKERNEL_TIMEOUT_MS, ncclCommAbort from another
//     thread returns within 5 s, the GPU stays usable.
// The test thread prepares inputs and references and checks outputs while the rank threads
// wait between steps (test_fused_util.cuh); every wait is bounded.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "gpu/test_devcomm_util.h"
#include "gpu/test_fused_util.cuh"
#include "gpu/test_proc_util.h"
#include "gpu/test_thread_team.h"

namespace {

using fusedtest::callError;
using fusedtest::Case;
using fusedtest::Problem;
using Clock = std::chrono::steady_clock;
using fusedtest::waitRank;
using gputest::since;

// One thread per rank (gpu/test_thread_team.h).
using RankThreads = gputest::Team;

// What nccl-tests does between calls: a random skew, then a device-wide synchronisation.
std::string skewAndSync(int r, uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003 + r);
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2001));
  const cudaError_t e = cudaDeviceSynchronize();
  return e == cudaSuccess ? "" : "rank " + std::to_string(r) + ": " + cudaGetErrorString(e);
}

// One eager run of p: inputs and reference by the test thread, the calls by the rank
// threads (optionally after skewAndSync), the checks by the test thread.
std::string runEager(RankThreads& t, Problem& p, uint64_t seed, bool deviceSync) {
  std::string err = p.fill(seed);
  if (!err.empty()) return err;
  err = t.run([&](int r) -> std::string {
    if (deviceSync) {
      const std::string e = skewAndSync(r, seed);
      if (!e.empty()) return e;
    }
    std::string e = callError(r, t.comms[r], p.call(r, t.comms[r], t.streams[r]));
    return e.empty() ? waitRank(r, t.comms[r], t.streams[r]) : e;
  });
  for (int r = 0; r < t.n && err.empty(); ++r) err = p.check(r);
  return err.empty() ? p.identical() : err;
}

// Captured once by every rank thread (thread-local capture of its own stream), then `reps`
// replays, each with new inputs and every output checked.
std::string runGraph(RankThreads& t, Problem& p, uint64_t seed, int reps) {
  std::vector<cudaGraph_t> graphs(t.n, nullptr);
  std::vector<cudaGraphExec_t> execs(t.n, nullptr);
  std::string err = t.run([&](int r) -> std::string {
    if (cudaStreamBeginCapture(t.streams[r], cudaStreamCaptureModeThreadLocal) != cudaSuccess)
      return "rank " + std::to_string(r) + ": begin capture failed";
    std::string e = callError(r, t.comms[r], p.call(r, t.comms[r], t.streams[r]));
    const cudaError_t ce = cudaStreamEndCapture(t.streams[r], &graphs[r]);
    if (e.empty() && ce != cudaSuccess)
      e = "rank " + std::to_string(r) + ": end capture: " + cudaGetErrorString(ce);
    if (e.empty() && cudaGraphInstantiate(&execs[r], graphs[r], 0) != cudaSuccess)
      e = "rank " + std::to_string(r) + ": instantiate failed";
    return e;
  });
  for (int rep = 0; rep < reps && err.empty(); ++rep) {
    err = p.fill(seed * 1000 + rep);
    if (err.empty())
      err = t.run([&](int r) -> std::string {
        if (cudaGraphLaunch(execs[r], t.streams[r]) != cudaSuccess)
          return "rank " + std::to_string(r) + ": graph launch failed";
        return waitRank(r, t.comms[r], t.streams[r]);
      });
    for (int r = 0; r < t.n && err.empty(); ++r) err = p.check(r);
    if (err.empty()) err = p.identical();
    if (!err.empty()) err = "replay " + std::to_string(rep) + ": " + err;
  }
  for (auto x : execs)
    if (x) cudaGraphExecDestroy(x);
  for (auto g : graphs)
    if (g) cudaGraphDestroy(g);
  return err;
}

class FusedMatrixThreadPerRank : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
  // A deadlock ends after 20 s on the device and in the rendezvous instead of 5 minutes.
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
};

TEST_P(FusedMatrixThreadPerRank, EveryCall) {
  const int n = GetParam();
  RankThreads t(n);
  ASSERT_TRUE(t.ok) << t.why;
  struct Shape {
    int rowsPerRank, N, K;
  };
  const Shape shapes[] = {{40, 136, 72}, {24, 130, 40}};
  const ncclDataType_t outs[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
  const uint64_t seed = mktest::testSeed() ^ (0x7e4ull * n);
  int idx = 0;
  for (int op = 0; op < 3; ++op) {
    for (int si = 0; si < 2; ++si) {
      for (int algo : {ncclFusedAuto, ncclFusedFused}) {
        const Shape& s = shapes[si];
        Case c{op, n, s.rowsPerRank * n, s.N, s.K, 0, ncclBfloat16, ncclBfloat16, false, algo};
        c.layout = s.N % 8 == 0 ? (op + algo) % 2 : ncclFusedLayoutNK;
        c.in = (op + si) % 2 ? ncclFloat16 : ncclBfloat16;
        c.out = outs[(op + si + algo + n) % 3];
        c.bias = (op + si + algo) % 2 == 1;
        c.noGathered = op == fusedtest::kAllGather && si == 1 && algo == ncclFusedFused;
        const bool deviceSync = idx % 2 == 1;
        Problem p(c);
        const std::string err = runEager(t, p, seed + idx++, deviceSync);
        ASSERT_EQ(err, "") << name(c) << (deviceSync ? " (device sync before the call)" : "");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FusedMatrix, FusedMatrixThreadPerRank, ::testing::Values(1, 2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

class FusedMatrixThreadPerRankGraph : public FusedMatrixThreadPerRank {};

TEST_P(FusedMatrixThreadPerRankGraph, ReplaysWithNewInputs) {
  const int n = GetParam();
  RankThreads t(n);
  ASSERT_TRUE(t.ok) << t.why;
  const uint64_t seed = mktest::testSeed() ^ (0x96aull * n);
  for (int op = 0; op < 3; ++op) {
    for (int algo : {ncclFusedAuto, ncclFusedFused}) {
      const ncclDataType_t out = op == 1 ? ncclFloat32 : ncclFloat16;
      Case c{op, n, 40 * n, 136, 72, op % 2, ncclBfloat16, out, op != 1, algo};
      Problem p(c);
      // One eager run first: every kernel of the call loaded (lazy loading may synchronise the
      // device, which would break the other threads' captures) and the fused path's clique
      // block set up outside capture.
      ASSERT_EQ(runEager(t, p, seed + op, false), "") << name(c) << " (eager)";
      ASSERT_EQ(runGraph(t, p, seed + 10 * op + algo, 50), "") << name(c);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FusedMatrix, FusedMatrixThreadPerRankGraph, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// Rank 1's thread never makes its next call (after a first call that both threads made and
// that was checked). Rank 0's call waits for it, in the host rendezvous or on the device,
// until MKERNEL_TIMEOUT_MS; then ncclCommGetAsyncError reports an error naming rank 1, the
// stream is idle, and ncclCommAbort of both ranks from the test thread (not the rank threads)
// returns within 5 s. Afterwards fresh ranks run a checked call (the GPU stays usable).
TEST(FusedMatrixThreadPerRankAbort, PeerThreadNeverCalls) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "1000");
  const uint64_t seed = mktest::testSeed() ^ 0xab2;
  const int variants[][2] = {
      {0, ncclFusedFused}, {0, ncclFusedAuto}, {1, ncclFusedFused}, {2, ncclFusedAuto}};
  for (auto& v : variants) {
    Case c{v[0], 2, 128, 128, 64, 0, ncclBfloat16, ncclBfloat16, false, v[1]};
    SCOPED_TRACE(name(c));
    RankThreads t(2);
    ASSERT_TRUE(t.ok) << t.why;
    Problem p(c);
    ASSERT_EQ(runEager(t, p, seed, false), "") << "the call both ranks make";
    ASSERT_EQ(p.fill(seed + 1), "");
    ncclResult_t res = ncclSuccess;
    double took = -1;
    const auto t0 = Clock::now();
    const std::string err = t.run([&](int r) -> std::string {
      if (r != 0) return "";
      const auto c0 = Clock::now();
      res = p.call(0, t.comms[0], t.streams[0]);
      took = since(c0);
      return "";
    });
    ASSERT_EQ(err, "");
    ncclResult_t async = ncclSuccess;
    ASSERT_EQ(gputest::pollAsyncError(t.comms[0], t0, 30, &async), ncclSuccess);
    const double after = since(t0);
    EXPECT_NE(async, ncclSuccess) << "no error " << after << " s after the call";
    EXPECT_LT(after, 12.0) << "MKERNEL_TIMEOUT_MS=1000 bounds the wait";
    const std::string msg = ncclGetLastError(t.comms[0]);
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
    printf(
        "[FusedMatrixThreadPerRankAbort] %s: call returned %s after %.2f s, error after %.2f s: "
        "%s\n",
        name(c).c_str(), ncclGetErrorString(res), took, after, msg.c_str());
    const bool idle = dctest::streamDone(t.streams[0], 5);
    EXPECT_TRUE(idle) << "rank 0's kernels must leave after the error";
    for (int r = 0; r < 2; ++r) {
      const auto a0 = Clock::now();
      EXPECT_EQ(ncclCommAbort(t.comms[r]), ncclSuccess);
      EXPECT_LT(since(a0), 5.0) << "ncclCommAbort of rank " << r;
      t.forget(r);
    }
    if (!idle) return;  // leave the buffers to a kernel that still runs rather than hang
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the CUDA context must stay usable";
  mktest::ScopedEnv longer("MKERNEL_TIMEOUT_MS", "20000");
  RankThreads t(2);
  ASSERT_TRUE(t.ok) << t.why;
  Case c{0, 2, 128, 128, 64, 1, ncclBfloat16, ncclFloat32, true, ncclFusedFused};
  Problem p(c);
  EXPECT_EQ(runEager(t, p, seed + 1, false), "") << "the GPU must stay usable";
}

}  // namespace
