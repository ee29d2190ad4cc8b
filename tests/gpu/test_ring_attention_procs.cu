// ncclRingAttention (include/mkernel/fused.h) with ranks that are PROCESSES sharing GPU 0 and
// with comms over virtual nodes; every element of out and lse of every rank against the host
// reference of test_attn_ref.h (threads, one rank, graphs, abort: test_ring_attention.cu).
//   RingAttnProcs.EveryElement/n2|n4|n4copy|n4mixed|n4orders|n3staged|n4claim
//       this binary re-spawned once per rank (only RingAttnProcsChild.Run, which skips
//       elsewhere; fork after CUDA initialisation is not allowed), ncclCommInitRank from a
//       unique id the parent hands over.
//       Each process regenerates every rank's inputs from the shared seed, so it computes its own
//       rank's reference, and checks its own outputs. The cases cycle through the algos: the fused
//       ones run the fused kernel's processes layout (fused/core/proc_windows.h: each rank
//       stages its k/v slices in a window its peers map). Without CUDA MPS the processes' kernels
//       are time-sliced: correct, only slower (the AllGather's waits are bounded by 20 s).
//       Each rank runs the fused kernel's direct reads (MKERNEL_RING_DIRECT=2, the default: the
//       attention reads the peers' windows in place, in ring order; 1: in rank order) or its
//       copies (0): every rank one way (n2, n4, n4copy), odd ranks copying (n4mixed: the modes
//       interoperate) or odd ranks in rank order (n4orders); n3staged: every rank with
//       MKERNEL_RING_SEQ_DIRECT=1, so the auto and sequential cases read in place too, after a
//       one-thread wait kernel (the back-to-back calls below mix them with fused calls, which
//       use the same data region); n4claim: as n3staged with 4 ranks, the even ones claiming
//       their tiles from a counter (MKERNEL_RING_TILE_CLAIM=1, the default, which every other
//       case runs), the odd ones on the static schedule (0), fused and staged kernels alike.
//       Each child checks that its fused launches read in place, or
//       copied, as it was told (not which order it walked), and that its sequential calls ran
//       the staged reads exactly when told to, and that its ring kernels claimed their tiles
//       exactly when told to (MKERNEL_RING_TILE_CLAIM).
//   RingAttnProcsAbort.DirectPeerNeverCalls  3 processes with direct reads, the last never
//       calls: the others' errors name it within the 5 s deadline, aborts return promptly.
//   RingAttnVnodes.TwoByTwo           4 ranks on 2 virtual nodes (MKERNEL_EMULATE_NODES,
//       socket backend on loopback), one thread issuing every rank's call in turn.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "fused/ops/ring_attn/ring_attn.h"  // ringAttnFusedLaunches
#include "transport/peer_mem_win.h"         // peerMemWinCount: the fused cases' windows exist
#include "common/test_util.h"
#include "gpu/test_attn_ref.h"
#include "gpu/test_devcomm_util.h"
#include "gpu/test_fused_util.cuh"
#include "gpu/test_proc_util.h"

namespace {

using attntest::Problem;
using attntest::Shape;
using attntest::Stats;
using gputest::Clock;
using gputest::since;

// The cases of a comm of n ranks (the same list in every process): causal or not, both
// layouts, GQA 1/4/8, head dims 64/128, both types, lse NULL once, seqLocal not a tile
// multiple but one.
std::vector<Shape> casesFor(int n) {
  std::vector<Shape> cs;
  struct Row {
    bool causal;
    int layout, g, D, S;
    ncclDataType_t in;
    bool lse;
  };
  const Row rows[] = {
      {true, ncclRingAttnZigzag, 4, 128, 150, ncclBfloat16, true},
      {false, ncclRingAttnContiguous, 1, 64, 77, ncclFloat16, true},
      {true, ncclRingAttnContiguous, 8, 64, 128, ncclFloat16, true},
      {false, ncclRingAttnZigzag, 4, 128, 94, ncclBfloat16, false},
      {true, ncclRingAttnZigzag, 1, 64, 66, ncclFloat16, true},
  };
  int i = 0;
  for (const Row& w : rows) {
    Shape c;
    c.n = n;
    c.causal = w.causal;
    c.layout = w.layout;
    c.Hkv = 2;
    c.Hq = w.g * c.Hkv;
    c.D = w.D;
    c.S = w.S;
    c.B = 1 + i % 2;
    c.in = w.in;
    c.lse = w.lse;
    c.algo = i++ % 3;
    attntest::shrink(&c, 1.2e9);
    cs.push_back(c);
  }
  return cs;
}

// A small non-causal fused shape of n ranks (head dim 64, GQA 2).
Shape smallFused(int n) {
  Shape a;
  a.n = n;
  a.Hkv = 2;
  a.Hq = 4;
  a.D = 64;
  a.S = 96;
  a.in = ncclBfloat16;
  a.algo = ncclFusedFused;
  return a;
}

// One call of shape a eager first (its state exists), then captured and replayed 3 times with
// new inputs. Returns "" or the first failure.
std::string graphReplays(const Shape& a, int me, uint64_t seed, ncclComm_t comm,
                         cudaStream_t stream) {
  Problem g(a, me);
  std::string e = g.draw(seed);
  if (e.empty() && g.call(me, comm, stream) != ncclSuccess) e = ncclGetLastError(comm);
  if (e.empty()) e = fusedtest::waitRank(me, comm, stream, 120);
  if (e.empty()) e = g.check(me);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (e.empty()) {
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
      e = "begin capture failed";
    if (e.empty() && g.call(me, comm, stream) != ncclSuccess) e = ncclGetLastError(comm);
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (e.empty() && (ended != cudaSuccess || graph == nullptr)) e = "end capture failed";
    if (e.empty() && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
      e = "graph instantiation failed";
  }
  for (int rep = 0; rep < 3 && e.empty(); ++rep) {
    e = g.draw(seed + 10 + rep);
    if (e.empty() && cudaGraphLaunch(exec, stream) != cudaSuccess) e = "graph launch failed";
    if (e.empty()) e = fusedtest::waitRank(me, comm, stream, 120);
    if (e.empty()) e = g.check(me);
    if (!e.empty()) e = "graph replay " + std::to_string(rep) + ": " + e;
  }
  // Replays and eager calls back to back with no host wait: each call's waits for the readers
  // of its data region must hold whichever kind came before (the replay's were fixed at
  // capture). The last replay's output and both eager calls' are checked.
  if (e.empty()) {
    Problem h1(a, me), h2(a, me);
    e = h1.draw(seed + 20);
    if (e.empty()) e = h2.draw(seed + 21);
    if (e.empty()) e = g.draw(seed + 22);  // inputs first: their uploads synchronise
    Problem* eager[2] = {&h1, &h2};
    for (int i = 0; i < 2 && e.empty(); ++i) {
      if (cudaGraphLaunch(exec, stream) != cudaSuccess) {
        e = "graph launch failed";
      } else if (eager[i]->call(me, comm, stream) != ncclSuccess) {
        e = ncclGetLastError(comm);
      }
    }
    if (e.empty()) e = fusedtest::waitRank(me, comm, stream, 120);
    if (e.empty()) e = g.check(me);
    if (e.empty()) e = h1.check(me);
    if (e.empty()) e = h2.check(me);
    if (!e.empty()) e = "replays between eager calls: " + e;
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  return e;
}

// The fused kernel's processes layout beyond one call at a time (every process runs the same
// list): 12 calls of two shapes back to back with no host wait (a rank's next call stages its
// new slices only once its peers have read the previous ones), the algos cycling through
// fused, auto and sequential (with MKERNEL_RING_SEQ_DIRECT=1 the last two read in place too, so
// the two paths' uses of the data region and their waits mix), then a fused and an auto call
// each captured after an eager one and replayed with new inputs, then replayed between eager
// calls with no host wait. Returns "" or the first failure.
std::string processesExtra(int n, int me, uint64_t seed, ncclComm_t comm, cudaStream_t stream) {
  const Shape a = smallFused(n);
  Shape b = a;
  b.S = 160;
  b.D = 128;
  b.causal = true;
  b.layout = ncclRingAttnZigzag;
  static const int kAlgos[] = {ncclFusedFused, ncclFusedAuto, ncclFusedSequential};
  std::vector<std::unique_ptr<Problem>> ps;
  // Shapes in pairs (a a b b ...) against the algos' cycle of 3: every algo meets both shapes
  // and both shape changes.
  for (int i = 0; i < 12; ++i) {
    Shape c = i % 4 < 2 ? a : b;
    c.algo = kAlgos[i % 3];
    ps.emplace_back(new Problem(c, me));
  }
  // Inputs first (their uploads synchronise), then the calls with nothing in between.
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::string e = ps[i]->draw(seed + 700 + i);
    if (!e.empty()) return "back-to-back inputs " + std::to_string(i) + ": " + e;
  }
  for (size_t i = 0; i < ps.size(); ++i)
    if (ps[i]->call(me, comm, stream) != ncclSuccess)
      return "back-to-back call " + std::to_string(i) + ": " + ncclGetLastError(comm);
  std::string e = fusedtest::waitRank(me, comm, stream, 120);
  for (size_t i = 0; i < ps.size() && e.empty(); ++i) {
    e = ps[i]->check(me);
    if (!e.empty()) e = "back-to-back call " + std::to_string(i) + ": " + e;
  }
  if (!e.empty()) return e;
  for (int algo : {ncclFusedFused, ncclFusedAuto}) {
    Shape ga = a;
    ga.algo = algo;
    e = graphReplays(ga, me, seed + 720 + 20 * algo, comm, stream);
    if (!e.empty()) return (algo == ncclFusedAuto ? "auto " : "fused ") + e;
  }
  return "";
}

// The absent plan: one fused call on every rank (checked; it creates the windows, whose
// creation is collective), then a second one with direct reads on every rank but the last,
// which never makes it. Each caller's call returns, its stream drains (the deadline is 5 s),
// its comm reports an asynchronous error naming the last rank, ncclCommAbort returns within
// 5 s and the GPU still runs work. The last rank keeps its comm until its peers are done,
// then aborts. Returns "" or the failure; *comm is aborted (nullptr) on return.
std::string absentPlan(int n, int me, uint64_t seed, ncclComm_t* comm, cudaStream_t stream) {
  const int missing = n - 1;
  Problem p(smallFused(n), me);
  std::string e = p.draw(seed + 900);
  if (e.empty() && p.call(me, *comm, stream) != ncclSuccess)
    e = std::string("the first call: ") + ncclGetLastError(*comm);
  if (e.empty()) e = fusedtest::waitRank(me, *comm, stream, 60);
  if (e.empty()) e = p.check(me);
  if (e.empty()) e = p.draw(seed + 901);
  if (!e.empty() || me == missing) {
    if (e.empty()) std::this_thread::sleep_for(std::chrono::seconds(25));
    ncclCommAbort(*comm);
    *comm = nullptr;
    return e.empty() ? "" : "the first call: " + e;
  }
  const uint64_t directBefore = mk::fused::ringAttnFusedLaunches(mk::fused::kRingLayoutDirect);
  const auto t0 = Clock::now();
  const ncclResult_t res = p.call(me, *comm, stream);
  const double callS = since(t0);
  ncclResult_t async = ncclSuccess;
  if (res != ncclSuccess)
    e = std::string("the call returned ") + ncclGetErrorString(res) + ": " +
        ncclGetLastError(*comm);
  else if (mk::fused::ringAttnFusedLaunches(mk::fused::kRingLayoutDirect) != directBefore + 1)
    e = "the call did not run the direct reads";
  else if (callS > 10)
    e = "the call waited " + std::to_string(callS) + " s on the host";
  else if (!gputest::streamCompleted(stream, 15))
    e = "the stream did not drain within 15 s of the call (the deadline is 5 s)";
  else if (gputest::pollAsyncError(*comm, t0, 15, &async) != ncclSuccess || async == ncclSuccess ||
           async == ncclInProgress)
    e = std::string("no asynchronous error after the deadline (") + ncclGetErrorString(async) + ")";
  const std::string msg = ncclGetLastError(*comm);
  if (e.empty() && msg.find("rank " + std::to_string(missing)) == std::string::npos)
    e = "the error does not name rank " + std::to_string(missing) + ": " + msg;
  const auto a0 = Clock::now();
  ncclCommAbort(*comm);
  *comm = nullptr;
  const double abortS = since(a0);
  if (e.empty() && abortS > 5) e = "ncclCommAbort took " + std::to_string(abortS) + " s";
  void* probe = nullptr;  // the GPU still runs work
  if (e.empty() && (cudaMalloc(&probe, 1 << 20) != cudaSuccess ||
                    cudaMemsetAsync(probe, 1, 1 << 20, stream) != cudaSuccess ||
                    cudaStreamSynchronize(stream) != cudaSuccess))
    e = "the GPU does not run work after the abort";
  if (probe != nullptr) cudaFree(probe);
  if (e.empty())
    fprintf(stderr, "[RingAttnProcs absent rank %d] call %.3f s, error: %s; abort %.3f s\n", me,
            callS, msg.c_str(), abortS);
  return e;
}

// ---- processes: one child, one rank -------------------------------------------------------
int childMain(const char* spec) {
  char plan[32] = {};
  int n = 0, me = 0;
  uint64_t seed = 0;
  if (!gputest::parseChildSpec(spec, "[RingAttnProcs] bad MKTEST_RA_CHILD", plan, &n, &me, &seed))
    return 1;
  const std::string who =
      "[RingAttnProcs n=" + std::to_string(n) + " rank " + std::to_string(me) + "]";
  ncclUniqueId id;
  if (!gputest::hexToId(getenv("MKTEST_RA_ID"), &id)) {
    fprintf(stderr, "%s bad MKTEST_RA_ID\n", who.c_str());
    return 1;
  }
  cudaStream_t stream = nullptr;
  if (cudaSetDevice(0) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    fprintf(stderr, "%s cudaSetDevice/cudaStreamCreate failed\n", who.c_str());
    return 1;
  }
  ncclComm_t comm = nullptr;
  const ncclResult_t ir = ncclCommInitRank(&comm, n, id, me);
  if (ir != ncclSuccess) {
    fprintf(stderr, "%s ncclCommInitRank: %s: %s\n", who.c_str(), ncclGetErrorString(ir),
            ncclGetLastError(nullptr));
    return 1;
  }
  const auto t0 = Clock::now();
  if (std::string(plan) == "absent") {
    const std::string e = absentPlan(n, me, seed, &comm, stream);
    if (!e.empty()) fprintf(stderr, "%s FAIL absent peer: %s\n", who.c_str(), e.c_str());
    if (comm) ncclCommAbort(comm);
    cudaStreamDestroy(stream);
    fprintf(stderr, "%s absent plan %s, %.1f s\n", who.c_str(), e.empty() ? "passed" : "FAILED",
            since(t0));
    return e.empty() ? 0 : 1;
  }
  int failures = 0, done = 0;
  bool broken = false;
  const std::vector<Shape> cases = casesFor(n);
  for (size_t i = 0; i < cases.size() && !broken; ++i) {
    Problem p(cases[i], me);
    std::string e = p.draw(seed + i);
    if (e.empty()) {
      const ncclResult_t r = p.call(me, comm, stream);
      if (r != ncclSuccess)
        e = std::string("ncclRingAttention returned ") + ncclGetErrorString(r) + ": " +
            ncclGetLastError(comm);
    }
    if (e.empty()) e = fusedtest::waitRank(me, comm, stream, 120);
    Stats st;
    if (e.empty()) e = p.check(me, &st);
    done++;
    if (e.empty()) {
      fprintf(stderr, "%s %s: %s\n", who.c_str(), attntest::name(cases[i]).c_str(),
              st.str().c_str());
      continue;
    }
    fprintf(stderr, "%s FAIL %s: %s\n", who.c_str(), attntest::name(cases[i]).c_str(), e.c_str());
    failures++;
    broken = true;        // the ranks no longer agree on the call sequence
    ncclCommAbort(comm);  // before p's buffers are freed: a kernel may wait for a peer
    comm = nullptr;
  }
  if (!broken && n >= 2) {
    const std::string e = processesExtra(n, me, seed, comm, stream);
    done++;
    if (!e.empty()) {
      fprintf(stderr, "%s FAIL processes layout: %s\n", who.c_str(), e.c_str());
      failures++;
      broken = true;
      ncclCommAbort(comm);
      comm = nullptr;
    }
  }
  // The fused cases ran the processes layout, not the sequential fallback: its control block
  // and data region are two windows of the comm.
  if (!broken && n >= 2 && mk::peerMemWinCount(comm) < 2) {
    fprintf(stderr, "%s FAIL the fused cases made no windows (they ran the sequential path)\n",
            who.c_str());
    failures++;
  }
  // Every fused launch of this rank in the mode it was given (the parent sets the variable).
  const char* mode = getenv("MKERNEL_RING_DIRECT");
  const bool direct = !(mode != nullptr && strcmp(mode, "0") == 0);
  const uint64_t procs = mk::fused::ringAttnFusedLaunches(mk::fused::kRingLayoutProcs);
  const uint64_t directs = mk::fused::ringAttnFusedLaunches(mk::fused::kRingLayoutDirect);
  if (!broken && n >= 2 && (procs == 0 || directs != (direct ? procs : 0))) {
    fprintf(stderr, "%s FAIL %llu of %llu fused launches read in place; wanted %s\n", who.c_str(),
            (unsigned long long)directs, (unsigned long long)procs, direct ? "all" : "none");
    failures++;
  }
  // The sequential cases (auto, sequential) ran the staged direct reads exactly when told to.
  const char* seqMode = getenv("MKERNEL_RING_SEQ_DIRECT");
  const bool staged = seqMode != nullptr && strcmp(seqMode, "1") == 0;
  const uint64_t stagedRuns = mk::fused::ringAttnFusedLaunches(mk::fused::kRingLayoutStaged);
  if (!broken && n >= 2 && (stagedRuns > 0) != staged) {
    fprintf(stderr, "%s FAIL %llu sequential calls read in place; wanted %s\n", who.c_str(),
            (unsigned long long)stagedRuns, staged ? "some" : "none");
    failures++;
  }
  // Every ring kernel of this rank (fused or staged) on the schedule it was given.
  const char* claimMode = getenv("MKERNEL_RING_TILE_CLAIM");
  const bool claim = !(claimMode != nullptr && strcmp(claimMode, "0") == 0);
  const uint64_t claims = mk::fused::ringAttnFusedLaunches(mk::fused::kRingLayoutClaim);
  if (!broken && n >= 2 && claims != (claim ? procs + stagedRuns : 0)) {
    fprintf(stderr, "%s FAIL %llu of %llu ring kernels claimed their tiles; wanted %s\n",
            who.c_str(), (unsigned long long)claims, (unsigned long long)(procs + stagedRuns),
            claim ? "all" : "none");
    failures++;
  }
  // ...sized from the sequential path's budget (the whole GPU by default), not from a rank's
  // share (the grid itself is at most the attention's work units: 16 at these shapes, seen on
  // the H200 in session 35).
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int32_t grid = mk::fused::ringAttnLastStagedGrid();
  const int32_t budget = mk::fused::ringAttnLastStagedBudget();
  if (!broken && staged && (budget <= sms / n || grid < 1 || grid > budget)) {
    fprintf(stderr,
            "%s FAIL the staged kernel ran %d CTAs of a budget of %d (a rank's share is %d of %d "
            "SMs)\n",
            who.c_str(), grid, budget, sms / n, sms);
    failures++;
  }
  if (!broken) {  // nobody tears down while a peer may still finish its last call
    colltest::DevBuf b(16);
    std::string e;
    if (ncclAllReduce(b.base, b.base, 1, ncclInt32, ncclSum, comm, stream) != ncclSuccess)
      e = ncclGetLastError(comm);
    if (e.empty()) e = fusedtest::waitRank(me, comm, stream, 60);
    if (!e.empty()) {
      fprintf(stderr, "%s FAIL final barrier: %s\n", who.c_str(), e.c_str());
      failures++;
      broken = true;
    }
  }
  if (comm) broken ? ncclCommAbort(comm) : ncclCommDestroy(comm);
  cudaStreamDestroy(stream);
  fprintf(stderr, "%s %d of %zu cases run, %d failed, %.1f s\n", who.c_str(), done, cases.size(),
          failures, since(t0));
  return failures;
}

TEST(RingAttnProcsChild, Run) {
  const char* spec = getenv("MKTEST_RA_CHILD");
  if (!spec) GTEST_SKIP() << "helper of the RingAttnProcs tests (runs only in their children)";
  EXPECT_EQ(childMain(spec), 0) << "the failing case is named above";
}

// Ranks, and how they read their peers' slices: 0 all in place, 1 all by copies, 2 odd ranks
// by copies, 3 odd ranks in place in rank order (the others in ring order, the default), 4 all
// in place and the sequential cases too (staged, MKERNEL_RING_SEQ_DIRECT=1), 5 as 4 with the
// odd ranks' attention CTAs walking the static schedule (MKERNEL_RING_TILE_CLAIM=0) and the
// even ranks' claiming their tiles (the default; ranks may differ).
struct ProcsCase {
  int n, mode;
};

class RingAttnProcs : public ::testing::TestWithParam<ProcsCase> {};

TEST_P(RingAttnProcs, EveryElement) {
  MKTEST_REQUIRE_GPU();
  const int n = GetParam().n, mode = GetParam().mode;
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");  // children inherit it
  mktest::ScopedEnv boot("MKERNEL_BOOTSTRAP_TIMEOUT_S", "60");
  const unsigned long long seed = mktest::testSeed() ^ (0x9b0cull * n);
  printf("[RingAttnProcs] seed %llu (MKTEST_SEED=%llu repeats it)\n", seed,
         (unsigned long long)mktest::testSeed());
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  const auto t0 = Clock::now();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    char spec[160];
    snprintf(spec, sizeof(spec), "MKTEST_RA_CHILD=cases %d %d %llu", n, r, seed);
    const bool odd = r % 2 == 1;
    const char* direct = mode == 1 || (mode == 2 && odd) ? "MKERNEL_RING_DIRECT=0"
                         : mode == 3 && odd              ? "MKERNEL_RING_DIRECT=1"
                                                         : "MKERNEL_RING_DIRECT=2";
    const char* seqDirect = mode >= 4 ? "MKERNEL_RING_SEQ_DIRECT=1" : "MKERNEL_RING_SEQ_DIRECT=0";
    // The default (claimed tiles) except in n4claim, where the odd ranks walk the static
    // schedule beside the even ranks' claims.
    const char* claim =
        mode == 5 && odd ? "MKERNEL_RING_TILE_CLAIM=0" : "MKERNEL_RING_TILE_CLAIM=1";
    pids.push_back(mktest::spawnSelf(
        "RingAttnProcsChild.Run",
        {spec, "MKTEST_RA_ID=" + gputest::idToHex(id), direct, seqDirect, claim}));
  }
  for (pid_t p : pids) ASSERT_GT(p, 0) << "fork failed";
  const std::string err = mktest::waitChildren(pids, 240);
  mk::bootstrapRootsWait(5000);
  printf("[RingAttnProcs] %d processes: %.1f s\n", n, since(t0));
  EXPECT_EQ(err, "");
}

const ProcsCase kProcsCases[] = {{2, 0}, {4, 0}, {4, 1}, {4, 2}, {4, 3}, {3, 4}, {4, 5}};
std::string procsCaseName(const ::testing::TestParamInfo<ProcsCase>& i) {
  static const char* const kMode[] = {"", "copy", "mixed", "orders", "staged", "claim"};
  return "n" + std::to_string(i.param.n) + kMode[i.param.mode];
}
INSTANTIATE_TEST_SUITE_P(RingAttn, RingAttnProcs, ::testing::ValuesIn(kProcsCases), procsCaseName);

// Direct reads with a peer that never calls (the absent plan above): 3 processes, the
// deadline 5 s; the callers' errors name the missing rank, their aborts return promptly.
TEST(RingAttnProcsAbort, DirectPeerNeverCalls) {
  MKTEST_REQUIRE_GPU();
  const int n = 3;
  // Children inherit it. Long enough that the first call (module loads in three processes at
  // once) is not cut short, short enough for the absent peer's 25 s.
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "5000");
  mktest::ScopedEnv boot("MKERNEL_BOOTSTRAP_TIMEOUT_S", "60");
  mktest::ScopedEnv direct("MKERNEL_RING_DIRECT", "2");
  const unsigned long long seed = mktest::testSeed() ^ 0xab5eull;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    char spec[160];
    snprintf(spec, sizeof(spec), "MKTEST_RA_CHILD=absent %d %d %llu", n, r, seed);
    pids.push_back(mktest::spawnSelf("RingAttnProcsChild.Run",
                                     {spec, "MKTEST_RA_ID=" + gputest::idToHex(id)}));
  }
  for (pid_t p : pids) ASSERT_GT(p, 0) << "fork failed";
  const std::string err = mktest::waitChildren(pids, 120);
  mk::bootstrapRootsWait(5000);
  EXPECT_EQ(err, "");
}

// ---- virtual nodes --------------------------------------------------------------------------
// 4 ranks on GPU 0 over 2 virtual nodes (ncclCommInitAll); aborted after a failure.
TEST(RingAttnVnodes, TwoByTwo) {
  MKTEST_REQUIRE_GPU();
  const int n = 4;
  const uint64_t seed = mktest::testSeed() ^ 0x2b2a;
  SCOPED_TRACE("seed " + std::to_string(seed));
  // 1 MiB windows (several chunks per gather); a hang ends after 20 s on the device.
  dctest::TestEnv env(2, 1 << 20, 0, 20000);
  std::vector<ncclComm_t> comms(n, nullptr);
  std::vector<cudaStream_t> streams(n, nullptr);
  std::vector<int> devs(n, 0);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, devs.data()), ncclSuccess)
      << ncclGetLastError(nullptr);
  cudaSetDevice(0);
  for (auto& s : streams)
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  std::string err;
  for (const Shape& c : casesFor(n)) {
    Problem p(c);
    err = p.draw(seed + c.S);
    for (int r = 0; r < n && err.empty(); ++r) {
      const ncclResult_t res = p.call(r, comms[r], streams[r]);
      if (res != ncclSuccess)
        err = "rank " + std::to_string(r) + ": " + ncclGetErrorString(res) + ": " +
              ncclGetLastError(comms[r]);
    }
    if (err.empty()) err = fusedtest::waitRanks(comms, streams, 120);
    Stats st;
    for (int r = 0; r < n && err.empty(); ++r) err = p.check(r, &st);
    if (!err.empty()) {
      err = attntest::name(c) + ": " + err;
      for (auto& cm : comms) ncclCommAbort(cm);  // before p's buffers go: kernels may wait
      comms.assign(n, nullptr);
      break;
    }
    printf("[RingAttnVnodes] %s: %s\n", attntest::name(c).c_str(), st.str().c_str());
  }
  for (auto cm : comms)
    if (cm) ncclCommDestroy(cm);
  for (auto s : streams) cudaStreamDestroy(s);
  EXPECT_EQ(err, "");
}

}  // namespace
