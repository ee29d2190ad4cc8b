// The test matrix of the fused GEMM + collective calls, part 4: ranks as PROCESSES sharing
// GPU 0 (this binary re-spawned, running only FusedMatrixProcsChild.Run; fork after CUDA
// initialisation is not allowed), one rank per process, ncclCommInitRank from a unique id
// the parent hands over. With ncclFusedFused the calls run the fused kernel's processes
// layout (fused/ops/gemm_coll/procs.h: each rank's flags and data in windows every rank
// maps; n >= 2), with ncclFusedAuto the sequential path (engine GEMM, then mkernel's
// collective across processes); both algos are run. Every process regenerates every rank's inputs
// from the shared seed and computes the full reference (test_fused_util.cuh), checks its own
// output, and GemmAllReduce results are compared across processes (hashes AllGathered).
//   - FusedMatrix/FusedMatrixProcs.EveryCall/nN, N = 1, 2, 3, 4, 8: the three calls x algo
//     auto/fused x shapes with tails (N % 4 != 0 too), both layouts, every output type,
//     bias, AllGatherGemm in place and with Agathered NULL; one call captured in a graph and
//     replayed 50 times with new inputs; with 3 processes also 200 random fused calls mixed with
//     collectives.
//   - FusedMatrixProcsKill: a worker is killed (SIGKILL from the parent) while the others
//     are inside fused calls; every survivor must see an error within MKERNEL_TIMEOUT_MS plus
//     slack, ncclCommAbort must return within 5 s, its kernels must leave, and it must then
//     run a checked fused call on a fresh comm (the GPU stays usable); on one node (3
//     processes) and on 2 virtual nodes x 2 (4 processes, socket backend).
// Without CUDA MPS the processes' kernels are time-sliced: correct, only slower.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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
#include "transport/peer_mem_win.h"  // peerMemWinCount: the fused calls' windows exist
#include "common/test_util.h"
#include "gpu/test_devcomm_util.h"
#include "gpu/test_fused_util.cuh"
#include "gpu/test_proc_util.h"

namespace {

using fusedtest::Case;
using fusedtest::Problem;
using Clock = std::chrono::steady_clock;
using dctest::streamDone;
using gputest::hexToId;
using gputest::idToHex;
using gputest::monoNs;
using gputest::readNumber;
using gputest::since;
using gputest::writeNumber;

// ---- one child: one rank ----------------------------------------------------------------
struct Ctx {
  int n = 0, me = 0;
  uint64_t seed = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<ncclComm_t> comms;  // [n]: only [me] set (the other ranks are processes)
  std::vector<cudaStream_t> streams;
  int cases = 0, failures = 0;
  bool broken = false;  // a call failed or timed out: the ranks no longer agree, stop
  std::string who() const {
    return "[FusedMatrixProcs n=" + std::to_string(n) + " rank " + std::to_string(me) + "]";
  }
  void fail(const std::string& what, const std::string& why) {
    failures++;
    fprintf(stderr, "%s FAIL %s: %s\n", who().c_str(), what.c_str(), why.c_str());
  }
};

// Rank me's C must equal every other process's, byte for byte: hashes AllGathered.
std::string sameEverywhere(Ctx& x, Problem& p) {
  if (p.c().op != fusedtest::kAllReduce || x.n == 1) return "";
  const uint64_t mine = p.hashC(x.me);
  colltest::DevBuf s(8), r(8 * x.n);
  if (mktest::syncMemcpy(s.base, &mine, 8, cudaMemcpyHostToDevice) != cudaSuccess)
    return "hash upload failed";
  const ncclResult_t res = ncclAllGather(s.base, r.base, 1, ncclUint64, x.comm, x.stream);
  if (res != ncclSuccess) return std::string("hash AllGather: ") + ncclGetErrorString(res);
  std::string e = fusedtest::waitRanks(x.comms, x.streams, 60);
  if (!e.empty()) return "hash AllGather: " + e;
  std::vector<uint64_t> all(x.n);
  mktest::syncMemcpy(all.data(), r.base, 8 * x.n, cudaMemcpyDeviceToHost);
  for (int q = 0; q < x.n; q++)
    if (all[q] != mine)
      return "C differs from rank " + std::to_string(q) + "'s (not bit-identical)";
  return "";
}

void runOne(Ctx& x, const Case& c, uint64_t seed, bool graph, int reps) {
  if (x.broken) return;
  x.cases++;
  Problem p(c, x.me);
  const std::string e = fusedtest::runDriven(p, x.comms, x.streams, seed, graph, reps,
                                             [&] { return sameEverywhere(x, p); });
  if (e.empty()) return;
  x.fail(name(c) + (graph ? " (graph)" : ""), e);
  x.broken = true;
  ncclCommAbort(x.comm);  // before p's buffers are freed: a kernel may wait for a peer
  x.comm = nullptr;
  x.comms[x.me] = nullptr;
}

// Fails the context (and leaves the comm aborted) with `what` / `e` when e is not empty.
bool failed(Ctx& x, const std::string& what, const std::string& e) {
  if (e.empty()) return false;
  x.fail(what, e);
  x.broken = true;
  ncclCommAbort(x.comm);
  x.comm = nullptr;
  x.comms[x.me] = nullptr;
  return true;
}

std::string enqueue(Ctx& x, Problem& p) {
  return fusedtest::callError(x.me, x.comm, p.call(x.me, x.comm, x.stream));
}

// Processes layout (fused/ops/gemm_coll/procs.h), with ncclFusedFused:
//  - calls of different shapes back to back, no host wait between: a rank's next call writes
//    its partials while its peers may still pull its previous call's reduced tiles (F), which
//    must not lie where the next call's partials go;
//  - a graph captured before a bigger call grows the data region: its replays keep using the
//    old region, which must stay allocated and mapped.
void processesPlan(Ctx& x) {
  const int n = x.n;
  if (n < 2) return;
  for (int it = 0; it < 20 && !x.broken; ++it) {
    Case small{fusedtest::kAllReduce, n, 32, 256, 64, 0, ncclBfloat16, ncclBfloat16, false,
               ncclFusedFused};
    Case large{fusedtest::kAllReduce, n,           512,   1024,          64, 0,
               ncclBfloat16,          ncclFloat32, false, ncclFusedFused};
    Problem a(small, x.me), b(large, x.me);
    std::string e = a.fill(x.seed + 300 + it);
    if (e.empty()) e = b.fill(x.seed + 400 + it);
    if (e.empty()) e = enqueue(x, a);
    if (e.empty()) e = enqueue(x, b);
    if (e.empty()) e = fusedtest::waitRanks(x.comms, x.streams, 60);
    if (e.empty()) e = a.check(x.me);
    if (e.empty()) e = b.check(x.me);
    x.cases++;
    if (failed(x, "back-to-back shapes, iteration " + std::to_string(it), e)) return;
  }
  Case small{fusedtest::kAllReduce, n,     32 * n,        128, 64, 0, ncclBfloat16,
             ncclBfloat16,          false, ncclFusedFused};
  // 8 x 8 tiles of fp32 partials: 8 MiB, more than any earlier call of this plan needed.
  Case big{fusedtest::kAllReduce, n,           1024,  2048,          64, 0,
           ncclBfloat16,          ncclFloat32, false, ncclFusedFused};
  Problem a(small, x.me), b(big, x.me);
  std::string e = a.fill(x.seed + 500);
  if (e.empty()) e = enqueue(x, a);  // eager first: the state exists before the capture
  if (e.empty()) e = fusedtest::waitRanks(x.comms, x.streams, 60);
  if (e.empty()) e = a.check(x.me);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (e.empty()) {
    if (cudaStreamBeginCapture(x.stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
      e = "begin capture failed";
    if (e.empty()) e = enqueue(x, a);
    const cudaError_t ended = cudaStreamEndCapture(x.stream, &graph);
    if (e.empty() && (ended != cudaSuccess || graph == nullptr))
      e = std::string("end capture failed: ") + cudaGetErrorString(ended);
    if (e.empty() && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
      e = "graph instantiation failed";
  }
  if (e.empty()) e = b.fill(x.seed + 501);
  if (e.empty()) e = enqueue(x, b);  // grows every rank's data region
  if (e.empty()) e = fusedtest::waitRanks(x.comms, x.streams, 60);
  if (e.empty()) e = b.check(x.me);
  for (int rep = 0; rep < 3 && e.empty(); ++rep) {
    e = a.fill(x.seed + 510 + rep);
    if (e.empty() && cudaGraphLaunch(exec, x.stream) != cudaSuccess) e = "graph launch failed";
    if (e.empty()) e = fusedtest::waitRanks(x.comms, x.streams, 60);
    if (e.empty()) e = a.check(x.me);
  }
  x.cases += 5;
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  failed(x, "graph replayed after the data region grew", e);
}

void matrixPlan(Ctx& x) {
  const int n = x.n;
  struct Shape {
    int rowsPerRank, N, K;
  };
  const Shape shapes[] = {{40, 136, 72}, {24, 130, 40}};
  const ncclDataType_t outs[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
  int idx = 0;
  for (int op = 0; op < 3; ++op)
    for (int si = 0; si < 2; ++si)
      for (int algo : {ncclFusedAuto, ncclFusedFused}) {
        const Shape& s = shapes[si];
        Case c{op, n, s.rowsPerRank * n, s.N, s.K, 0, ncclBfloat16, ncclBfloat16, false, algo};
        c.layout = s.N % 8 == 0 ? (op + algo) % 2 : ncclFusedLayoutNK;
        c.in = (op + si + n) % 2 ? ncclFloat16 : ncclBfloat16;
        c.out = outs[(op + si + algo + n) % 3];
        c.bias = (op + si + algo) % 2 == 0;
        c.inplace = op == fusedtest::kAllGather && si == 0 && algo == ncclFusedFused;
        c.noGathered = op == fusedtest::kAllGather && si == 1 && algo == ncclFusedAuto;
        runOne(x, c, x.seed + idx++, false, 1);
      }
  // Graphs: every call with 2 processes, one per process count otherwise.
  for (int op = 0; op < 3; ++op) {
    if (n != 2 && op != n % 3) continue;
    const ncclDataType_t out = op == 1 ? ncclFloat32 : ncclFloat16;
    Case c{op, n, 32 * n, 128, 64, 1, ncclFloat16, out, true, ncclFusedAuto};
    runOne(x, c, x.seed + 100 + op, true, 50);
    // The fused kernel's processes layout in a graph (its state made by the eager run first).
    c.algo = ncclFusedFused;
    runOne(x, c, x.seed + 110 + op, true, 50);
  }
  if (n == 3 && !x.broken) {
    const uint64_t seed = x.seed ^ 0x3a11ed;  // the same draws in every process
    if (x.me == 0)
      fprintf(stderr, "%s random mix seed %llu\n", x.who().c_str(), (unsigned long long)seed);
    const std::string e = fusedtest::runRandomMix(x.comms, x.streams, seed, 200, 25, [&] {
      ncclCommAbort(x.comm);
      x.comm = nullptr;
      x.comms[x.me] = nullptr;
    });
    x.cases += 200;
    if (!e.empty()) {
      x.fail("random mix", e);
      x.broken = true;
    }
  }
}

// ---- the killed worker ---------------------------------------------------------------------
constexpr int kVictim = 1, kItersBeforeKill = 3, kMaxIters = kItersBeforeKill + 4;
constexpr int kKillTimeoutMs = 4000;  // MKERNEL_TIMEOUT_MS of the kill tests
// An error must show within the device deadline plus time-slicing and polling slack.
constexpr double kDetectS = kKillTimeoutMs / 1000.0 + 8;
constexpr double kIterS = kKillTimeoutMs / 1000.0 + 10;  // a healthy iteration
constexpr double kAbortS = 5;

Case killCase(int it, int n) {
  const int algo = it % 2 ? ncclFusedFused : ncclFusedAuto;
  return Case{it % 3, n, 64 * n, 256, 256, it % 2, ncclBfloat16, ncclBfloat16, it % 2 == 1, algo};
}

[[noreturn]] void quickExit(int code) {  // no CUDA teardown behind a kernel that may not end
  fflush(stdout);
  fflush(stderr);
  _exit(code);
}

// The victim: checked iterations, then one more enqueued, "ready", and wait for SIGKILL.
int victimMain(Ctx& x, const std::string& dir) {
  std::vector<std::unique_ptr<Problem>> keep;  // the last call's buffers stay mapped
  for (int it = 0; it <= kItersBeforeKill; ++it) {
    keep.emplace_back(new Problem(killCase(it, x.n), x.me));
    Problem& p = *keep.back();
    std::string e = p.fill(x.seed + it);
    if (e.empty() && p.call(x.me, x.comm, x.stream) != ncclSuccess)
      e = std::string("call failed: ") + ncclGetLastError(x.comm);
    if (!e.empty()) {
      x.fail("victim iteration " + std::to_string(it), e);
      quickExit(1);
    }
    if (it == kItersBeforeKill) break;
    e = fusedtest::waitRanks(x.comms, x.streams, kIterS);
    if (e.empty()) e = p.check(x.me);
    if (!e.empty()) {
      x.fail("victim iteration " + std::to_string(it), e);
      quickExit(1);
    }
  }
  fprintf(stderr, "%s iteration %d enqueued; waiting for SIGKILL\n", x.who().c_str(),
          kItersBeforeKill);
  writeNumber(dir + "/ready", monoNs());
  const auto t0 = Clock::now();
  while (since(t0) < 60) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  x.fail("victim", "not killed within 60 s");
  quickExit(1);
}

// A survivor: iterations until an error shows (checked while they succeed), then the abort
// and a fresh call. Returns the number of failures.
int survivorMain(Ctx& x, const std::string& dir) {
  int64_t killNs = 0;
  bool killed = false;
  std::string err;
  int errIter = -1;
  bool hung = false;
  Clock::time_point enq = Clock::now();
  std::vector<std::unique_ptr<Problem>> keep;
  for (int it = 0; it < kMaxIters && errIter < 0 && !hung; ++it) {
    keep.emplace_back(new Problem(killCase(it, x.n), x.me));
    Problem& p = *keep.back();
    std::string e = p.fill(x.seed + it);
    if (!e.empty()) {
      x.fail("survivor iteration " + std::to_string(it), e);
      quickExit(1);
    }
    enq = Clock::now();
    const ncclResult_t r = p.call(x.me, x.comm, x.stream);
    if (r != ncclSuccess) {
      err = std::string("call returned ") + ncclGetErrorString(r) + ": " + ncclGetLastError(x.comm);
      errIter = it;
      break;
    }
    for (;;) {  // short slices: the deadline moves to kill + kDetectS once the kill is known
      if (!killed) killed = readNumber(dir + "/killed", &killNs);
      const double left = killed ? kDetectS - (monoNs() - killNs) * 1e-9 : kIterS - since(enq);
      if (left <= 0) {
        hung = true;
        break;
      }
      e = fusedtest::waitRanks(x.comms, x.streams, std::min(0.05, left));
      if (e.empty()) {
        e = p.check(x.me);  // a call that completed must be right, after the kill too
        if (!e.empty()) {
          x.fail("survivor iteration " + std::to_string(it), e);
          quickExit(1);
        }
        break;
      }
      if (e.find("not done after") == std::string::npos) {
        err = e;
        errIter = it;
        break;
      }
    }
  }
  if (!killed) killed = readNumber(dir + "/killed", &killNs);
  const double afterKill = killed ? (monoNs() - killNs) * 1e-9 : -1;
  if (hung)
    x.fail("detection", killed ? "no error within " + std::to_string((int)kDetectS) +
                                     " s of the kill (kernel still running)"
                               : "an iteration hung before the kill");
  else if (errIter < 0)
    x.fail("detection", "every iteration completed although rank 1 was killed");
  else if (!killed)
    x.fail("detection", "error before the kill: " + err);
  const auto a0 = Clock::now();
  const ncclResult_t ar = ncclCommAbort(x.comm);
  const double abortS = since(a0);
  x.comm = nullptr;
  x.comms[x.me] = nullptr;
  if (ar != ncclSuccess) x.fail("abort", std::string("returned ") + ncclGetErrorString(ar));
  if (abortS > kAbortS) x.fail("abort", "took " + std::to_string(abortS) + " s");
  const bool idle = streamDone(x.stream, kAbortS);
  fprintf(stderr,
          "%s SUMMARY survivor: error %s at iteration %d, %.2f s after the kill; abort %.3f s; "
          "kernels left: %s; message: %s\n",
          x.who().c_str(), errIter >= 0 ? "observed" : "NOT observed", errIter, afterKill, abortS,
          idle ? "yes" : "NO", err.c_str());
  if (!idle) {
    x.fail("abort", "kernels still running " + std::to_string((int)kAbortS) + " s after it");
    quickExit(1);
  }
  keep.clear();
  // The GPU stays usable: a fresh one-rank comm runs a checked fused call.
  ncclComm_t solo = nullptr;
  int dev = 0;
  if (ncclCommInitAll(&solo, 1, &dev) != ncclSuccess) {
    x.fail("after the abort", std::string("ncclCommInitAll: ") + ncclGetLastError(nullptr));
    return x.failures;
  }
  Case c{0, 1, 128, 128, 64, 0, ncclBfloat16, ncclFloat32, true, ncclFusedFused};
  Problem p(c);
  const std::string e = fusedtest::runDriven(p, {solo}, {x.stream}, x.seed + 99);
  if (!e.empty()) x.fail("fused call after the abort", e);
  e.empty() ? ncclCommDestroy(solo) : ncclCommAbort(solo);
  return x.failures;
}

// Body of FusedMatrixProcsChild.Run: "plan n rank seed" in MKTEST_FM_CHILD, the id in
// MKTEST_FM_ID, the kill tests' folder in MKTEST_FM_DIR. Returns the number of failures.
int childMain(const char* spec) {
  char plan[32] = {};
  Ctx x;
  if (!gputest::parseChildSpec(spec, "[FusedMatrixProcs] bad MKTEST_FM_CHILD", plan, &x.n, &x.me,
                               &x.seed))
    return 1;
  ncclUniqueId id;
  if (!hexToId(getenv("MKTEST_FM_ID"), &id)) {
    fprintf(stderr, "[FusedMatrixProcs] bad MKTEST_FM_ID\n");
    return 1;
  }
  const auto t0 = Clock::now();
  if (cudaSetDevice(0) != cudaSuccess ||
      cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking) != cudaSuccess) {
    x.fail("setup", "cudaSetDevice/cudaStreamCreate failed");
    return 1;
  }
  const ncclResult_t r = ncclCommInitRank(&x.comm, x.n, id, x.me);
  if (r != ncclSuccess) {
    x.fail("ncclCommInitRank",
           std::string(ncclGetErrorString(r)) + ": " + ncclGetLastError(nullptr));
    return 1;
  }
  x.comms.assign(x.n, nullptr);
  x.streams.assign(x.n, nullptr);
  x.comms[x.me] = x.comm;
  x.streams[x.me] = x.stream;
  const std::string pl = plan;
  if (pl == "kill") {
    const char* dir = getenv("MKTEST_FM_DIR");
    if (!dir) {
      x.fail("setup", "MKTEST_FM_DIR not set");
      return 1;
    }
    return x.me == kVictim ? victimMain(x, dir) : survivorMain(x, dir);
  }
  if (pl == "matrix") {
    matrixPlan(x);
    processesPlan(x);
    // The ncclFusedFused calls ran the processes layout, not the sequential fallback: its
    // control block and data regions are windows of the comm.
    if (!x.broken && x.n >= 2 && mk::peerMemWinCount(x.comm) < 2)
      x.fail("processes layout", "the fused calls made no windows (they ran sequentially)");
  } else
    x.fail("setup", "unknown plan " + pl);
  if (!x.broken) {  // nobody tears down while a peer may still finish its last operation
    colltest::DevBuf b(16);
    std::string e;
    if (ncclAllReduce(b.base, b.base, 1, ncclInt32, ncclSum, x.comm, x.stream) != ncclSuccess)
      e = ncclGetLastError(x.comm);
    if (e.empty()) e = fusedtest::waitRanks(x.comms, x.streams, 60);
    if (!e.empty()) {
      x.fail("final barrier", e);
      x.broken = true;
    }
  }
  if (x.comm) x.broken ? ncclCommAbort(x.comm) : ncclCommDestroy(x.comm);
  fprintf(stderr, "%s %d cases, %d failed%s, %.1f s\n", x.who().c_str(), x.cases, x.failures,
          x.broken ? " (stopped early)" : "", since(t0));
  return x.failures;
}

TEST(FusedMatrixProcsChild, Run) {
  const char* spec = getenv("MKTEST_FM_CHILD");
  if (!spec) GTEST_SKIP() << "helper of the FusedMatrixProcs tests (runs only in their children)";
  EXPECT_EQ(childMain(spec), 0) << "failing cases are listed above";
}

// ---- parents ---------------------------------------------------------------------------------
std::vector<pid_t> spawnChildren(const char* plan, int n, const std::string& idHex,
                                 const std::string& dir) {
  std::vector<pid_t> pids;
  const unsigned long long seed = mktest::testSeed();
  for (int r = 0; r < n; r++) {
    char spec[160];
    snprintf(spec, sizeof(spec), "MKTEST_FM_CHILD=%s %d %d %llu", plan, n, r, seed);
    std::vector<std::string> env{spec, "MKTEST_FM_ID=" + idHex};
    if (!dir.empty()) env.push_back("MKTEST_FM_DIR=" + dir);
    pids.push_back(mktest::spawnSelf("FusedMatrixProcsChild.Run", env));
  }
  return pids;
}

class FusedMatrixProcs : public ::testing::TestWithParam<int> {};

TEST_P(FusedMatrixProcs, EveryCall) {
  MKTEST_REQUIRE_GPU();
  const int n = GetParam();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");  // children inherit it
  mktest::ScopedEnv boot("MKERNEL_BOOTSTRAP_TIMEOUT_S", "60");
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  const auto t0 = Clock::now();
  const std::vector<pid_t> pids = spawnChildren("matrix", n, idToHex(id), "");
  for (pid_t p : pids) ASSERT_GT(p, 0) << "fork failed";
  const std::string err = mktest::waitChildren(pids, 240);
  mk::bootstrapRootsWait(5000);
  printf("[FusedMatrixProcs] %d processes: %.1f s\n", n, since(t0));
  EXPECT_EQ(err, "");
}

INSTANTIATE_TEST_SUITE_P(FusedMatrix, FusedMatrixProcs, ::testing::Values(1, 2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// n processes (over `nodes` virtual nodes when > 1); the parent SIGKILLs rank kVictim once
// it has enqueued its iteration kItersBeforeKill (the survivors are then inside fused calls
// that need it), and checks that every survivor passed and the GPU still runs a fused call
// here.
void runKill(int nodes, int n) {
  {
    // Children inherit the environment. Nested scopes, restored in reverse order: the
    // virtual-node set-up first (it sets these variables too), then the short deadlines.
    std::unique_ptr<dctest::TestEnv> vnodes;
    if (nodes > 1) vnodes.reset(new dctest::TestEnv(nodes, 1 << 20, 0, kKillTimeoutMs));
    mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", std::to_string(kKillTimeoutMs).c_str());
    mktest::ScopedEnv netTo("MKERNEL_NET_TIMEOUT_S", "5");
    mktest::ScopedEnv bootTo("MKERNEL_BOOTSTRAP_TIMEOUT_S", "15");
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
    char tmpl[] = "/tmp/mk_fusedkill_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const std::string dir = tmpl;
    const auto t0 = Clock::now();
    std::vector<pid_t> pids = spawnChildren("kill", n, idToHex(id), dir);
    for (pid_t p : pids) ASSERT_GT(p, 0) << "fork failed";
    int64_t readyNs = 0;
    bool ready = false;
    while (!ready && since(t0) < 90) {
      ready = readNumber(dir + "/ready", &readyNs);
      int st = 0;
      if (!ready && waitpid(pids[kVictim], &st, WNOHANG) == pids[kVictim]) {
        pids[kVictim] = -1;  // it failed before its kill point (its output says why)
        break;
      }
      if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    int vs = 0;
    if (pids[kVictim] > 0) {
      if (ready) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let its kernels run
        writeNumber(dir + "/killed", monoNs());
      }
      kill(pids[kVictim], SIGKILL);
      waitpid(pids[kVictim], &vs, 0);
    }
    std::vector<pid_t> survivors;
    for (int r = 0; r < n; ++r)
      if (r != kVictim) survivors.push_back(pids[r]);
    const std::string err = mktest::waitChildren(survivors, 60);
    mk::bootstrapRootsWait(5000);
    for (const char* f : {"/ready", "/killed", "/ready.tmp", "/killed.tmp"})
      unlink((dir + f).c_str());
    rmdir(dir.c_str());
    printf(
        "[FusedMatrixProcsKill] %d processes on %d node(s), rank %d killed after %d "
        "iterations; %.1f s; survivors: %s\n",
        n, nodes, kVictim, kItersBeforeKill, since(t0), err.empty() ? "all passed" : err.c_str());
    EXPECT_TRUE(ready) << "rank " << kVictim << " never reached its kill point";
    EXPECT_TRUE(ready && WIFSIGNALED(vs) && WTERMSIG(vs) == SIGKILL);
    EXPECT_EQ(err, "") << "the survivors' lines 'SUMMARY survivor' above say why";
  }
  // And this process, which shares the GPU, still runs a checked fused call.
  Case c{2, 2, 128, 128, 64, 0, ncclBfloat16, ncclBfloat16, true, ncclFusedFused};
  colltest::Clique& q = colltest::clique(2);
  ASSERT_TRUE(q.ok) << q.why;
  Problem p(c);
  const std::string e = fusedtest::runDriven(p, q.comms, q.streams, 5);
  if (!e.empty()) colltest::dropClique(2);
  EXPECT_EQ(e, "");
}

TEST(FusedMatrixProcsKill, WorkerKilledMidCallOneNode) {
  MKTEST_REQUIRE_GPU();
  runKill(1, 3);
}

TEST(FusedMatrixProcsKill, WorkerKilledMidCallVirtualNodes2x2) {
  MKTEST_REQUIRE_GPU();
  runKill(2, 4);
}

}  // namespace
