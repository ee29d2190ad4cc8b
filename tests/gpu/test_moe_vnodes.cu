// ncclMoeDispatchGemm and ncclMoeDispatchFfnCombine on virtual nodes: n ranks on GPU 0 over 2
// (or 4) virtual nodes (MKERNEL_EMULATE_NODES, socket backend on loopback), one thread per rank,
// the cases of test_moe_cases.h, each in both modes of the per-node dedup (MKERNEL_MOE_NODE_DEDUP,
// fused/ops/moe/moe_node.h): mode 0 (a token travels to every rank owning one of its experts)
// checked against the host references, then mode 1 (a token crosses once per remote node, to
// its gateway, which forwards it inside the node) on the same draws, checked the same way and
// byte for byte against mode 0's outputs (counts, offsets, rowSource, rowWeight, received
// rows, y: the dedup changes the route, never a result). The MoeVnodes*, MoeVnodesOverflow and
// MoeProcsGraph suites pass ncclFusedSequential (the AllToAll path; ncclFusedAuto takes the
// fused layer across nodes since session 36), the MoeVnodesFused suites ncclFusedFused.
//   MoeVnodes.TwoByTwo / TwoByFour      every case of both calls, 4 and 8 ranks.
//   MoeVnodes.FourByTwo                 the same on 4 nodes of 2 ranks: 3 remote gateways per
//       rail (every rank forwards the tokens of 3 remote sources).
//   MoeVnodes.RailSpill2x2 / 2x4        routing kRailSpill at the exact-fit bound: rank 0's
//       tokens for each remote node exceed a pair buffer, so in mode 1 rank 0 serves that node
//       direct (the spill rule) while the other ranks go through their gateways, in one call.
//   MoeVnodes.CrossNodeBytes2x2 / 2x4   one dispatch, uniform routing (k = 6 of 8 experts per
//       rank at 2x2, k = 8 of 16 at 2x4), H = 512, in both modes: the proxies' bytes sent
//       (mk::netStats, summed over ranks) in mode 1 at most 0.75x / 0.60x mode 0's (the model,
//       moe_node.h: 0.59x / 0.38x of the token rows), so mode 1 is known to have run its route.
//   MoeVnodesOverflow.TwoByTwo          rank 1 needs the most rows and the shared maxRows is
//       one row short of its need, once per call, each on fresh comms, in both modes: its comm
//       reports ncclInvalidUsage naming the call and the rows, it receives nothing; the other
//       ranks' outputs check out (FFN: slots routed to rank 1 add nothing) and their comms
//       report nothing. In mode 1 rank 1 is both a receiver of fan rows (rank 2's tokens come
//       through gateway rank 0) and the gateway of rank 3's tokens to node 0.
//   MoeProcsGraph.Vnodes2x2             capture and replays with new routing, in both modes.
//   MoeVnodesFused.TwoByTwo / TwoByFour / FourByTwo   every case of both calls with
//       ncclFusedFused (the fused kernel across nodes, fused/ops/moe/xnode_kernel.cuh) checked
//       against the host references and byte for byte against the AllToAll path's outputs on
//       the same draws (ncclFusedSequential: auto takes the fused layer across nodes since
//       session 36), in both modes of the dedup; the fused kernel ran for
//       every call it covers (the dispatch calls, and the layer's with w in the [N,K] layout).
//   MoeVnodesFused.GroupsOfThree2x2     TwoByTwo's check with config commSms 18: groups of 3
//       send and 3 land CTAs per peer (mxGroup), each splitting every chunk by rows.
//   MoeVnodesFused.Overflow2x2          the overflow plan above with ncclFusedFused, both modes.
//   MoeVnodesFused.CrossNodeBytes2x2    the bytes check above with ncclFusedFused: the fused
//       kernel's gateways forward (mode 1 at most 0.75x mode 0's cross-node bytes).
//   MoeVnodesFused.Graph2x2             capture and replays with new routing, fused, both modes.
//   MoeVnodesFused.PeerNeverComes       2 ranks on 2 nodes: rank 0 calls the fused layer, rank 1
//       takes part in its counts' AllToAll only and never in the fused call: rank 0's call fails
//       naming rank 1 after MKERNEL_TIMEOUT_MS (3 s here; ranks of one process: the enqueue's
//       rendezvous catches it on the host), ncclCommAbort returns within 5 s, and the GPU stays
//       usable (a new pair then runs the fused layer).
// Waits on the device end after 20 s.
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

#include "base/param.h"
#include "common/test_util.h"
#include "fused/ops/moe/moe.h"       // moeXnodeLaunches
#include "fused/ops/moe/moe_node.h"  // moeCntStride
#include "gpu/test_devcomm_util.h"
#include "gpu/test_moe_cases.h"
#include "gpu/test_proc_util.h"
#include "gpu/test_thread_team.h"
#include "transport/net_state.h"

namespace {

using namespace moecases;  // NOLINT: the drivers, cases and plans

struct VnodeTeam {
  // 1 MiB windows (several chunks per AllToAll); waits on the device end after 20 s.
  dctest::TestEnv env;
  gputest::Team team;
  explicit VnodeTeam(int n, int nodes = 2) : env(nodes, 1 << 20, 0, 20000), team(n) {}
};

// MKERNEL_MOE_NODE_DEDUP for the calls made in its scope (read at each call: the cached
// parameters are reset when it is set and when it is restored).
class DedupMode {
 public:
  explicit DedupMode(int mode)
      : env_(new mktest::ScopedEnv("MKERNEL_MOE_NODE_DEDUP", std::to_string(mode).c_str())) {
    mk::paramReset();
  }
  ~DedupMode() {
    env_.reset();
    mk::paramReset();
  }

 private:
  std::unique_ptr<mktest::ScopedEnv> env_;
};

// plan(driver, seed, snapshots) in mode 0 (kept), then in mode 1 (compared), same seed.
void runBothModes(int n, const char* name,
                  const std::function<std::string(Driver&, uint64_t, Snapshots*)>& plan,
                  int nodes = 2) {
  VnodeTeam v(n, nodes);
  ASSERT_TRUE(v.team.ok) << v.team.why;
  TeamDriver d(v.team);
  const uint64_t seed = mktest::testSeed() ^ (0x7e0dull * n);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Snapshots snap(n);
  for (int mode = 0; mode <= 1; ++mode) {
    DedupMode m(mode);
    if (mode == 1) snap.compare();
    const std::string err = plan(d, seed, &snap);
    EXPECT_EQ(err, "") << name << ", MKERNEL_MOE_NODE_DEDUP=" << mode;
    if (!err.empty()) return;  // the comms were aborted
    printf("[MoeVnodes %s %dx%d] MKERNEL_MOE_NODE_DEDUP=%d: passed%s\n", name, nodes, n / nodes,
           mode, mode == 1 ? ", every output equal to mode 0's" : "");
  }
}

void runVnodes(int n, int nodes = 2) {
  runBothModes(
      n, "cases",
      [n, nodes](Driver& d, uint64_t seed, Snapshots* snap) {
        return runCases(
            d, seed,
            [&](const std::string& line) {
              printf("[MoeVnodes %dx%d] %s\n", nodes, n / nodes, line.c_str());
            },
            snap, ncclFusedSequential);
      },
      nodes);
}

TEST(MoeVnodes, TwoByTwo) {
  MKTEST_REQUIRE_GPU();
  runVnodes(4);
}

TEST(MoeVnodes, TwoByFour) {
  MKTEST_REQUIRE_GPU();
  runVnodes(8);
}

TEST(MoeVnodes, FourByTwo) {
  MKTEST_REQUIRE_GPU();
  runVnodes(8, 4);
}

// Rank 0's tokens for a remote node, at least: every rank of that node gets maxT / (n - 1) of
// them (kRailSpill), none is rank 0.
size_t railSpillTokens(int n, int maxT) {
  return (size_t)(n / 2) * (size_t)(maxT / (n - 1));
}

// Both calls with kRailSpill routing at the exact-fit bound (checked to spill), called back
// to back, then the dispatch again with new routing.
std::string railSpillPlan(Driver& d, uint64_t seed, Snapshots* snap) {
  const int n = d.n;
  std::mt19937_64 rng(seed);
  const MoeCase mc{n, 1, 2, 64, 128, kBf, kBf, kNK, kRailSpill, 900};
  const FfnCase fc{n, 1, 2, 64, 32, kBf, kF32, kNK, kRailSpill, 1, 900};
  MoeProblem a(mc);
  FfnProblem b(fc);
  const size_t anyA = anyRouting(n, mc.maxT, mc.k, mc.epr);
  const size_t anyB = anyRouting(n, fc.maxT, fc.k, fc.epr);
  auto drawA = [&](uint64_t sd, size_t rows) { return a.draw(sd, true, 0, -1, rows); };
  DrawOpts o;
  auto drawB = [&](uint64_t sd, size_t rows) {
    o.fixedRows = rows;
    return b.draw(sd, o);
  };
  std::string e = drawShared<MoeProblem>(a, n, anyA, rng(), 0, drawA);
  if (e.empty()) e = drawShared<FfnProblem>(b, n, anyB, rng(), 0, drawB);
  if (e.empty() && (railSpillTokens(n, mc.maxT) <= a.rank(0).maxRows ||
                    railSpillTokens(n, fc.maxT) <= b.rank(0).maxRows))
    e = "the draw does not spill: " + std::to_string(railSpillTokens(n, mc.maxT)) +
        " tokens for a node, bounds " + std::to_string(a.rank(0).maxRows) + " and " +
        std::to_string(b.rank(0).maxRows);
  if (e.empty()) e = runChecked<MoeProblem>(d, {&a}, snap);
  if (e.empty()) e = runChecked<FfnProblem>(d, {&b}, snap);
  if (e.empty()) e = drawShared<MoeProblem>(a, n, anyA, rng(), 0, drawA);
  if (e.empty()) e = runChecked<MoeProblem>(d, {&a}, snap);
  if (!e.empty()) d.abortAll();
  return e;
}

TEST(MoeVnodes, RailSpill2x2) {
  MKTEST_REQUIRE_GPU();
  runBothModes(4, "rail spill", railSpillPlan);
}

TEST(MoeVnodes, RailSpill2x4) {
  MKTEST_REQUIRE_GPU();
  runBothModes(8, "rail spill", railSpillPlan);
}

// Bytes every rank's proxy has sent so far, summed.
std::string netBytes(Driver& d, uint64_t* sum) {
  *sum = 0;
  for (int r = 0; r < d.n; ++r) {
    mk::NetStats st{};
    if (mk::netStats(d.comm(r), &st) != ncclSuccess)
      return "netStats failed on rank " + std::to_string(r);
    *sum += st.bytesSent;
  }
  return "";
}

void runCrossNodeBytes(int n, int epr, int k, double most, int algo = ncclFusedSequential) {
  uint64_t sent[2] = {0, 0};
  const uint64_t launched = mk::fused::moeXnodeLaunches();
  runBothModes(n, "cross-node bytes", [&](Driver& d, uint64_t seed, Snapshots* snap) {
    const MoeCase mc{n, epr, k, 512, 128, kBf, kBf, kNK, kUniform, 384};
    MoeProblem a(mc);
    a.algo = algo;
    auto draw = [&](uint64_t sd, size_t rows) { return a.draw(sd, true, 0, -1, rows); };
    std::string e = drawShared<MoeProblem>(a, n, anyRouting(n, mc.maxT, k, epr), seed, 0, draw);
    uint64_t before = 0, after = 0;
    if (e.empty()) e = netBytes(d, &before);
    if (e.empty()) e = runChecked<MoeProblem>(d, {&a}, snap);
    if (e.empty()) e = netBytes(d, &after);
    if (!e.empty()) {
      d.abortAll();
      return e;
    }
    sent[snap->comparing() ? 1 : 0] = after - before;
    return std::string();
  });
  printf("[MoeVnodes cross-node bytes 2x%d%s] k=%d: mode 0 %llu, mode 1 %llu bytes (%.2fx)\n",
         n / 2, algo == ncclFusedFused ? ", fused" : "", k, (unsigned long long)sent[0],
         (unsigned long long)sent[1], sent[0] ? (double)sent[1] / (double)sent[0] : 0.0);
  if (::testing::Test::HasFailure()) return;
  EXPECT_GT(sent[0], 0u) << "mode 0 sent nothing across nodes";
  if (algo == ncclFusedFused)  // one call a rank in each mode, both on the fused kernel
    EXPECT_EQ(mk::fused::moeXnodeLaunches() - launched, 2u * n);
  EXPECT_LE((double)sent[1], most * (double)sent[0]) << "mode 1 did not cut the cross-node bytes";
}

TEST(MoeVnodes, CrossNodeBytes2x2) {
  MKTEST_REQUIRE_GPU();
  runCrossNodeBytes(4, 2, 6, 0.75);
}

TEST(MoeVnodes, CrossNodeBytes2x4) {
  MKTEST_REQUIRE_GPU();
  runCrossNodeBytes(8, 2, 8, 0.60);
}

// ---- overflow ----------------------------------------------------------------------------
constexpr int kTight = 1;  // the rank whose bound is one row short

// One call with rank kTight one row short, on the driver's (fresh) comms, which it aborts at
// the end. check(p, r) checks rank r's outputs; `op` is the name the error must carry.
template <class P>
std::string overflowCall(Driver& d, P& p, const char* op,
                         const std::function<std::string(P&, int)>& check) {
  std::string e = d.each([&](int r) -> std::string {
    const ncclResult_t res = p.call(r, d.comm(r), d.stream(r));
    if (res != ncclSuccess && !(r == kTight && res == ncclInvalidUsage))
      return fusedtest::callError(r, d.comm(r), res);
    if (!gputest::streamCompleted(d.stream(r), 60))
      return "rank " + std::to_string(r) + ": stream failed or busy after 60 s";
    return "";
  });
  ncclResult_t a = ncclSuccess;
  // The host poller may report after the stream is done: wait for the overflowing rank's.
  if (e.empty() &&
      gputest::pollAsyncError(d.comm(kTight), gputest::Clock::now(), 10, &a) != ncclSuccess)
    e = "ncclCommGetAsyncError failed";
  const std::string msg = ncclGetLastError(d.comm(kTight));
  if (e.empty() && a != ncclInvalidUsage)
    e = "rank 1's async error is " + std::string(ncclGetErrorString(a)) +
        ", expected ncclInvalidUsage: " + msg;
  if (e.empty() && (msg.find(op) == std::string::npos || msg.find("rows") == std::string::npos))
    e = "rank 1's error does not name " + std::string(op) + " and the rows: " + msg;
  for (int r = 0; r < d.n && e.empty(); ++r) {
    if (r == kTight) continue;
    if (ncclCommGetAsyncError(d.comm(r), &a) != ncclSuccess || a != ncclSuccess)
      e = "rank " + std::to_string(r) + ", a peer of the overflowing rank, reports " +
          ncclGetErrorString(a) + ": " + ncclGetLastError(d.comm(r));
  }
  if (e.empty()) e = d.each([&](int r) { return check(p, r); });
  d.abortAll();
  return e;
}

// Both calls, each on fresh comms of n ranks on 2 virtual nodes, in the current mode.
std::string overflowPlan(int n, uint64_t seed, int algo = ncclFusedSequential) {
  std::string e;
  {
    VnodeTeam v(n);
    if (!v.team.ok) return "team: " + v.team.why;
    TeamDriver d(v.team);
    const MoeCase mc{n, 2, 2, 64, 64, kBf, kF32, kNK, kHotExpert, 120};
    MoeProblem mp(mc);
    mp.algo = algo;
    e = drawTight<MoeProblem>(
        mp, n, kTight, anyRouting(n, mc.maxT, mc.k, mc.epr), seed,
        [&](uint64_t sd, size_t rows, int tight) { return mp.draw(sd, true, 0, tight, rows); });
    if (e.empty())
      e = overflowCall<MoeProblem>(d, mp, "MoeDispatchGemm", [](MoeProblem& p, int r) {
        if (r != kTight) return p.check(r);
        std::vector<int32_t> cnt(2, -7);
        if (cudaMemcpy(cnt.data(), p.rank(r).dcnt, 8, cudaMemcpyDeviceToHost) != cudaSuccess)
          return std::string("cudaMemcpy of rank 1's counts failed");
        return std::string(cnt[0] != 0 || cnt[1] != 0 ? "the overflowing rank received rows" : "");
      });
    if (!e.empty()) return "ncclMoeDispatchGemm: " + e;
  }
  VnodeTeam v(n);
  if (!v.team.ok) return "team: " + v.team.why;
  TeamDriver d(v.team);
  const FfnCase fc{n, 2, 2, 64, 32, kBf, kF32, kNK, kHotExpert, 37, 120};
  FfnProblem fp(fc);
  fp.algo = algo;
  e = drawTight<FfnProblem>(fp, n, kTight, anyRouting(n, fc.maxT, fc.k, fc.epr), seed ^ 0xff,
                            [&](uint64_t sd, size_t rows, int tight) {
                              DrawOpts o;
                              o.fixedRows = rows;
                              o.tight = tight;
                              return fp.draw(sd, o);
                            });
  if (e.empty())
    e = overflowCall<FfnProblem>(d, fp, "MoeDispatchFfnCombine", [](FfnProblem& p, int r) {
      return p.check(r, kTight, r == kTight);
    });
  return e.empty() ? "" : "ncclMoeDispatchFfnCombine: " + e;
}

TEST(MoeVnodesOverflow, TwoByTwo) {
  MKTEST_REQUIRE_GPU();
  const uint64_t seed = mktest::testSeed() ^ 0x0f2;
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int mode = 0; mode <= 1; ++mode) {
    DedupMode m(mode);
    const std::string err = overflowPlan(4, seed);
    EXPECT_EQ(err, "") << "MKERNEL_MOE_NODE_DEDUP=" << mode;
    if (err.empty()) printf("[MoeVnodesOverflow 2x2] MKERNEL_MOE_NODE_DEDUP=%d: passed\n", mode);
  }
}

TEST(MoeProcsGraph, Vnodes2x2) {
  MKTEST_REQUIRE_GPU();
  VnodeTeam v(4);
  ASSERT_TRUE(v.team.ok) << v.team.why;
  TeamDriver d(v.team);
  const uint64_t seed = mktest::testSeed() ^ 0x96e2;
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int mode = 0; mode <= 1; ++mode) {
    DedupMode m(mode);
    const std::string err = runGraphs(d, seed + mode, ncclFusedSequential);
    EXPECT_EQ(err, "") << "MKERNEL_MOE_NODE_DEDUP=" << mode;
    if (!err.empty()) return;
  }
}

// ---- the fused kernel across nodes ---------------------------------------------------------

// Calls of runCases the fused kernel covers, per rank: every dispatch call, and the layer's
// calls with the weights in the [N,K] layout (SwiGLU in GEMM1's epilogue); 3 calls a case.
uint64_t fusedCalls(int n) {
  uint64_t calls = 3 * dispatchCases(n).size();
  for (const FfnCase& c : ffnCases(n)) calls += c.layout == kNK ? 3 : 0;
  return calls * (uint64_t)n;
}

// In both modes of the dedup: the AllToAll path's outputs kept, then the fused kernel's
// compared byte for byte on the same draws (its calls with config commSms `commSms`).
void runFusedVsA2a(int n, int nodes, int commSms = -1) {
  VnodeTeam v(n, nodes);
  ASSERT_TRUE(v.team.ok) << v.team.why;
  TeamDriver d(v.team);
  const uint64_t seed = mktest::testSeed() ^ (0xf05eull * n + nodes);
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int mode = 0; mode <= 1; ++mode) {
    DedupMode m(mode);
    Snapshots snap(n);
    auto log = [&](const std::string& line) {
      printf("[MoeVnodesFused %dx%d dedup %d] %s\n", nodes, n / nodes, mode, line.c_str());
    };
    std::string err = runCases(d, seed, log, &snap, ncclFusedSequential);
    ASSERT_EQ(err, "") << "the AllToAll path, MKERNEL_MOE_NODE_DEDUP=" << mode;
    snap.compare();
    const uint64_t before = mk::fused::moeXnodeLaunches();
    err = runCases(d, seed, log, &snap, ncclFusedFused, true, commSms);
    EXPECT_EQ(err, "") << "ncclFusedFused, MKERNEL_MOE_NODE_DEDUP=" << mode;
    EXPECT_EQ(mk::fused::moeXnodeLaunches() - before, fusedCalls(n))
        << "fused kernels launched across nodes";
    if (!err.empty()) return;  // the comms were aborted
    printf("[MoeVnodesFused %dx%d dedup %d] every output equal to the AllToAll path's\n", nodes,
           n / nodes, mode);
  }
}

TEST(MoeVnodesFused, TwoByTwo) {
  MKTEST_REQUIRE_GPU();
  runFusedVsA2a(4, 2);
}

TEST(MoeVnodesFused, TwoByFour) {
  MKTEST_REQUIRE_GPU();
  runFusedVsA2a(8, 2);
}

TEST(MoeVnodesFused, FourByTwo) {
  MKTEST_REQUIRE_GPU();
  runFusedVsA2a(8, 4);
}

// Groups of 3 send and 3 land CTAs per peer (18 comm CTAs at 3 peers: mxGroup), whose lanes
// split every chunk by rows (uneven slices, empty ones where a chunk has fewer rows than lanes)
// and join before lane 0 signals, acks and releases; until now only the benches ran groups (of
// 2 and 8), checked against torch's tolerance, not byte for byte.
TEST(MoeVnodesFused, GroupsOfThree2x2) {
  MKTEST_REQUIRE_GPU();
  runFusedVsA2a(4, 2, 18);
}

TEST(MoeVnodesFused, Overflow2x2) {
  MKTEST_REQUIRE_GPU();
  const uint64_t seed = mktest::testSeed() ^ 0x0f3;
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int mode = 0; mode <= 1; ++mode) {
    DedupMode m(mode);
    const uint64_t before = mk::fused::moeXnodeLaunches();
    EXPECT_EQ(overflowPlan(4, seed, ncclFusedFused), "") << "MKERNEL_MOE_NODE_DEDUP=" << mode;
    EXPECT_EQ(mk::fused::moeXnodeLaunches() - before, 8u) << "one fused call of each kind a rank";
  }
}

TEST(MoeVnodesFused, CrossNodeBytes2x2) {
  MKTEST_REQUIRE_GPU();
  runCrossNodeBytes(4, 2, 6, 0.75, ncclFusedFused);
}

TEST(MoeVnodesFused, Graph2x2) {
  MKTEST_REQUIRE_GPU();
  VnodeTeam v(4);
  ASSERT_TRUE(v.team.ok) << v.team.why;
  TeamDriver d(v.team);
  const uint64_t seed = mktest::testSeed() ^ 0x96e3;
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int mode = 0; mode <= 1; ++mode) {
    DedupMode m(mode);
    const uint64_t before = mk::fused::moeXnodeLaunches();
    const std::string err = runGraphs(d, seed + mode, ncclFusedFused);
    EXPECT_EQ(err, "") << "MKERNEL_MOE_NODE_DEDUP=" << mode;
    if (!err.empty()) return;
    EXPECT_GT(mk::fused::moeXnodeLaunches(), before);
  }
}

TEST(MoeVnodesFused, PeerNeverComes) {
  MKTEST_REQUIRE_GPU();
  constexpr int kTimeoutMs = 3000;
  const FfnCase fc{2, 2, 2, 64, 32, kBf, kBf, kNK, kUniform, 37, 100};
  {
    dctest::TestEnv env(2, 1 << 20, 0, kTimeoutMs);
    gputest::Team team(2);
    ASSERT_TRUE(team.ok) << team.why;
    FfnProblem p(fc);
    p.algo = ncclFusedFused;
    DrawOpts o;
    ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xab4, o), "");
    // Rank 1 takes part in the call's first collective, the counts' AllToAll (moeCntStride
    // ints a rank, every pair direct), and never in the fused call.
    mk::fused::MoeNodeMap direct{};
    const int stride = mk::fused::moeCntStride(direct, fc.epr);
    void* cnt = nullptr;
    ASSERT_EQ(cudaMalloc(&cnt, 2 * 2 * stride * sizeof(int32_t)), cudaSuccess);
    ASSERT_EQ(mktest::syncMemset(cnt, 0, 2 * 2 * stride * sizeof(int32_t)), cudaSuccess);
    const uint64_t before = mk::fused::moeXnodeLaunches();
    const std::string e = team.run([&](int r) -> std::string {
      ncclResult_t res;
      if (r == 0) {
        res = p.call(0, team.comms[0], team.streams[0]);
      } else {
        int32_t* c = static_cast<int32_t*>(cnt);
        res = ncclAlltoAll(c, c + 2 * stride, stride, ncclInt32, team.comms[1], team.streams[1]);
      }
      return res == ncclSuccess ? "" : fusedtest::callError(r, team.comms[r], res);
    });
    // Ranks of one process: the enqueue's rendezvous (coll/rendezvous.h) waits on the host for
    // rank 1's matching fused call until MKERNEL_TIMEOUT_MS and fails rank 0's call naming it,
    // before the fused kernel is enqueued (the H200, session 35); the counts' AllToAll ran.
    printf("[MoeVnodesFused PeerNeverComes] %s\n", e.c_str());
    EXPECT_NE(e.find("rank 0"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 1"), std::string::npos) << "the error must name the missing peer: " << e;
    EXPECT_EQ(mk::fused::moeXnodeLaunches() - before, 0u) << "no fused kernel without the peer";
    const auto t0 = gputest::Clock::now();
    EXPECT_EQ(ncclCommAbort(team.comms[0]), ncclSuccess);
    EXPECT_EQ(ncclCommAbort(team.comms[1]), ncclSuccess);
    const double took = gputest::since(t0);
    team.forget(0);
    team.forget(1);
    EXPECT_LT(took, 5.0) << "ncclCommAbort must return promptly";
    EXPECT_TRUE(gputest::streamCompleted(team.streams[0], 5)) << "rank 0's call must end";
    EXPECT_EQ(cudaFree(cnt), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the CUDA context must stay usable";
  }
  if (::testing::Test::HasFatalFailure()) return;
  VnodeTeam v(2, 2);
  ASSERT_TRUE(v.team.ok) << v.team.why;
  TeamDriver d(v.team);
  FfnProblem p(fc);
  p.algo = ncclFusedFused;
  DrawOpts o;
  ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xab5, o), "");
  const uint64_t before = mk::fused::moeXnodeLaunches();
  const std::string e = runChecked<FfnProblem>(d, {&p});
  if (!e.empty()) d.abortAll();
  EXPECT_EQ(e, "") << "a new pair after the abort";
  EXPECT_EQ(mk::fused::moeXnodeLaunches() - before, 2u);
}

}  // namespace
