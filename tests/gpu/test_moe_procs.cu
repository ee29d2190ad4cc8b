// ncclMoeDispatchGemm and ncclMoeDispatchFfnCombine (include/mkernel/fused.h) on the layouts
// other than "every rank in one process on one GPU": ranks that are PROCESSES sharing GPU 0 and
// ranks on virtual nodes. The problems and host references are the thread tests' (MoeProblem,
// FfnProblem in test_moe_util.h): every rank's counts, offsets, rowSource, rowWeight, received
// rows and every element of y (dispatch), every element of y (whole layer).
//   MoeProcs.TwoProcesses / FourProcesses   this binary re-spawned once per rank (only
//       MoeProcsChild.Run, which skips elsewhere; fork after CUDA initialisation is not
//       allowed), ncclCommInitRank from a unique id the parent hands over. Each process draws
//       every rank's inputs from the shared seed (the same draws everywhere) and checks its own
//       rank. Per case of each call: two problems called back to back on the stream (no host
//       wait between), then the first again with new routing in the same buffers. Routing
//       uniform, one hot expert, odd experts empty, -1 slots (FFN: tokens with every slot -1, a
//       rank without tokens; every slot of a token on one rank), T not a multiple of 128,
//       E/n 1..4, k 1..4, 8 and 16, bf16/fp16 in, every
//       out type, NK and KN weights. Every rank passes the same maxRows (the AllToAll path needs
//       it, fused.h): the first case a bound any routing fits, the others the largest need plus
//       random slack, the third call of each case exactly the largest need.
//   The cases plan passes ncclFusedAuto, which runs the fused layer where the weights are
//   [N,K] (counted as below) and the AllToAll path for everything else.
//   MoeProcsFused.TwoAndFourProcesses       the same cases with ncclFusedFused: the fused
//       kernels of the processes layout (rows in the ranks' windows; the layer's cases with
//       [N,K] weights, the others run the AllToAll path), and the fused launches counted.
//   MoeProcsFused.GraphThreeProcesses       both fused kernels captured and replayed.
//   MoeProcs.EightProcessesFused            the fused plan with 8 processes (session 31; not
//       yet run on a GPU when written).
//   MoeVnodes.*, MoeProcsGraph.Vnodes2x2     the same cases on virtual nodes: test_moe_vnodes.cu.
//   MoeProcsOverflow.ThreeProcesses         rank 1 needs the most rows and the shared maxRows is
//       one row short of its need, once per call (two comms): its comm reports ncclInvalidUsage
//       naming the call and the rows; the other processes' results are complete and correct
//       (FFN: slots routed to rank 1's experts contribute nothing), their comms report nothing.
//   MoeProcsMismatch.ThreeProcesses         the first fused layer call with rank 1's maxRows
//       below the others': refused at once on every rank (ncclInvalidArgument naming maxRows, y
//       untouched, nothing launched), then the agreeing call runs and is checked.
//   MoeProcsGraph.ThreeProcesses            each call captured once per rank (after an eager
//       call) and replayed with new routing (FFN: new tokens and weights too), every replay
//       checked.
// The cases, the drivers and the graph plan live in test_moe_cases.h (shared with the vnodes).
// Without CUDA MPS the processes' kernels are time-sliced: correct, only slower
// (scripts/gpu_check.sh's procs stage starts MPS). Waits on the device end after 20 s.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "fused/ops/moe/moe.h"  // moeFusedLaunches
#include "common/test_util.h"
#include "gpu/test_devcomm_util.h"
#include "gpu/test_fused_util.cuh"
#include "gpu/test_moe_cases.h"
#include "gpu/test_moe_util.h"
#include "gpu/test_proc_util.h"
#include "gpu/test_thread_team.h"
#include "mkernel/fused.h"

namespace {

using namespace moecases;  // NOLINT: the drivers, cases and plans
using gputest::Clock;
using gputest::since;

// ---- processes: one child, one rank ---------------------------------------------------------
constexpr int kTight = 1;  // the overflow plan's rank whose bound is one row short

// The mismatch plan: the comm's first fused layer call, with rank 1 passing a maxRows 128 rows
// below the others' (both above every rank's need, so the buffers stay valid), must be refused
// on every rank with ncclInvalidArgument naming maxRows, well before the device (20 s) and
// bootstrap (60 s) timeouts, and leave y as it was; the same call with agreeing bounds then
// runs the fused layer and is checked as usual.
std::string mismatchPlan(ProcDriver& d, uint64_t seed) {
  const int n = d.n, me = d.me;
  FfnCase c = ffnCases(n)[0];
  if (c.layout != kNK) return "the plan needs an [N,K] case (the fused layer)";
  FfnProblem a(c);
  a.algo = ncclFusedFused;
  DrawOpts o;
  auto draw = [&](uint64_t sd, size_t rows) {
    o.fixedRows = rows;
    return a.draw(sd, o);
  };
  const size_t any = anyRouting(n, c.maxT, c.k, c.epr);
  std::string e = drawShared<FfnProblem>(a, n, any, seed, 256, draw);
  if (!e.empty()) return e;
  Rank& mine = a.rank(me);
  const size_t bound = mine.maxRows;
  std::vector<uint8_t> yBefore, yAfter;
  const size_t yBytes = (size_t)mine.T * c.H * fusedtest::esOf(c.out);
  e = d2h(&yBefore, mine.dy.p, yBytes);
  if (!e.empty()) return e;
  if (me == 1) mine.maxRows = bound - 128;
  const uint64_t ffnBefore = mk::fused::moeFfnFusedLaunches();
  const auto t0 = Clock::now();
  const ncclResult_t res = a.call(me, d.comm(me), d.stream(me));
  const double took = since(t0);
  mine.maxRows = bound;
  const std::string msg = ncclGetLastError(d.comm(me));
  if (res != ncclInvalidArgument)
    return std::string("the mismatched call returned ") + ncclGetErrorString(res) + ": " + msg;
  if (msg.find("maxRows") == std::string::npos) return "the refusal does not name maxRows: " + msg;
  if (took > 10) return "the refusal took " + std::to_string(took) + " s";
  if (cudaStreamSynchronize(d.stream(me)) != cudaSuccess) return "cudaStreamSynchronize failed";
  e = d2h(&yAfter, mine.dy.p, yBytes);
  if (!e.empty()) return e;
  if (yAfter != yBefore) return "the refused call wrote y";
  if (mk::fused::moeFfnFusedLaunches() != ffnBefore) return "the refused call launched";
  e = runChecked<FfnProblem>(d, {&a});
  if (e.empty() && mk::fused::moeFfnFusedLaunches() != ffnBefore + 1)
    e = "the agreeing call did not run the fused layer";
  return e;
}

// A barrier that needs no comm (the overflowing rank's comm has failed): every process writes
// dir/<tag>.<rank> and waits, bounded, for its peers' files.
std::string fileBarrier(const std::string& dir, const std::string& tag, int n, int me) {
  gputest::writeNumber(dir + "/" + tag + "." + std::to_string(me), 1);
  const auto t0 = Clock::now();
  for (;;) {
    int seen = 0;
    int64_t v = 0;
    for (int q = 0; q < n; ++q)
      seen += gputest::readNumber(dir + "/" + tag + "." + std::to_string(q), &v);
    if (seen == n) return "";
    if (since(t0) > 90) return "file barrier " + tag + ": peers missing after 90 s";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// One call with rank kTight one row short, on a fresh comm. check(p) checks this rank's
// outputs; `op` is the name the error must carry.
template <class P>
std::string overflowOnce(int n, int me, const ncclUniqueId& id, cudaStream_t s,
                         const std::string& dir, const char* op, P& p,
                         const std::function<std::string(P&)>& check) {
  ncclComm_t comm = nullptr;
  const ncclResult_t ir = ncclCommInitRank(&comm, n, id, me);
  if (ir != ncclSuccess) return std::string("ncclCommInitRank: ") + ncclGetLastError(nullptr);
  const ncclResult_t res = p.call(me, comm, s);
  std::string e;
  if (res != ncclSuccess && !(me == kTight && res == ncclInvalidUsage))
    e = std::string("call returned ") + ncclGetErrorString(res) + ": " + ncclGetLastError(comm);
  if (e.empty() && !gputest::streamCompleted(s, 60)) e = "stream failed or busy after 60 s";
  ncclResult_t a = ncclSuccess;
  // The host poller may report after the stream is done: the overflowing rank waits for it.
  if (e.empty() && me == kTight &&
      gputest::pollAsyncError(comm, Clock::now(), 10, &a) != ncclSuccess)
    e = "ncclCommGetAsyncError failed";
  const std::string b1 = fileBarrier(dir, std::string(op) + "_called", n, me);
  // The peers: after every process's call (nothing may reach them later either).
  if (e.empty() && me != kTight && ncclCommGetAsyncError(comm, &a) != ncclSuccess)
    e = "ncclCommGetAsyncError failed";
  const std::string msg = ncclGetLastError(comm);
  if (e.empty() && me == kTight) {
    if (a != ncclInvalidUsage)
      e = "async error " + std::string(ncclGetErrorString(a)) + ", expected ncclInvalidUsage";
    else if (msg.find(op) == std::string::npos || msg.find("rows") == std::string::npos)
      e = "the error does not name " + std::string(op) + " and the rows: " + msg;
  } else if (e.empty() && a != ncclSuccess) {
    e = "a peer of the overflowing rank reports " + std::string(ncclGetErrorString(a)) + ": " + msg;
  }
  if (e.empty()) e = check(p);
  // Every process done with its checks before any comm goes (a closing peer could disturb
  // a comm still being queried).
  const std::string b2 = fileBarrier(dir, std::string(op) + "_checked", n, me);
  ncclCommAbort(comm);
  if (e.empty()) e = b1.empty() ? b2 : b1;
  return e;
}

int overflowPlan(int n, int me, uint64_t seed, const ncclUniqueId ids[2], cudaStream_t s,
                 const std::string& who) {
  const char* dir = getenv("MKTEST_MOE_DIR");
  if (!dir) {
    fprintf(stderr, "%s MKTEST_MOE_DIR not set\n", who.c_str());
    return 1;
  }
  int failures = 0;
  const MoeCase mc{n, 2, 2, 64, 64, kBf, kF32, kNK, kHotExpert, 120};
  MoeProblem mp(mc);
  std::string e = drawTight<MoeProblem>(
      mp, n, kTight, anyRouting(n, mc.maxT, mc.k, mc.epr), seed,
      [&](uint64_t sd, size_t rows, int tight) { return mp.draw(sd, true, 0, tight, rows); });
  if (e.empty())
    e = overflowOnce<MoeProblem>(
        n, me, ids[0], s, dir, "MoeDispatchGemm", mp, [&](MoeProblem& p) -> std::string {
          if (me != kTight) return p.check(me);
          std::vector<int32_t> cnt(2, -7);
          MOE_CUDA(cudaMemcpy(cnt.data(), p.rank(me).dcnt, 8, cudaMemcpyDeviceToHost));
          if (cnt[0] != 0 || cnt[1] != 0) return "the overflowing rank received rows";
          return "";
        });
  if (!e.empty()) {
    fprintf(stderr, "%s FAIL ncclMoeDispatchGemm overflow: %s\n", who.c_str(), e.c_str());
    failures++;
  }
  const FfnCase fc{n, 2, 2, 64, 32, kBf, kF32, kNK, kHotExpert, 37, 120};
  FfnProblem fp(fc);
  e = drawTight<FfnProblem>(fp, n, kTight, anyRouting(n, fc.maxT, fc.k, fc.epr), seed ^ 0xff,
                            [&](uint64_t sd, size_t rows, int tight) {
                              DrawOpts o;
                              o.fixedRows = rows;
                              o.tight = tight;
                              return fp.draw(sd, o);
                            });
  if (e.empty())
    e = overflowOnce<FfnProblem>(n, me, ids[1], s, dir, "MoeDispatchFfnCombine", fp,
                                 [&](FfnProblem& p) { return p.check(me, kTight, me == kTight); });
  if (!e.empty()) {
    fprintf(stderr, "%s FAIL ncclMoeDispatchFfnCombine overflow: %s\n", who.c_str(), e.c_str());
    failures++;
  }
  return failures;
}

// Body of MoeProcsChild.Run: "plan n rank seed" in MKTEST_MOE_CHILD, the unique id(s) in
// MKTEST_MOE_ID (and MKTEST_MOE_ID2). Returns the number of failures.
int childMain(const char* spec) {
  char plan[32] = {};
  int n = 0, me = 0;
  uint64_t seed = 0;
  if (!gputest::parseChildSpec(spec, "[MoeProcs] bad MKTEST_MOE_CHILD", plan, &n, &me, &seed))
    return 1;
  const std::string pl = plan;
  const std::string who =
      "[MoeProcs " + pl + " n=" + std::to_string(n) + " rank " + std::to_string(me) + "]";
  ncclUniqueId ids[2];
  if (!gputest::hexToId(getenv("MKTEST_MOE_ID"), &ids[0]) ||
      (pl == "overflow" && !gputest::hexToId(getenv("MKTEST_MOE_ID2"), &ids[1]))) {
    fprintf(stderr, "%s bad MKTEST_MOE_ID\n", who.c_str());
    return 1;
  }
  cudaStream_t stream = nullptr;
  if (cudaSetDevice(0) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    fprintf(stderr, "%s cudaSetDevice/cudaStreamCreate failed\n", who.c_str());
    return 1;
  }
  const auto t0 = Clock::now();
  int failures = 0;
  if (pl == "overflow") {
    failures = overflowPlan(n, me, seed, ids, stream, who);
  } else {
    ncclComm_t comm = nullptr;
    const ncclResult_t ir = ncclCommInitRank(&comm, n, ids[0], me);
    if (ir != ncclSuccess) {
      fprintf(stderr, "%s ncclCommInitRank: %s: %s\n", who.c_str(), ncclGetErrorString(ir),
              ncclGetLastError(nullptr));
      return 1;
    }
    ProcDriver d(n, me, comm, stream);
    auto log = [&](const std::string& line) {
      if (me == 0) fprintf(stderr, "%s %s\n", who.c_str(), line.c_str());
    };
    const uint64_t dispBefore = mk::fused::moeFusedLaunches();
    const uint64_t ffnBefore = mk::fused::moeFfnFusedLaunches();
    std::string e = pl == "cases"        ? runCases(d, seed, log)
                    : pl == "graph"      ? runGraphs(d, seed)
                    : pl == "fused"      ? runCases(d, seed, log, nullptr, ncclFusedFused)
                    : pl == "fusedgraph" ? runGraphs(d, seed, ncclFusedFused)
                    : pl == "mismatch"   ? mismatchPlan(d, seed)
                                         : "unknown plan " + pl;
    // The fused plans' calls really ran the fused kernels (processes layout): 3 calls a case
    // (the layer's with the weights in the [N,K] layout only: the others run the AllToAll
    // path); the graph plan's eager call and capture of each (a captured launch counts once).
    // The cases plan passes ncclFusedAuto, which takes the fused layer here too (dispatch +
    // GEMM stays on the AllToAll path).
    uint64_t dispWant = 0, ffnWant = 0;
    if (pl == "fused" || pl == "cases") {
      dispWant = pl == "fused" ? 3 * dispatchCases(n).size() : 0;
      for (const FfnCase& c : ffnCases(n)) ffnWant += c.layout == kNK ? 3 : 0;
    } else if (pl == "fusedgraph") {
      dispWant = ffnWant = 2;
    } else if (pl == "mismatch") {
      ffnWant = 1;  // the agreeing call (the refused one launched nothing)
    }
    const uint64_t dispGot = mk::fused::moeFusedLaunches() - dispBefore;
    const uint64_t ffnGot = mk::fused::moeFfnFusedLaunches() - ffnBefore;
    if (e.empty() && (dispGot != dispWant || ffnGot != ffnWant))
      e = "fused kernels launched: " + std::to_string(dispGot) + " dispatch + GEMM, " +
          std::to_string(ffnGot) + " layer; want " + std::to_string(dispWant) + ", " +
          std::to_string(ffnWant);
    if (e.empty()) e = d.barrier();  // nobody tears down while a peer may still finish a call
    if (!e.empty()) {
      fprintf(stderr, "%s FAIL %s\n", who.c_str(), e.c_str());
      failures++;
      d.abortAll();
    }
    if (d.healthy()) ncclCommDestroy(d.healthy());
  }
  cudaStreamDestroy(stream);
  fprintf(stderr, "%s %s, %.1f s\n", who.c_str(), failures ? "FAILED" : "passed", since(t0));
  return failures;
}

TEST(MoeProcsChild, Run) {
  const char* spec = getenv("MKTEST_MOE_CHILD");
  if (!spec) GTEST_SKIP() << "helper of the MoeProcs tests (runs only in their children)";
  EXPECT_EQ(childMain(spec), 0) << "the failure is named above";
}

// ---- parents ----------------------------------------------------------------------------------
// n children running `plan`; "" when all passed. The seed is printed.
std::string spawnPlan(const char* plan, int n, const std::string& dir = "") {
  const unsigned long long seed = mktest::testSeed() ^ (0x30e5ull * n);
  printf("[MoeProcs] %s, %d processes, seed %llu (MKTEST_SEED=%llu repeats it)\n", plan, n, seed,
         (unsigned long long)mktest::testSeed());
  const int comms = std::string(plan) == "overflow" ? 2 : 1;
  ncclUniqueId ids[2];
  for (int i = 0; i < comms; ++i)
    if (ncclGetUniqueId(&ids[i]) != ncclSuccess)
      return std::string("ncclGetUniqueId: ") + ncclGetLastError(nullptr);
  const auto t0 = Clock::now();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    char spec[160];
    snprintf(spec, sizeof(spec), "MKTEST_MOE_CHILD=%s %d %d %llu", plan, n, r, seed);
    std::vector<std::string> env{spec, "MKTEST_MOE_ID=" + gputest::idToHex(ids[0])};
    if (comms == 2) env.push_back("MKTEST_MOE_ID2=" + gputest::idToHex(ids[1]));
    if (!dir.empty()) env.push_back("MKTEST_MOE_DIR=" + dir);
    pids.push_back(mktest::spawnSelf("MoeProcsChild.Run", env));
  }
  std::string err;
  std::vector<pid_t> started;
  for (pid_t p : pids) {
    if (p <= 0) err = "fork failed (its peers fail at their bootstrap); ";
    if (p > 0) started.push_back(p);
  }
  err += mktest::waitChildren(started, 240);
  mk::bootstrapRootsWait(5000);
  printf("[MoeProcs] %s, %d processes: %.1f s\n", plan, n, since(t0));
  return err;
}

class MoeProcsEnv {  // children inherit it
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
  mktest::ScopedEnv boot_{"MKERNEL_BOOTSTRAP_TIMEOUT_S", "60"};
};

TEST(MoeProcs, TwoProcesses) {
  MKTEST_REQUIRE_GPU();
  MoeProcsEnv env;
  EXPECT_EQ(spawnPlan("cases", 2), "") << "the failing case is named above";
}

TEST(MoeProcs, FourProcesses) {
  MKTEST_REQUIRE_GPU();
  MoeProcsEnv env;
  EXPECT_EQ(spawnPlan("cases", 4), "") << "the failing case is named above";
}

// 8 processes (issue 13's largest rank count), the fused plan: both fused kernels on 16 SMs a
// rank, the layer's [K,N] cases on the AllToAll path.
TEST(MoeProcs, EightProcessesFused) {
  MKTEST_REQUIRE_GPU();
  MoeProcsEnv env;
  EXPECT_EQ(spawnPlan("fused", 8), "") << "the failing case is named above";
}

// Both calls with ncclFusedFused on the processes layout (session 31): the fused kernels, rows
// landing in (and the layer's expert outputs read from) the ranks' windows, every output
// checked as above.
TEST(MoeProcsFused, TwoAndFourProcesses) {
  MKTEST_REQUIRE_GPU();
  MoeProcsEnv env;
  for (int n : {2, 4}) EXPECT_EQ(spawnPlan("fused", n), "") << "the failing case is named above";
}

TEST(MoeProcsFused, GraphThreeProcesses) {
  MKTEST_REQUIRE_GPU();
  MoeProcsEnv env;
  EXPECT_EQ(spawnPlan("fusedgraph", 3), "") << "the failure is named above";
}

TEST(MoeProcsMismatch, ThreeProcesses) {
  MKTEST_REQUIRE_GPU();
  MoeProcsEnv env;
  EXPECT_EQ(spawnPlan("mismatch", 3), "") << "the failure is named above";
}

TEST(MoeProcsOverflow, ThreeProcesses) {
  MKTEST_REQUIRE_GPU();
  // A peer left waiting fails fast; the overflowing rank's error is recorded by its last kernel.
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "10000");
  mktest::ScopedEnv boot("MKERNEL_BOOTSTRAP_TIMEOUT_S", "60");
  char tmpl[] = "/tmp/mk_moeovf_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, err = spawnPlan("overflow", 3, dir);
  for (const char* op : {"MoeDispatchGemm", "MoeDispatchFfnCombine"})
    for (const char* step : {"_called.", "_checked."})
      for (int r = 0; r < 3; ++r)
        for (const char* tail : {"", ".tmp"})
          unlink((dir + "/" + op + step + std::to_string(r) + tail).c_str());
  rmdir(dir.c_str());
  EXPECT_EQ(err, "") << "the failure is named above";
}

TEST(MoeProcsGraph, ThreeProcesses) {
  MKTEST_REQUIRE_GPU();
  MoeProcsEnv env;
  EXPECT_EQ(spawnPlan("graph", 3), "") << "the failure is named above";
}

}  // namespace
