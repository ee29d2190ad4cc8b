// The fused ring attention on comms spanning virtual nodes (MKERNEL_EMULATE_NODES, socket
// backend on loopback): the xnode layout (fused/ops/ring_attn/xnode.h, xnode_role.cuh), k/v
// slices moving through the device communication API (P2P stores inside a node, the proxy
// across nodes) while the attention CTAs already run on the units in place. Every test
// asserts that the xnode kernel ran (ringAttnFusedLaunches of the xnode layout, counted per
// launch or capture), not the sequential fallback, and checks EVERY element of out and lse of
// EVERY rank against the fp32/fp64 host reference of test_attn_ref.h (fresh normal inputs,
// outputs and the bytes after them poisoned with NaN).
//   RingAttnXnode.Cases/{2x1,2x2,3x1,uneven_2p1}  causal or not, zigzag or contiguous, GQA
//       1/4, head dims 64/128 (every pair of the four factors in all combinations), seqLocal
//       not a tile multiple, batch 1-2, bf16/fp16, lse NULL once; 256 KiB windows, so a slice is
//       several units (k and v of whole rows), the last one short, in a ring of few slots.
//   RingAttnXnode.BackToBackAndGraph/*  12 calls back to back on new inputs, a collective and a
//       fused AllGather + GEMM (the same xnode call counter and signal slots) in between;
//       then 5 graph replays of one captured call with new inputs.
//   RingAttnXnodeChoice.*               ncclFusedAuto stays sequential across nodes;
//       MKERNEL_FUSED_XNODE=0 keeps ncclFusedFused sequential (results checked).
//   RingAttnXnodeAbort.PeerNeverComes   2x1, rank 1 never calls: the error names rank 1 within
//       the deadline, ncclCommAbort returns within 5 s.
//   RingAttnXnodeProcs.TwoProcessesAsTwoNodes  2 processes as 2 nodes (this binary
//       re-spawned, RingAttnXnodeChild.Run): the cases, back to back and graph replays.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "fused/ops/gemm_coll/gemm_coll.h"  // gemmCollFusedLaunches
#include "fused/ops/ring_attn/ring_attn.h"  // ringAttnFusedLaunches
#include "gpu/test_attn_ref.h"
#include "gpu/test_devcomm_util.h"
#include "gpu/test_fused_util.cuh"
#include "gpu/test_proc_util.h"

namespace {

using attntest::Problem;
using attntest::Shape;
using attntest::Stats;
using Vnodes = dctest::FusedVnodes;

constexpr double kBudget = 1.2e9;  // host reference flops per case (attntest::shrink)
constexpr size_t kSmallWindow = 256 << 10;

uint64_t xnodeLaunches() {
  return mk::fused::ringAttnFusedLaunches(mk::fused::kRingLayoutXnode);
}

std::string callError(int r, ncclComm_t comm, ncclResult_t res) {
  if (res == ncclSuccess) return "";
  return "rank " + std::to_string(r) + ": ncclRingAttention returned " + ncclGetErrorString(res) +
         ": " + ncclGetLastError(comm);
}

// The ranks this thread drives (comms[r] != nullptr), each call issued in turn.
std::string issue(const Problem& p, const std::vector<ncclComm_t>& comms,
                  const std::vector<cudaStream_t>& streams) {
  for (size_t r = 0; r < comms.size(); ++r) {
    if (!comms[r]) continue;
    const std::string e = callError((int)r, comms[r], p.call((int)r, comms[r], streams[r]));
    if (!e.empty()) return e;
  }
  return "";
}

std::string waitAndCheck(Problem& p, const std::vector<ncclComm_t>& comms,
                         const std::vector<cudaStream_t>& streams, Stats* st) {
  std::vector<ncclComm_t> cs;
  std::vector<cudaStream_t> ss;
  for (size_t r = 0; r < comms.size(); ++r)
    if (comms[r]) {
      cs.push_back(comms[r]);
      ss.push_back(streams[r]);
    }
  std::string e = fusedtest::waitRanks(cs, ss, 120);
  for (size_t r = 0; r < comms.size() && e.empty(); ++r)
    if (comms[r]) e = p.check((int)r, st);
  return e;
}

// `reps` checked calls on fresh inputs (between them `between`, if any), or with `graph` one
// eager call, one capture per rank stream and `reps` checked replays on fresh inputs written
// into the same buffers. Then the proof that the xnode kernel ran: once per driven rank per
// call (eager), or once per rank for the eager call plus once for the capture.
std::string runXnode(Problem& p, const std::vector<ncclComm_t>& comms,
                     const std::vector<cudaStream_t>& streams, uint64_t seed, bool graph = false,
                     int reps = 1, const std::function<std::string(int)>& between = nullptr) {
  int driven = 0;
  for (auto c : comms) driven += c != nullptr;
  const uint64_t before = xnodeLaunches();
  Stats st;
  std::string e;
  const int eager = graph ? 1 : reps;
  for (int i = 0; i < eager && e.empty(); ++i) {
    e = p.draw(seed + 7919ull * i);
    if (e.empty()) e = issue(p, comms, streams);
    if (e.empty()) e = waitAndCheck(p, comms, streams, &st);
    if (!e.empty()) e = "call " + std::to_string(i) + ": " + e;
    if (e.empty() && between) e = between(i);
  }
  if (e.empty() && graph) {
    const int n = (int)comms.size();
    std::vector<cudaGraph_t> graphs(n, nullptr);
    std::vector<cudaGraphExec_t> execs(n, nullptr);
    for (int r = 0; r < n && e.empty(); ++r)
      if (comms[r] &&
          cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        e = "begin capture failed";
    if (e.empty()) e = issue(p, comms, streams);
    for (int r = 0; r < n; ++r)  // every capture ends, also after a failure
      if (comms[r] && cudaStreamEndCapture(streams[r], &graphs[r]) != cudaSuccess && e.empty())
        e = "end capture failed";
    for (int r = 0; r < n && e.empty(); ++r)
      if (comms[r] && cudaGraphInstantiate(&execs[r], graphs[r], 0) != cudaSuccess)
        e = "instantiate failed";
    for (int rep = 0; rep < reps && e.empty(); ++rep) {
      e = p.draw(seed + 104729ull * (rep + 1));
      for (int r = 0; r < n && e.empty(); ++r)
        if (comms[r] && cudaGraphLaunch(execs[r], streams[r]) != cudaSuccess)
          e = "graph launch failed";
      if (e.empty()) e = waitAndCheck(p, comms, streams, &st);
      if (!e.empty()) e = "replay " + std::to_string(rep) + ": " + e;
    }
    for (auto x : execs)
      if (x) cudaGraphExecDestroy(x);
    for (auto g : graphs)
      if (g) cudaGraphDestroy(g);
  }
  const uint64_t ran = xnodeLaunches() - before;
  const uint64_t want = (uint64_t)driven * (graph ? 2 : reps);
  if (e.empty() && ran != want)
    e = "the xnode fused kernel ran " + std::to_string(ran) + " times, expected " +
        std::to_string(want) + " (sequential fallback?)";
  if (e.empty())
    printf("[RingAttnXnode] %s: %s\n", attntest::name(p.c()).c_str(), st.str().c_str());
  return e;
}

// 8 cases on n ranks: head dim 128 <=> causal ^ zigzag ^ GQA 4, so every pair of the four
// factors appears in all its combinations; even seqLocal (zigzag) that are not tile multiples.
std::vector<Shape> xnodeCases(int n) {
  const int seqs[] = {66, 150, 94, 200, 34, 176, 130, 2};
  std::vector<Shape> v;
  for (int i = 0; i < 8; ++i) {
    Shape c;
    c.n = n;
    c.causal = i & 1;
    c.layout = i & 2 ? ncclRingAttnZigzag : ncclRingAttnContiguous;
    c.Hkv = 2;
    c.Hq = (i & 4 ? 4 : 1) * c.Hkv;
    c.D = ((i ^ (i >> 1) ^ (i >> 2)) & 1) ? 128 : 64;
    c.S = seqs[(i + n) % 8];
    c.B = 1 + (i + n) % 2;
    c.in = (i + n) % 3 == 1 ? ncclFloat16 : ncclBfloat16;
    c.lse = (i + n) % 7 != 3;
    c.algo = ncclFusedFused;
    attntest::shrink(&c, kBudget);
    v.push_back(c);
  }
  return v;
}

struct Layout {
  int nodes, n;
  const char* name;
};

class RingAttnXnode : public ::testing::TestWithParam<Layout> {};

TEST_P(RingAttnXnode, Cases) {
  MKTEST_REQUIRE_GPU();
  const Layout& l = GetParam();
  Vnodes v(l.nodes, l.n, kSmallWindow);
  ASSERT_TRUE(v.ok()) << v.why;
  const uint64_t seed = mktest::testSeed() ^ (0x4a11ull * l.n + l.nodes);
  SCOPED_TRACE("seed " + std::to_string(seed) +
               " (MKTEST_SEED=" + std::to_string(mktest::testSeed()) + " repeats it)");
  int idx = 0;
  for (const Shape& c : xnodeCases(l.n)) {
    Problem p(c);
    const std::string err = runXnode(p, v.comms, v.streams, seed + 31 * idx++);
    if (!err.empty()) v.abortAll();  // before p's buffers go: kernels may wait
    ASSERT_EQ(err, "") << l.name << " " << attntest::name(c);
  }
}

// 12 calls back to back with new inputs (call numbers, slots and signal values reused across
// calls); after every 3rd an AllReduce (the hierarchical path uses the same window between
// fused calls) and after every 4th a fused AllGather + GEMM (the same xnode call counter and
// signal slots: its values must keep growing across the two operators). Then 5 graph replays.
TEST_P(RingAttnXnode, BackToBackAndGraph) {
  MKTEST_REQUIRE_GPU();
  const Layout& l = GetParam();
  Vnodes v(l.nodes, l.n);
  ASSERT_TRUE(v.ok()) << v.why;
  const uint64_t seed = mktest::testSeed() ^ (0xb2b7ull * l.n + l.nodes);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Shape c;
  c.n = l.n;
  c.S = 222;
  c.B = 2;
  c.D = 128;
  c.Hkv = 2;
  c.Hq = 8;
  c.causal = true;
  c.layout = ncclRingAttnZigzag;
  c.algo = ncclFusedFused;
  attntest::shrink(&c, kBudget);
  const uint64_t gemmBefore = mk::fused::gemmCollFusedLaunches(mk::fused::kGcLayoutXnode);
  // The AllReduce between ring calls (it shares the window areas and signal words with the
  // xnode kernels): per-rank inputs of small random integers (exact fp32 sums), outputs
  // poisoned, every element checked.
  constexpr size_t kRedCount = 1024;
  std::vector<std::unique_ptr<colltest::DevBuf>> redIn, redOut;
  for (int r = 0; r < l.n; ++r) {
    redIn.emplace_back(new colltest::DevBuf(kRedCount * sizeof(float)));
    redOut.emplace_back(new colltest::DevBuf(kRedCount * sizeof(float)));
  }
  auto checkedAllReduce = [&](int i) -> std::string {
    std::mt19937_64 rng(seed + 31 * i);
    std::vector<std::vector<float>> in(l.n, std::vector<float>(kRedCount));
    std::vector<float> want(kRedCount, 0.f);
    for (int r = 0; r < l.n; ++r)
      for (size_t e = 0; e < kRedCount; ++e) {
        in[r][e] = (float)((int)(rng() % 2001) - 1000);
        want[e] += in[r][e];
      }
    for (int r = 0; r < l.n; ++r) {
      // Waited for: the AllReduce runs on non-blocking streams (mktest::syncMemcpy).
      if (mktest::syncMemcpy(redIn[r]->base, in[r].data(), kRedCount * sizeof(float),
                             cudaMemcpyHostToDevice) != cudaSuccess ||
          mktest::syncMemset(redOut[r]->base, 0xff, kRedCount * sizeof(float)) != cudaSuccess)
        return "AllReduce: buffer set-up failed";
    }
    ncclGroupStart();
    for (int r = 0; r < l.n; ++r)
      ncclAllReduce(redIn[r]->base, redOut[r]->base, kRedCount, ncclFloat32, ncclSum, v.comms[r],
                    v.streams[r]);
    if (ncclGroupEnd() != ncclSuccess)
      return std::string("AllReduce: ") + ncclGetLastError(nullptr);
    const std::string e = fusedtest::waitRanks(v.comms, v.streams, 60);
    if (!e.empty()) return "AllReduce: " + e;
    std::vector<float> got(kRedCount);
    for (int r = 0; r < l.n; ++r) {
      if (cudaMemcpy(got.data(), redOut[r]->base, kRedCount * sizeof(float),
                     cudaMemcpyDeviceToHost) != cudaSuccess)
        return "AllReduce: copy back failed";
      for (size_t e = 0; e < kRedCount; ++e)
        if (got[e] != want[e])
          return "AllReduce between ring calls: rank " + std::to_string(r) + " element " +
                 std::to_string(e) + " is " + std::to_string(got[e]) + ", want " +
                 std::to_string(want[e]);
    }
    return "";
  };
  uint64_t rsLaunches = 0;
  auto between = [&](int i) -> std::string {
    if (i % 3 == 2) {
      const std::string e = checkedAllReduce(i);
      if (!e.empty()) return e;
    }
    if (i % 5 == 4) {
      // GEMM + ReduceScatter across nodes: its own xnode kernel, the same call counter.
      fusedtest::Case g{fusedtest::kReduceScatter,
                        l.n,
                        64 * l.n,
                        256,
                        128,
                        1,
                        ncclBfloat16,
                        ncclBfloat16,
                        false,
                        ncclFusedFused};
      fusedtest::Problem gp(g);
      const uint64_t before = mk::fused::gemmCollFusedLaunches(mk::fused::kGcLayoutXnode);
      const std::string e = fusedtest::runDriven(gp, v.comms, v.streams, seed + 1013 * i);
      if (!e.empty()) return "GEMM + ReduceScatter between: " + e;
      const uint64_t ran = mk::fused::gemmCollFusedLaunches(mk::fused::kGcLayoutXnode) - before;
      // Counted out of the AllGather + GEMM total below.
      rsLaunches += ran;
      if (ran != (uint64_t)l.n)
        return "GEMM + ReduceScatter between: " + std::to_string(ran) + " xnode launches, want " +
               std::to_string(l.n);
    }
    if (i % 4 == 3) {
      fusedtest::Case g{fusedtest::kAllGather, l.n,          64 * l.n, 256,           128, 1,
                        ncclBfloat16,          ncclBfloat16, false,    ncclFusedFused};
      fusedtest::Problem gp(g);
      const std::string e = fusedtest::runDriven(gp, v.comms, v.streams, seed + 977 * i);
      if (!e.empty()) return "AllGather + GEMM between: " + e;
    }
    return "";
  };
  {
    Problem p(c);
    const std::string err = runXnode(p, v.comms, v.streams, seed, false, 12, between);
    if (!err.empty()) v.abortAll();
    ASSERT_EQ(err, "") << l.name << " back to back " << attntest::name(c);
  }
  EXPECT_EQ(mk::fused::gemmCollFusedLaunches(mk::fused::kGcLayoutXnode) - gemmBefore - rsLaunches,
            (uint64_t)(3 * l.n))
      << "the AllGather + GEMM calls in between did not all run their xnode kernel";
  c.causal = false;
  c.layout = ncclRingAttnContiguous;
  c.D = 64;
  c.in = ncclFloat16;
  Problem p(c);
  const std::string err = runXnode(p, v.comms, v.streams, seed + 1, true, 5);
  if (!err.empty()) v.abortAll();
  ASSERT_EQ(err, "") << l.name << " graph " << attntest::name(c);
}

INSTANTIATE_TEST_SUITE_P(RingAttnXnode, RingAttnXnode,
                         ::testing::Values(Layout{2, 2, "2x1"}, Layout{2, 4, "2x2"},
                                           Layout{3, 3, "3x1"}, Layout{2, 3, "uneven_2p1"}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return std::string(i.param.name);
                         });

// ---- which path runs ------------------------------------------------------------------------
std::string runExpect(Vnodes& v, const Shape& c, uint64_t seed, bool fused) {
  Problem p(c);
  const uint64_t before = xnodeLaunches();
  std::string e = p.draw(seed);
  if (e.empty()) e = issue(p, v.comms, v.streams);
  Stats st;
  if (e.empty()) e = waitAndCheck(p, v.comms, v.streams, &st);
  const uint64_t ran = xnodeLaunches() - before;
  if (e.empty() && ran != (fused ? (uint64_t)v.n : 0))
    e = "xnode launches " + std::to_string(ran) + ", expected " + (fused ? "one per rank" : "0");
  return e;
}

Shape choiceShape(int algo) {
  Shape c;
  c.n = 4;
  c.S = 94;
  c.D = 64;
  c.Hkv = 2;
  c.Hq = 8;
  c.causal = true;
  c.algo = algo;
  return c;
}

TEST(RingAttnXnodeChoice, AutoSequentialFusedFused) {
  MKTEST_REQUIRE_GPU();
  Vnodes v(2, 4);
  ASSERT_TRUE(v.ok()) << v.why;
  const uint64_t seed = mktest::testSeed() ^ 0xc401;
  std::string e = runExpect(v, choiceShape(ncclFusedAuto), seed, false);
  if (e.empty()) e = runExpect(v, choiceShape(ncclFusedSequential), seed + 1, false);
  if (e.empty()) e = runExpect(v, choiceShape(ncclFusedFused), seed + 2, true);
  if (!e.empty()) v.abortAll();
  EXPECT_EQ(e, "");
}

// MKERNEL_FUSED_XNODE is agreed at init: set before the comms are made.
TEST(RingAttnXnodeChoice, SwitchOffRunsSequential) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv off("MKERNEL_FUSED_XNODE", "0");
  Vnodes v(2, 4);
  ASSERT_TRUE(v.ok()) << v.why;
  const std::string e =
      runExpect(v, choiceShape(ncclFusedFused), mktest::testSeed() ^ 0xc402, false);
  if (!e.empty()) v.abortAll();
  EXPECT_EQ(e, "");
}

// ---- a peer that never comes ----------------------------------------------------------------
// 2x1: rank 1 never calls. Rank 0's kernel must fail within MKERNEL_TIMEOUT_MS (+ slack) with
// an error naming rank 1, and ncclCommAbort must return within 5 s on both ranks.
TEST(RingAttnXnodeAbort, PeerNeverComesNamedAndAbortIsQuick) {
  MKTEST_REQUIRE_GPU();
  constexpr int kTimeoutMs = 3000;
  Vnodes v(2, 2, 1 << 20, kTimeoutMs);
  ASSERT_TRUE(v.ok()) << v.why;
  Shape c = choiceShape(ncclFusedFused);
  c.n = 2;
  c.S = 256;
  c.D = 128;
  Problem p(c);
  ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xab1), "");
  const uint64_t before = xnodeLaunches();
  ASSERT_EQ(p.call(0, v.comms[0], v.streams[0]), ncclSuccess) << ncclGetLastError(v.comms[0]);
  ASSERT_EQ(xnodeLaunches(), before + 1) << "the call did not launch the xnode kernel";
  const auto t0 = std::chrono::steady_clock::now();
  ncclResult_t async = ncclSuccess;
  while (async == ncclSuccess || async == ncclInProgress) {
    ASSERT_EQ(ncclCommGetAsyncError(v.comms[0], &async), ncclSuccess);
    if (gputest::since(t0) > kTimeoutMs / 1000.0 + 15) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string msg = ncclGetLastError(v.comms[0]);
  const double detectS = gputest::since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  v.abortAll();
  const double abortS = gputest::since(t1);
  printf("[RingAttnXnodeAbort] error after %.2f s: %s; abort %.2f s\n", detectS, msg.c_str(),
         abortS);
  EXPECT_NE(async, ncclSuccess) << "no error within " << detectS << " s";
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_LT(abortS, 5.0);
  EXPECT_TRUE(gputest::streamCompleted(v.streams[0], 10)) << "the kernel must leave";
}

// ---- 2 processes as 2 nodes ------------------------------------------------------------------
// Child: "xnode 2 rank seed" in MKTEST_RX_CHILD, the unique id in MKTEST_RX_ID. Every case of
// xnodeCases, 6 calls back to back, 3 graph replays; the failure printed.
int xnodeChild(const char* spec) {
  fusedtest::ChildRank x;
  if (!fusedtest::childRankInit(spec, "MKTEST_RX_ID", "[RingAttnXnode]", &x)) return 1;
  const int n = x.n, me = x.me;
  const uint64_t seed = x.seed;
  std::string err;
  int idx = 0;
  for (const Shape& c : xnodeCases(n)) {
    Problem p(c, me);
    err = runXnode(p, x.comms, x.streams, seed + 31 * idx++);
    if (!err.empty()) {
      err = attntest::name(c) + ": " + err;
      break;
    }
  }
  if (err.empty()) {
    Shape c = xnodeCases(n)[5];
    Problem p(c, me);
    err = runXnode(p, x.comms, x.streams, seed + 500, false, 6);
    if (err.empty()) {
      Problem g(c, me);
      err = runXnode(g, x.comms, x.streams, seed + 501, true, 3);
    }
    if (!err.empty()) err = "back to back / graph " + attntest::name(c) + ": " + err;
  }
  return fusedtest::childRankFinish(x, err, "[RingAttnXnode]");
}

TEST(RingAttnXnodeChild, Run) {
  const char* spec = getenv("MKTEST_RX_CHILD");
  if (!spec) GTEST_SKIP() << "helper of RingAttnXnodeProcs (runs only in its children)";
  EXPECT_EQ(xnodeChild(spec), 0) << "the failure is printed above";
}

TEST(RingAttnXnodeProcs, TwoProcessesAsTwoNodes) {
  MKTEST_REQUIRE_GPU();
  dctest::TestEnv env(2, kSmallWindow, 0, 20000);  // children inherit it
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    char spec[160];
    snprintf(spec, sizeof(spec), "MKTEST_RX_CHILD=xnode 2 %d %llu", r,
             (unsigned long long)mktest::testSeed());
    pids.push_back(mktest::spawnSelf("RingAttnXnodeChild.Run",
                                     {spec, "MKTEST_RX_ID=" + gputest::idToHex(id)}));
    ASSERT_GT(pids.back(), 0) << "spawn failed";
  }
  EXPECT_EQ(mktest::waitChildren(pids, 300), "");
}

}  // namespace
