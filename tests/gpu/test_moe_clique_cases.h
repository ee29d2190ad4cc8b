// Clique-layout test bodies shared by the suites of ncclMoeDispatchGemm's dispatch kernel
// (test_moe_dispatch.cu) and of its fused dispatch + GEMM kernel (test_moe_fused.cu), and of
// the whole layer's sequential and fused paths (test_moe_ffn.cu, test_moe_ffn_fused.cu): graph
// capture and replay with new routing, a receiver's bound exceeded, a call expected to fail on
// one rank, and ncclCommAbort while a peer never comes. The suites differ only in MoeProblem::algo
// and in the fused-launch counts they check around these bodies.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include "gpu/test_fused_util.cuh"
#include "gpu/test_moe_util.h"
#include "gpu/test_proc_util.h"
#include "gpu/test_thread_team.h"

namespace moetest {

// Every rank thread captures one call into a graph of its own (execs[r]). P: MoeProblem or
// FfnProblem (anything with call(rank, comm, stream)).
template <class P>
std::string captureEachRank(gputest::Team& t, P& p, std::vector<cudaGraphExec_t>* execs) {
  execs->assign(t.n, nullptr);
  return t.run([&](int r) -> std::string {
    cudaGraph_t g = nullptr;
    MOE_CUDA(cudaStreamBeginCapture(t.streams[r], cudaStreamCaptureModeThreadLocal));
    const ncclResult_t res = p.call(r, t.comms[r], t.streams[r]);
    const cudaError_t ce = cudaStreamEndCapture(t.streams[r], &g);
    if (res != ncclSuccess) return "capture: " + std::string(ncclGetLastError(t.comms[r]));
    MOE_CUDA(ce);
    MOE_CUDA(cudaGraphInstantiate(&(*execs)[r], g, 0));
    cudaGraphDestroy(g);
    return "";
  });
}

// Three replays, each after new routing drawn into the same input buffers (the same token
// counts; rows: the receive bound), every rank's outputs checked after each. Destroys the
// graphs.
inline std::string replayWithNewRouting(gputest::Team& t, MoeProblem& p, std::mt19937_64& rng,
                                        size_t rows, std::vector<cudaGraphExec_t>* execs) {
  std::string err;
  for (int rep = 0; rep < 3 && err.empty(); ++rep) {
    err = p.draw(rng(), false, 0, -1, rows);
    if (!err.empty()) break;
    err = t.run([&](int r) -> std::string {
      MOE_CUDA(cudaGraphLaunch((*execs)[r], t.streams[r]));
      return fusedtest::waitRank(r, t.comms[r], t.streams[r]);
    });
    for (int r = 0; r < t.n && err.empty(); ++r) err = p.check(r);
    if (!err.empty()) err = "replay " + std::to_string(rep) + ": " + err;
  }
  for (auto x : *execs)
    if (x) cudaGraphExecDestroy(x);
  execs->clear();
  return err;
}

// Three ranks, p drawn with rank 1's bound one row short: rank 1 receives nothing (counts 0)
// and its comm reports the overflow naming the operation; ranks 0 and 2 complete and check out.
inline void expectOverflowReported(gputest::Team& t, MoeProblem& p) {
  ASSERT_EQ(t.n, 3);
  std::vector<std::string> errs(t.n);
  std::string err = t.run([&](int r) -> std::string {
    const ncclResult_t res = p.call(r, t.comms[r], t.streams[r]);
    if (res != ncclSuccess) return "call failed: " + std::string(ncclGetErrorString(res));
    errs[r] = fusedtest::waitRank(r, t.comms[r], t.streams[r]);
    return "";
  });
  ASSERT_EQ(err, "");
  EXPECT_EQ(errs[0], "");
  EXPECT_EQ(errs[2], "");
  EXPECT_NE(errs[1].find("MoeDispatchGemm"), std::string::npos) << errs[1];
  EXPECT_NE(errs[1].find("rows"), std::string::npos) << errs[1];
  ncclResult_t a = ncclSuccess;
  ncclCommGetAsyncError(t.comms[1], &a);
  EXPECT_EQ(a, ncclInvalidUsage);
  int32_t cnt[2] = {-7, -7};
  ASSERT_EQ(cudaMemcpy(cnt, p.rank(1).dcnt, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cnt[0], 0);
  EXPECT_EQ(cnt[1], 0);
  EXPECT_EQ(p.check(0), "");
  EXPECT_EQ(p.check(2), "");
}

// On a fresh pair of comms, rank 0 calls (p, a 2-rank problem) and rank 1 never does: rank 0's
// kernel (`what`) waits on the device until ncclCommAbort from another thread ends it, within
// 5 s (MKERNEL_TIMEOUT_MS is set far longer by the caller), and the CUDA context stays usable.
// afterCall runs once rank 0's call is enqueued (the fused suite counts its launches there).
// P: MoeProblem or FfnProblem.
template <class P>
void expectAbortEndsLonelyCall(P& p, const char* what, const std::function<void()>& afterCall) {
  ncclComm_t comms[2] = {nullptr, nullptr};
  int devs[2] = {0, 0};
  ASSERT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess) << ncclGetLastError(nullptr);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(p.call(0, comms[0], s), ncclSuccess) << ncclGetLastError(comms[0]);
  afterCall();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "the " << what << " should wait for rank 1";
  double took = -1;
  ncclResult_t res = ncclInternalError;
  std::thread aborter([&] {
    const auto t0 = gputest::Clock::now();
    res = ncclCommAbort(comms[0]);
    took = gputest::since(t0);
  });
  aborter.join();
  EXPECT_EQ(res, ncclSuccess);
  EXPECT_LT(took, 5.0) << "ncclCommAbort must return promptly";
  EXPECT_TRUE(gputest::streamCompleted(s, 5)) << "the " << what << " must leave after the abort";
  EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the CUDA context must stay usable";
}

// One case of the layer: drawn (rows beyond the need: up to 200 a rank; `emptyRank`, if >= 0,
// without tokens), run, drawn again into the same buffers (new routing and inputs) and run
// again, back to back on the same comm. `run` returns "" or what went wrong.
inline std::string drawRunTwice(FfnProblem& p, std::mt19937_64& rng, int emptyRank,
                                const std::function<std::string()>& run) {
  DrawOpts o;
  o.slack = (int)(rng() % 200);
  o.emptyRank = emptyRank;
  std::string e = p.draw(rng(), o);
  if (e.empty()) e = run();
  if (!e.empty()) return e;
  DrawOpts again;
  again.reshape = false;
  e = p.draw(rng(), again);
  if (e.empty()) e = run();
  return e.empty() ? "" : e + " (second call)";
}

// Five replays of captured layer calls (execs[r]: rank r's graph), each after new routing,
// tokens and weights drawn into the same buffers (bound `rows`; the routing kind cycles
// through the first `routings` kinds), every rank's y checked after each. Destroys the graphs.
inline std::string replayFfnWithNewRouting(gputest::Team& t, FfnProblem& p, std::mt19937_64& rng,
                                           size_t rows, int routings,
                                           std::vector<cudaGraphExec_t>* execs) {
  std::string err;
  for (int rep = 0; rep < 5 && err.empty(); ++rep) {
    p.c().routing = (Routing)(rep % routings);
    DrawOpts again;
    again.reshape = false;
    again.fixedRows = rows;
    err = p.draw(rng(), again);
    if (err.empty())
      err = t.run([&](int r) -> std::string {
        MOE_CUDA(cudaGraphLaunch((*execs)[r], t.streams[r]));
        return fusedtest::waitRank(r, t.comms[r], t.streams[r]);
      });
    if (err.empty()) err = t.run([&](int r) { return p.check(r); });
    if (!err.empty()) err = "replay " + std::to_string(rep) + ": " + err;
  }
  for (auto x : *execs)
    if (x) cudaGraphExecDestroy(x);
  execs->clear();
  return err;
}

// Bounded wait for a stream whose comm may have failed (its kernels end within the timeout).
inline std::string drain(cudaStream_t s, double timeoutS = 60) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return "";
    if (e != cudaErrorNotReady) return std::string("cudaStreamQuery: ") + cudaGetErrorString(e);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeoutS)
      return "stream still busy after " + std::to_string((int)timeoutS) + " s";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Every rank calls once; the rank `failing` is expected to report an async error, the others
// to complete. The failing rank's call may itself return the error (its comm failed while the
// call was still enqueueing); its peers must not notice anything.
struct Outcome {
  std::vector<ncclResult_t> res;
  std::vector<std::string> errs;
};
inline std::string runExpectingFailure(gputest::Team& t, FfnProblem& p, int failing, Outcome* o) {
  o->res.assign(t.n, ncclSuccess);
  o->errs.assign(t.n, "");
  const std::string err = t.run([&](int r) -> std::string {
    o->res[r] = p.call(r, t.comms[r], t.streams[r]);
    if (o->res[r] != ncclSuccess && r != failing)
      return "rank " + std::to_string(r) + ": " + ncclGetErrorString(o->res[r]) + ": " +
             ncclGetLastError(t.comms[r]);
    o->errs[r] = fusedtest::waitRank(r, t.comms[r], t.streams[r]);
    return drain(t.streams[r]);  // before its buffers are read
  });
  if (!err.empty()) return err;
  for (int r = 0; r < t.n; ++r)
    if (r != failing && !o->errs[r].empty()) return "peer " + o->errs[r];
  if (o->res[failing] != ncclSuccess && o->res[failing] != ncclInvalidUsage)
    return "failing rank's call returned " + std::string(ncclGetErrorString(o->res[failing]));
  ncclResult_t a = ncclSuccess;
  if (ncclCommGetAsyncError(t.comms[failing], &a) != ncclSuccess || a != ncclInvalidUsage)
    return "failing rank's async error is " + std::string(ncclGetErrorString(a)) +
           ", expected ncclInvalidUsage";
  return "";
}

// p drawn with rank `tight`'s bound one row short of its need: every rank calls once; the
// tight rank's comm reports the overflow naming the layer and the rows, its peers complete,
// their slots routed to its experts contribute zeros and every other slot is correct (the
// tight rank's y may stay untouched).
inline void expectFfnOverflowReported(gputest::Team& t, FfnProblem& p, int tight) {
  ASSERT_GT(p.need(tight), 0u);
  Outcome out;
  ASSERT_EQ(runExpectingFailure(t, p, tight, &out), "");
  const std::string& msg = out.errs[tight];
  EXPECT_NE(msg.find("MoeDispatchFfnCombine"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(p.need(tight)) + " rows"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bound of " + std::to_string(p.need(tight) - 1) + " rows"), std::string::npos)
      << msg;
  for (int r = 0; r < t.n; ++r) EXPECT_EQ(p.check(r, tight, r == tight), "") << "rank " << r;
}

// p drawn with one topkIdx entry of rank `bad` set to E + 5: every rank calls once; the bad
// rank's comm reports the slot and the id, the slot counts as unused everywhere and every
// other slot of every rank is correct. badYComplete: the bad rank's y must be complete too
// (else it may stay untouched: its comm failed before its combine).
inline void expectFfnBadIdReported(gputest::Team& t, FfnProblem& p, int bad, bool badYComplete) {
  Outcome out;
  ASSERT_EQ(runExpectingFailure(t, p, bad, &out), "");
  const std::string& msg = out.errs[bad];
  EXPECT_NE(msg.find("topkIdx slot " + std::to_string(p.badSlot()) + " holds expert id " +
                     std::to_string(p.experts() + 5)),
            std::string::npos)
      << msg;
  for (int r = 0; r < t.n; ++r)
    EXPECT_EQ(p.check(r, -1, r == bad && !badYComplete), "") << "rank " << r;
}

}  // namespace moetest
