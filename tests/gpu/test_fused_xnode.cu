// The fused AllGather + GEMM, GEMM + ReduceScatter and GEMM + AllReduce on comms spanning
// virtual nodes (MKERNEL_EMULATE_NODES, socket backend on loopback): the xnode layout
// (fused/ops/gemm_coll/xnode.h, xnode_role.cuh, xnode_rs_role.cuh), data moving through the
// device communication API (P2P stores inside a node, the proxy across nodes). GEMM +
// AllReduce results are also compared byte for byte across ranks (runDriven: identical()). Every
// test asserts that the fused kernel ran (gemmCollFusedLaunches of the xnode layout, counted per
// launch or capture), not the sequential fallback, and checks every element against the fp64
// reference of test_fused_util.cuh, the gathered A byte for byte, and the poisoned bytes after
// every output.
//   - threads: ranks sharing GPU 0, one thread driving them (2x1, 2x2, 3x1, 2+1);
//   - processes: 2 processes as 2 nodes (this binary re-spawned, FusedXnodeChild.Run).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "fused/ops/gemm_coll/gemm_coll.h"  // gemmCollFusedLaunches
#include "fused/ops/gemm_coll/xnode.h"      // kGxAutoMinN
#include "gpu/test_devcomm_util.h"
#include "gpu/test_fused_util.cuh"
#include "gpu/test_proc_util.h"

namespace {

using fusedtest::Case;
using fusedtest::Problem;

uint64_t xnodeLaunches() {
  return mk::fused::gemmCollFusedLaunches(mk::fused::kGcLayoutXnode);
}

using Vnodes = dctest::FusedVnodes;

// runDriven, then the proof that the xnode kernel ran: once per driven rank and run (eager),
// or once per rank for the eager run plus once per rank for the capture (graph).
std::string runFused(Problem& p, const std::vector<ncclComm_t>& comms,
                     const std::vector<cudaStream_t>& streams, uint64_t seed, bool graph = false,
                     int reps = 1) {
  int driven = 0;
  for (auto c : comms) driven += c != nullptr;
  const uint64_t before = xnodeLaunches();
  std::string e = fusedtest::runDriven(p, comms, streams, seed, graph, reps);
  const uint64_t ran = xnodeLaunches() - before;
  const uint64_t want = (uint64_t)driven * (graph ? 2 : reps);
  if (e.empty() && ran != want)
    e = "the xnode fused kernel ran " + std::to_string(ran) + " times, expected " +
        std::to_string(want) + " (sequential fallback?)";
  return e;
}

// The cases of one layout: tails in M (rows per rank 37, 131), N (136, 130) and K (72, 40),
// both B layouts, bf16/f16 in, every output type, bias, Agathered given, NULL and in place.
// With 1 MiB windows and K = 1024, 384 rows per rank are 3 chunks of 128 rows in a ring of 2
// slots (slot reuse inside a call) and 131 rows are 131 chunks of one row in 64 slots.
std::vector<Case> xnodeAgCases(int n) {
  struct Shape {
    int rowsPerRank, N, K, layout;
  };
  const Shape shapes[] = {{64, 256, 128, 1},
                          {37, 136, 72, 0},
                          {24, 130, 40, 0},
                          {384, 264, 1024, 1},
                          {131, 520, 1024, 0}};
  const ncclDataType_t outs[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
  std::vector<Case> v;
  int i = 0;
  for (const Shape& s : shapes) {
    for (int g = 0; g < 3; ++g, ++i) {
      Case c{fusedtest::kAllGather, n,           s.rowsPerRank * n, s.N,           s.K, s.layout,
             ncclBfloat16,          outs[i % 3], i % 2 == 0,        ncclFusedFused};
      c.in = i % 2 ? ncclFloat16 : ncclBfloat16;
      c.inplace = g == 1;
      c.noGathered = g == 2;
      v.push_back(c);
    }
  }
  return v;
}

// GEMM + ReduceScatter (and, with op kAllReduce, GEMM + AllReduce): tails in M (rows per rank 37,
// 24, 300: shards straddling tile rows), N (136, 264, 520, 1032: N * outBytes a multiple of 16, the
// fused rule) and K (72, 40), both B layouts, bf16/f16 in, every output type, bias. With 1 MiB
// windows, fp32 tiles (128 KiB) are one-tile chunks in rings of 2-4 slots (slot reuse inside a
// call); 520 and 1032 columns are 3 and 5 tiles per tile row.
std::vector<Case> xnodeRsCases(int n, int op = fusedtest::kReduceScatter) {
  struct Shape {
    int rowsPerRank, N, K, layout;
  };
  const Shape shapes[] = {{64, 256, 128, 1},
                          {37, 136, 72, 0},
                          {24, 264, 40, 0},
                          {300, 520, 1024, 1},
                          {131, 1032, 256, 0}};
  const ncclDataType_t outs[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
  std::vector<Case> v;
  int i = 0;
  for (const Shape& s : shapes) {
    for (int g = 0; g < 3; ++g, ++i) {
      Case c{op,           n,           s.rowsPerRank * n, s.N,           s.K, s.layout,
             ncclBfloat16, outs[i % 3], i % 2 == 0,        ncclFusedFused};
      c.in = i % 2 ? ncclFloat16 : ncclBfloat16;
      v.push_back(c);
    }
  }
  return v;
}

std::vector<Case> xnodeCases(int n) {
  std::vector<Case> v = xnodeAgCases(n), rs = xnodeRsCases(n),
                    ar = xnodeRsCases(n, fusedtest::kAllReduce);
  v.insert(v.end(), rs.begin(), rs.end());
  v.insert(v.end(), ar.begin(), ar.end());
  return v;
}

struct Layout {
  int nodes, n;
  const char* name;
};

class FusedXnode : public ::testing::TestWithParam<Layout> {};

TEST_P(FusedXnode, EveryCase) {
  MKTEST_REQUIRE_GPU();
  const Layout& l = GetParam();
  Vnodes v(l.nodes, l.n);
  ASSERT_TRUE(v.ok()) << v.why;
  const uint64_t seed = mktest::testSeed() ^ (0x8e0deull * l.n + l.nodes);
  int idx = 0;
  for (const Case& c : xnodeCases(l.n)) {
    Problem p(c);
    const std::string err = runFused(p, v.comms, v.streams, seed + idx++);
    if (!err.empty()) v.abortAll();
    ASSERT_EQ(err, "") << l.name << " " << name(c);
  }
}

// 25 calls back to back with new inputs (sequence numbers, slots reused across calls), then
// 20 graph replays of one captured call.
TEST_P(FusedXnode, BackToBackAndGraph) {
  MKTEST_REQUIRE_GPU();
  const Layout& l = GetParam();
  Vnodes v(l.nodes, l.n);
  ASSERT_TRUE(v.ok()) << v.why;
  const uint64_t seed = mktest::testSeed() ^ (0xb2bull * l.n + l.nodes);
  Case c{fusedtest::kAllGather, l.n,          384 * l.n, 264,           1024, 1,
         ncclBfloat16,          ncclBfloat16, true,      ncclFusedFused};
  {
    Problem p(c);
    const std::string err = runFused(p, v.comms, v.streams, seed, false, 25);
    if (!err.empty()) v.abortAll();
    ASSERT_EQ(err, "") << l.name << " back to back " << name(c);
  }
  c.noGathered = true;
  c.out = ncclFloat32;
  {
    Problem p(c);
    const std::string err = runFused(p, v.comms, v.streams, seed + 1, true, 20);
    if (!err.empty()) v.abortAll();
    ASSERT_EQ(err, "") << l.name << " graph " << name(c);
  }
  // GEMM + ReduceScatter and GEMM + AllReduce alike, then an AllGather + GEMM right after
  // them (shared call counter and signal slots).
  for (int op : {fusedtest::kReduceScatter, fusedtest::kAllReduce}) {
    Case r{op, l.n, 300 * l.n, 520, 256, 1, ncclBfloat16, ncclBfloat16, true, ncclFusedFused};
    {
      Problem p(r);
      const std::string err = runFused(p, v.comms, v.streams, seed + 2 + op, false, 25);
      if (!err.empty()) v.abortAll();
      ASSERT_EQ(err, "") << l.name << " back to back " << name(r);
    }
    r.out = ncclFloat32;
    r.in = ncclFloat16;
    {
      Problem p(r);
      const std::string err = runFused(p, v.comms, v.streams, seed + 5 + op, true, 20);
      if (!err.empty()) v.abortAll();
      ASSERT_EQ(err, "") << l.name << " graph " << name(r);
    }
  }
  Problem p(c);
  const std::string err = runFused(p, v.comms, v.streams, seed + 9, false, 3);
  if (!err.empty()) v.abortAll();
  ASSERT_EQ(err, "") << l.name << " AllGather after ReduceScatter " << name(c);
}

INSTANTIATE_TEST_SUITE_P(FusedXnode, FusedXnode,
                         ::testing::Values(Layout{2, 2, "2x1"}, Layout{2, 4, "2x2"},
                                           Layout{3, 3, "3x1"}, Layout{2, 3, "uneven_2p1"}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return std::string(i.param.name);
                         });

// ncclFusedAuto across nodes follows gxAutoFuses (xnode.h), also with MKERNEL_FUSED_AUTO=1 (the
// model's rates being per process): ReduceScatter / AllReduce fuse where the layout takes the
// shape, AllGather from N = kGxAutoMinN; ncclFusedFused with a forced split (config commSms)
// fuses; MKERNEL_FUSED_XNODE=0 keeps every algo sequential. Results checked in every case.
std::string runExpect(Vnodes& v, Problem& p, uint64_t seed, bool fused) {
  const uint64_t before = xnodeLaunches();
  std::string e = fusedtest::runDriven(p, v.comms, v.streams, seed);
  const uint64_t ran = xnodeLaunches() - before;
  if (e.empty() && ran != (fused ? (uint64_t)v.n : 0))
    e = "xnode kernel launches " + std::to_string(ran) + ", expected " +
        std::to_string(fused ? v.n : 0);
  if (!e.empty()) v.abortAll();
  return e;
}

TEST(FusedXnodeChoice, AutoRuleForcedSplitFusedSwitchOff) {
  MKTEST_REQUIRE_GPU();
  const uint64_t seed = mktest::testSeed() ^ 0xc40;
  static_assert(mk::fused::kGxAutoMinN == 256, "the AllGather cases sit on both sides of the rule");
  Case c{fusedtest::kAllGather, 2,    2 * 96,       256, 256, 0, ncclBfloat16,
         ncclBfloat16,          true, ncclFusedAuto};
  Case narrow = c;
  narrow.N = 136;  // below kGxAutoMinN, not a tile multiple
  {
    Vnodes v(2, 2);
    ASSERT_TRUE(v.ok()) << v.why;
    Problem p(c);
    ASSERT_EQ(runExpect(v, p, seed, true), "") << "auto " << name(c);
    Problem w(narrow);
    ASSERT_EQ(runExpect(v, w, seed + 10, false), "") << "auto " << name(narrow);
    p.cfg.algo = ncclFusedFused;
    p.cfg.commSms = 4;  // forced split: 1 send + 3 receive CTAs (2 copy the own shard)
    ASSERT_EQ(runExpect(v, p, seed + 1, true), "") << "forced split " << name(c);
  }
  {
    mktest::ScopedEnv model("MKERNEL_FUSED_AUTO", "1");
    Vnodes v(2, 2);
    ASSERT_TRUE(v.ok()) << v.why;
    Problem p(c);
    ASSERT_EQ(runExpect(v, p, seed + 2, true), "") << "auto, MKERNEL_FUSED_AUTO=1 " << name(c);
    Problem w(narrow);
    ASSERT_EQ(runExpect(v, w, seed + 11, false), "")
        << "auto, MKERNEL_FUSED_AUTO=1 " << name(narrow);
  }
  Case r{fusedtest::kReduceScatter,
         2,
         2 * 96,
         256,
         256,
         0,
         ncclBfloat16,
         ncclBfloat16,
         true,
         ncclFusedAuto};
  Case a = r;
  a.op = fusedtest::kAllReduce;
  Case odd = a;
  odd.M = 2 * 96 + 1;  // AllReduce rows not a multiple of n: no owner split, sequential
  {
    Vnodes v(2, 2);
    ASSERT_TRUE(v.ok()) << v.why;
    Problem p(r);
    ASSERT_EQ(runExpect(v, p, seed + 4, true), "") << "auto " << name(r);
    Problem pa(a);
    ASSERT_EQ(runExpect(v, pa, seed + 12, true), "") << "auto " << name(a);
    Problem po(odd);
    ASSERT_EQ(runExpect(v, po, seed + 13, false), "") << "auto " << name(odd);
    a.algo = ncclFusedFused;
    odd.algo = ncclFusedFused;
    p.cfg.algo = ncclFusedFused;
    p.cfg.commSms = 3;  // forced split: 1 send, 1 receive, 1 reduce CTA
    ASSERT_EQ(runExpect(v, p, seed + 5, true), "") << "forced split " << name(r);
    Problem q(a);
    ASSERT_EQ(runExpect(v, q, seed + 6, true), "") << "AllReduce fused " << name(a);
    Problem o(odd);
    ASSERT_EQ(runExpect(v, o, seed + 8, false), "") << "AllReduce M % n != 0 " << name(odd);
  }
  mktest::ScopedEnv off("MKERNEL_FUSED_XNODE", "0");
  Vnodes v(2, 2);
  ASSERT_TRUE(v.ok()) << v.why;
  Problem pr(r);
  ASSERT_EQ(runExpect(v, pr, seed + 14, false), "") << "MKERNEL_FUSED_XNODE=0 auto " << name(r);
  c.algo = ncclFusedFused;
  Problem p(c);
  ASSERT_EQ(runExpect(v, p, seed + 3, false), "") << "MKERNEL_FUSED_XNODE=0 " << name(c);
  r.algo = ncclFusedFused;
  Problem q(r);
  ASSERT_EQ(runExpect(v, q, seed + 7, false), "") << "MKERNEL_FUSED_XNODE=0 " << name(r);
  Problem o(a);
  ASSERT_EQ(runExpect(v, o, seed + 9, false), "") << "MKERNEL_FUSED_XNODE=0 " << name(a);
}

// 2x2: 120 random fused calls (fused ones run the xnode kernel where its rules allow) mixed with
// collectives (hierarchical AllReduce, channel engine) on one comm: the window areas the
// xnode layout shares with them.
TEST(FusedXnodeRandom, MixedWithCollectives2x2) {
  MKTEST_REQUIRE_GPU();
  Vnodes v(2, 4);
  ASSERT_TRUE(v.ok()) << v.why;
  const uint64_t seed = mktest::testSeed() ^ 0x3e1;
  printf("[FusedXnodeRandom] seed %llu (MKTEST_SEED=%llu repeats it)\n", (unsigned long long)seed,
         (unsigned long long)mktest::testSeed());
  const uint64_t before = xnodeLaunches();
  int colls = 0;
  const std::string err = fusedtest::runRandomMix(
      v.comms, v.streams, seed, 120, 20, [&] { v.abortAll(); }, &colls);
  ASSERT_EQ(err, "");
  EXPECT_GT(xnodeLaunches(), before) << "no random call ran the xnode kernel";
  printf("[FusedXnodeRandom] 120 fused calls (%llu xnode launches) and %d collectives\n",
         (unsigned long long)(xnodeLaunches() - before), colls);
}

// 2x1: rank 1 never calls. Rank 0's kernel must fail within MKERNEL_TIMEOUT_MS (+ slack) with
// an error naming rank 1, and ncclCommAbort must return within 5 s on both ranks.
// The same for GEMM + ReduceScatter / AllReduce (AbortRs, AbortAr).
void peerNeverComes(int op) {
  constexpr int kTimeoutMs = 3000;
  Vnodes v(2, 2, 1 << 20, kTimeoutMs);
  ASSERT_TRUE(v.ok()) << v.why;
  Case c{op, 2, 2 * 384, 264, 1024, 0, ncclBfloat16, ncclBfloat16, false, ncclFusedFused};
  Problem p(c);
  ASSERT_EQ(p.fill(mktest::testSeed() ^ 0xab0), "");
  const uint64_t before = xnodeLaunches();
  ASSERT_EQ(p.call(0, v.comms[0], v.streams[0]), ncclSuccess) << ncclGetLastError(v.comms[0]);
  ASSERT_EQ(xnodeLaunches(), before + 1) << "the call did not launch the xnode kernel";
  const auto t0 = std::chrono::steady_clock::now();
  ncclResult_t async = ncclSuccess;
  while (async == ncclSuccess || async == ncclInProgress) {
    ASSERT_EQ(ncclCommGetAsyncError(v.comms[0], &async), ncclSuccess);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > kTimeoutMs / 1000.0 + 15) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string msg = ncclGetLastError(v.comms[0]);
  const double detectS =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto t1 = std::chrono::steady_clock::now();
  v.abortAll();
  const double abortS =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  printf("[FusedXnodeAbort] error after %.2f s: %s; abort %.2f s\n", detectS, msg.c_str(), abortS);
  EXPECT_NE(async, ncclSuccess) << "no error within " << detectS << " s";
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_LT(abortS, 5.0);
}

TEST(FusedXnodeAbort, PeerNeverComesNamedAndAbortIsQuick) {
  MKTEST_REQUIRE_GPU();
  peerNeverComes(fusedtest::kAllGather);
}

TEST(FusedXnodeAbort, AbortRsPeerNeverComesNamedAndAbortIsQuick) {
  MKTEST_REQUIRE_GPU();
  peerNeverComes(fusedtest::kReduceScatter);
}

TEST(FusedXnodeAbort, AbortArPeerNeverComesNamedAndAbortIsQuick) {
  MKTEST_REQUIRE_GPU();
  peerNeverComes(fusedtest::kAllReduce);
}

// ---- 2 processes as 2 nodes ------------------------------------------------------------------
// Child: "xnode 2 rank seed" in MKTEST_XN_CHILD, the unique id in MKTEST_XN_ID. Every case of
// xnodeCases, 25 back-to-back calls, 20 graph replays; failures counted.
int xnodeChild(const char* spec) {
  fusedtest::ChildRank x;
  if (!fusedtest::childRankInit(spec, "MKTEST_XN_ID", "[FusedXnode]", &x)) return 1;
  const int n = x.n, me = x.me;
  const uint64_t seed = x.seed;
  std::string err;
  int idx = 0;
  for (const Case& c : xnodeCases(n)) {
    Problem p(c, me);
    err = runFused(p, x.comms, x.streams, seed + idx++);
    if (!err.empty()) {
      err = name(c) + ": " + err;
      break;
    }
  }
  for (int op : {fusedtest::kAllGather, fusedtest::kReduceScatter, fusedtest::kAllReduce}) {
    if (!err.empty()) break;
    Case c{op, n, 384 * n, 264, 1024, 1, ncclFloat16, ncclFloat16, true, ncclFusedFused};
    Problem p(c, me);
    err = runFused(p, x.comms, x.streams, seed + 100 + 2 * op, false, 25);
    if (err.empty()) {
      Problem g(c, me);
      err = runFused(g, x.comms, x.streams, seed + 101 + 2 * op, true, 20);
    }
    if (!err.empty()) err = "back to back / graph " + name(c) + ": " + err;
  }
  return fusedtest::childRankFinish(x, err, "[FusedXnode]");
}

TEST(FusedXnodeChild, Run) {
  const char* spec = getenv("MKTEST_XN_CHILD");
  if (!spec) GTEST_SKIP() << "helper of FusedXnodeProcs (runs only in its children)";
  EXPECT_EQ(xnodeChild(spec), 0) << "the failure is printed above";
}

TEST(FusedXnodeProcs, TwoProcessesAsTwoNodes) {
  MKTEST_REQUIRE_GPU();
  dctest::TestEnv env(2, 1 << 20, 0, 20000);  // children inherit it
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    char spec[160];
    snprintf(spec, sizeof(spec), "MKTEST_XN_CHILD=xnode 2 %d %llu", r,
             (unsigned long long)mktest::testSeed());
    pids.push_back(
        mktest::spawnSelf("FusedXnodeChild.Run", {spec, "MKTEST_XN_ID=" + gputest::idToHex(id)}));
    ASSERT_GT(pids.back(), 0) << "spawn failed";
  }
  EXPECT_EQ(mktest::waitChildren(pids, 300), "");
}

}  // namespace
