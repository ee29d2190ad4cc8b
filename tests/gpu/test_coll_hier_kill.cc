// A rank killed in the middle of a hierarchical AllReduce: 2 virtual nodes x 2 ranks on
// GPU 0, every rank its own process (this binary re-spawned, running only HierKillChild.Run),
// socket backend on loopback. All ranks run 4M-float AllReduces in a loop (the comm spans
// two nodes, so the hierarchical path is chosen automatically); after kItersBeforeKill
// iterations rank kVictim enqueues one more and SIGKILLs itself. Every survivor must then
//   1. observe an error (ncclCommGetAsyncError, or an ncclAllReduce call failing) within
//      kDetectS of the kill, polling with a deadline - never cudaStreamSynchronize on a
//      stream whose kernel may wait for a dead peer;
//   2. get ncclSuccess from ncclCommAbort within kAbortS;
//   3. see its kernel leave within kAbortS of the abort.
// Each survivor prints one line with its measured times and ncclGetLastError's message.
// Expected paths: ranks 2 and 3 (the other node) have proxy connections to the victim,
// which close with the process, so their proxies stop and their kernels fail at once;
// rank 0 (the victim's node) waits on the victim's P2P signals and fails when ranks 2/3
// abort (their connections close) or, at the latest, at MKERNEL_TIMEOUT_MS.
// Processes sharing a GPU without MPS are time-sliced: slow but correct.
#include <algorithm>
#include <cstdint>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include "common/test_util.h"
#include "gpu/test_devcomm_util.h"
#include "gpu/test_proc_util.h"

namespace {

using Clock = std::chrono::steady_clock;
using gputest::hexToId;
using gputest::idToHex;
using gputest::monoNs;

constexpr int kNodes = 2, kRanks = 4, kVictim = 1;
constexpr size_t kCount = 4u << 20;  // floats per AllReduce: 13 chunks of the 4 MiB window
constexpr size_t kWindow = 4u << 20;
constexpr int kItersBeforeKill = 3;
constexpr int kMaxIters = kItersBeforeKill + 3;  // survivors give up after these
constexpr int kTimeoutMs = 8000;                 // MKERNEL_TIMEOUT_MS: device waits
// An error must be seen within the device deadline plus time-slicing and polling slack.
constexpr double kDetectS = kTimeoutMs / 1000.0 + 5;
// A healthy iteration: a wait longer than the device deadline fails the kernel anyway.
constexpr double kIterS = kTimeoutMs / 1000.0 + 7;
constexpr double kAbortS = 5;
constexpr int kParentS = 55;  // the whole test, children included

double secs(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
Clock::time_point fromMonoNs(int64_t ns) {
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}
Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// Input of rank r in iteration it: small integers, so every sum is exact in float and a
// stale or misplaced chunk shows.
float inputValue(int r, int it, size_t i) {
  return (float)((r + 1) + (int)(i % 7) + it);
}
float expectedSum(int nRanks, int it, size_t i) {
  float s = 0;
  for (int r = 0; r < nRanks; r++) s += inputValue(r, it, i);
  return s;
}

// ---- child -------------------------------------------------------------------------------
struct Child {
  int rank = -1, n = 0;
  std::string killFile;
  Clock::time_point t0 = Clock::now();
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float *send = nullptr, *recv = nullptr;
  std::vector<float> host;

  void log(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    char m[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof(m), fmt, ap);
    va_end(ap);
    fprintf(stderr, "[HierKill rank %d +%.2f s] %s\n", rank, secs(Clock::now() - t0), m);
  }
};

std::string cudaMsg(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// Uploads iteration it's input and poisons the output (NaN), on an idle stream.
std::string prepare(Child& c, int it) {
  for (size_t i = 0; i < kCount; i++) c.host[i] = inputValue(c.rank, it, i);
  cudaError_t e =
      mktest::syncMemcpy(c.send, c.host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = mktest::syncMemset(c.recv, 0xff, kCount * sizeof(float));
  return e == cudaSuccess ? "" : cudaMsg("upload", e);
}

std::string check(Child& c, int it) {
  cudaError_t e =
      mktest::syncMemcpy(c.host.data(), c.recv, kCount * sizeof(float), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return cudaMsg("download", e);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < kCount; i++)
    if (c.host[i] != expectedSum(c.n, it, i) && bad++ == 0) first = i;
  if (!bad) return "";
  char m[256];
  snprintf(m, sizeof(m), "iteration %d: %zu of %zu elements wrong (first at %zu: got %g, want %g)",
           it, bad, kCount, first, c.host[first], expectedSum(c.n, it, first));
  return m;
}

enum class Poll { kDone, kError, kTimeout };

// Polls the stream and the comm's async error until the kernel is done, an error shows,
// or `deadline` passes. The kernel returns early on failure, so a finished stream is
// checked for an error too (the record is written before the kernel returns).
Poll pollIteration(Child& c, Clock::time_point deadline, std::string* msg) {
  for (;;) {
    cudaError_t q = cudaStreamQuery(c.stream);
    ncclResult_t a = ncclSuccess;
    ncclResult_t g = ncclCommGetAsyncError(c.comm, &a);
    if (g != ncclSuccess) {
      *msg = std::string("ncclCommGetAsyncError itself failed: ") + ncclGetErrorString(g) + ": " +
             ncclGetLastError(c.comm);
      return Poll::kError;
    }
    if (a != ncclSuccess && a != ncclInProgress) {
      *msg = std::string("async error ") + ncclGetErrorString(a) + ": " + ncclGetLastError(c.comm);
      return Poll::kError;
    }
    if (q == cudaSuccess) return Poll::kDone;
    if (q != cudaErrorNotReady) {
      // A CUDA error instead of a recorded NCCL error: the context is poisoned (a trap?).
      *msg = cudaMsg("CUDA error on the stream (expected an NCCL async error instead)", q);
      return Poll::kError;
    }
    if (Clock::now() > deadline) return Poll::kTimeout;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool streamIdle(cudaStream_t s, double boundS) {
  auto end = Clock::now() + seconds(boundS);
  for (;;) {
    cudaError_t q = cudaStreamQuery(s);
    if (q != cudaErrorNotReady) return true;  // done, or failed: nothing runs any more
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Leaves the process without CUDA teardown, which would wait for a kernel that may never
// end (a failure of this test must not turn into a hang).
[[noreturn]] void quickExit(int code) {
  fflush(stdout);
  fflush(stderr);
  _exit(code);
}

void releaseBuffers(Child& c) {
  if (c.send) cudaFree(c.send);
  if (c.recv) cudaFree(c.recv);
  if (c.stream) cudaStreamDestroy(c.stream);
  c.send = c.recv = nullptr;
  c.stream = nullptr;
}

// The victim: kItersBeforeKill checked iterations, one more enqueued, then SIGKILL.
std::string victimMain(Child& c) {
  for (int it = 0; it <= kItersBeforeKill; it++) {
    std::string e = prepare(c, it);
    if (!e.empty()) return e;
    ncclResult_t r = ncclAllReduce(c.send, c.recv, kCount, ncclFloat32, ncclSum, c.comm, c.stream);
    if (r != ncclSuccess)
      return "iteration " + std::to_string(it) + ": ncclAllReduce: " + ncclGetErrorString(r) +
             ": " + ncclGetLastError(c.comm);
    if (it == kItersBeforeKill) break;
    std::string m;
    Poll p = pollIteration(c, Clock::now() + seconds(kIterS), &m);
    if (p == Poll::kTimeout)
      return "iteration " + std::to_string(it) + " before the kill still running after " +
             std::to_string((int)kIterS) + " s";
    if (p == Poll::kError) return "iteration " + std::to_string(it) + " before the kill: " + m;
    if (!(e = check(c, it)).empty()) return e;
    c.log("iteration %d done and checked", it);
  }
  // Let the kernel get going, so the survivors are inside the same AllReduce.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  c.log("iteration %d enqueued; killing myself with SIGKILL", kItersBeforeKill);
  gputest::writeNumber(c.killFile, monoNs());
  fflush(stdout);
  fflush(stderr);
  kill(getpid(), SIGKILL);
  for (;;) pause();  // not reached
}

// A survivor: iterations until an error shows; then the abort. "" when every condition held.
std::string survivorMain(Child& c) {
  int64_t killNs = 0;
  bool killed = false;
  std::string err;
  int errIter = -1;
  Clock::time_point enq;
  for (int it = 0; it < kMaxIters && errIter < 0; it++) {
    std::string e = prepare(c, it);
    if (!e.empty()) return e;
    enq = Clock::now();
    ncclResult_t r = ncclAllReduce(c.send, c.recv, kCount, ncclFloat32, ncclSum, c.comm, c.stream);
    if (r != ncclSuccess) {
      err = std::string("ncclAllReduce returned ") + ncclGetErrorString(r) + ": " +
            ncclGetLastError(c.comm);
      errIter = it;
      break;
    }
    // Poll in short slices: the deadline moves to kill + kDetectS once the kill is known.
    for (;;) {
      if (!killed) killed = gputest::readNumber(c.killFile, &killNs);
      Clock::time_point deadline =
          killed ? fromMonoNs(killNs) + seconds(kDetectS) : enq + seconds(kIterS);
      Clock::time_point slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(50));
      std::string m;
      Poll p = pollIteration(c, slice, &m);
      if (p == Poll::kError) {
        err = m;
        errIter = it;
        break;
      }
      if (p == Poll::kDone) {
        std::string bad = check(c, it);
        // After the kill a finished iteration must still be right (the victim may have
        // completed its part of it before dying).
        if (!bad.empty()) return bad;
        c.log("iteration %d done and checked", it);
        break;
      }
      if (Clock::now() > deadline) {
        // No error and no completion: report, then still measure the abort.
        errIter = -2;
        break;
      }
    }
    if (errIter == -2) break;
  }
  const Clock::time_point tErr = Clock::now();
  if (!killed) killed = gputest::readNumber(c.killFile, &killNs);
  std::vector<std::string> fails;
  const double afterKill = killed ? secs(tErr - fromMonoNs(killNs)) : -1;
  if (errIter == -2) {
    fails.push_back(killed ? "no error observed within " + std::to_string((int)kDetectS) +
                                 " s of the kill (kernel still running)"
                           : "iteration hung with no error and the victim never killed itself");
  } else if (errIter < 0) {
    fails.push_back(
        std::to_string(kMaxIters) + " iterations completed without any error" +
        (killed ? " although the victim was killed" : "; the victim never killed itself"));
  } else if (!killed) {
    fails.push_back("error observed before the victim killed itself: " + err);
  } else if (afterKill > kDetectS) {
    fails.push_back("error observed " + std::to_string(afterKill) + " s after the kill (bound " +
                    std::to_string((int)kDetectS) + " s)");
  }
  const bool enqueued = errIter != -1;  // an AllReduce may still be on the stream
  const Clock::time_point a0 = Clock::now();
  ncclResult_t ar = ncclCommAbort(c.comm);
  const double abortS = secs(Clock::now() - a0);
  c.comm = nullptr;
  if (ar != ncclSuccess)
    fails.push_back(std::string("ncclCommAbort returned ") + ncclGetErrorString(ar));
  if (abortS > kAbortS)
    fails.push_back("ncclCommAbort took " + std::to_string(abortS) + " s (bound " +
                    std::to_string((int)kAbortS) + " s)");
  const bool idle = !enqueued || streamIdle(c.stream, kAbortS);
  if (!idle)
    fails.push_back("the AllReduce kernel still runs " + std::to_string((int)kAbortS) +
                    " s after ncclCommAbort");
  char when[96] = "kill time unknown";
  if (killed) snprintf(when, sizeof(when), "%.3f s after the kill", afterKill);
  c.log(
      "SUMMARY survivor rank %d: error %s (iteration %d, %.3f s after its enqueue, %s); "
      "ncclCommAbort %.3f s -> %s; kernel left: %s; message: %s",
      c.rank, errIter >= 0 ? "observed" : "NOT observed", errIter, secs(tErr - enq), when, abortS,
      ncclGetErrorString(ar), idle ? "yes" : "NO", err.empty() ? "(none)" : err.c_str());
  std::string all;
  for (auto& f : fails) all += (all.empty() ? "" : "; ") + f;
  if (!idle) {
    c.log("FAIL: %s (leaving without CUDA teardown)", all.c_str());
    quickExit(1);
  }
  releaseBuffers(c);
  return all;
}

// "rank nRanks" in MKTEST_HK_CHILD, the unique id in MKTEST_HK_ID, the kill-time file in
// MKTEST_HK_KILLFILE.
std::string childMain(const char* spec) {
  Child c;
  if (sscanf(spec, "%d %d", &c.rank, &c.n) != 2 || c.rank < 0 || c.rank >= c.n)
    return std::string("bad MKTEST_HK_CHILD: ") + spec;
  ncclUniqueId id;
  if (!hexToId(getenv("MKTEST_HK_ID"), &id)) return "bad MKTEST_HK_ID";
  const char* kf = getenv("MKTEST_HK_KILLFILE");
  if (!kf || !*kf) return "MKTEST_HK_KILLFILE not set";
  c.killFile = kf;
  cudaError_t e = cudaSetDevice(0);
  if (e != cudaSuccess) return cudaMsg("cudaSetDevice(0)", e);
  ncclResult_t r = ncclCommInitRank(&c.comm, c.n, id, c.rank);
  if (r != ncclSuccess)
    return std::string("ncclCommInitRank: ") + ncclGetErrorString(r) + ": " +
           ncclGetLastError(nullptr);
  c.log("comm ready (%.2f s)", secs(Clock::now() - c.t0));
  c.host.resize(kCount);
  if ((e = cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = cudaMalloc((void**)&c.send, kCount * sizeof(float))) != cudaSuccess ||
      (e = cudaMalloc((void**)&c.recv, kCount * sizeof(float))) != cudaSuccess)
    return cudaMsg("buffers", e);
  std::string res = c.rank == kVictim ? victimMain(c) : survivorMain(c);
  if (!res.empty() && c.comm) {
    // A failure before the end: abort (bounded), never destroy (which waits for peers).
    ncclCommAbort(c.comm);
    c.comm = nullptr;
    if (!streamIdle(c.stream, kAbortS)) {
      c.log("FAIL: %s (kernel still running; leaving without CUDA teardown)", res.c_str());
      quickExit(1);
    }
    releaseBuffers(c);
  }
  if (!res.empty()) c.log("FAIL: %s", res.c_str());
  return res;
}

TEST(HierKillChild, Run) {
  const char* spec = getenv("MKTEST_HK_CHILD");
  if (!spec)
    GTEST_SKIP() << "helper of HierKill.RankKilledMidAllReduce (runs only in its children)";
  EXPECT_EQ(childMain(spec), "");
}

// ---- parent ------------------------------------------------------------------------------
TEST(HierKill, RankKilledMidAllReduce) {
  MKTEST_REQUIRE_GPU();
  const Clock::time_point t0 = Clock::now();
  // The environment first (children inherit it; the unique id's bootstrap interface follows
  // NCCL_SOCKET_IFNAME). Short timeouts so that every failure mode ends within the bound.
  dctest::TestEnv env(kNodes, kWindow, 0, kTimeoutMs);
  dctest::ScopedEnv netTo("MKERNEL_NET_TIMEOUT_S", "5");
  dctest::ScopedEnv bootTo("MKERNEL_BOOTSTRAP_TIMEOUT_S", "15");
  mktest::ScopedEnv algo("MKERNEL_ALGO", nullptr);  // the automatic choice: hierarchical
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  const std::string killFile = "/tmp/mk_hierkill_" + std::to_string(getpid()) + "_" +
                               std::to_string((unsigned long long)monoNs());
  unlink(killFile.c_str());
  std::vector<pid_t> pids(kRanks, -1), survivors;
  for (int r = 0; r < kRanks; r++) {
    char spec[64];
    snprintf(spec, sizeof(spec), "MKTEST_HK_CHILD=%d %d", r, kRanks);
    pids[r] = mktest::spawnSelf("HierKillChild.Run", {spec, "MKTEST_HK_ID=" + idToHex(id),
                                                      "MKTEST_HK_KILLFILE=" + killFile});
    ASSERT_GT(pids[r], 0) << "fork failed";
    if (r != kVictim) survivors.push_back(pids[r]);
  }
  const std::string survErr = mktest::waitChildren(survivors, kParentS);
  // The victim must be gone by now (the survivors' checks need its death); give it a
  // moment in case the survivors failed early, then make sure it does not outlive us.
  int vs = 0;
  bool victimDone = false;
  for (auto end = Clock::now() + std::chrono::seconds(5); !victimDone && Clock::now() < end;) {
    victimDone = waitpid(pids[kVictim], &vs, WNOHANG) == pids[kVictim];
    if (!victimDone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!victimDone) {
    kill(pids[kVictim], SIGKILL);
    waitpid(pids[kVictim], &vs, 0);
  }
  const bool killedFile = access(killFile.c_str(), F_OK) == 0;
  unlink(killFile.c_str());
  unlink((killFile + ".tmp").c_str());
  const double total = secs(Clock::now() - t0);
  printf(
      "[HierKill] %d ranks (%d virtual nodes) in %d processes, rank %d killed after %d "
      "iterations of %zu floats; whole test %.1f s; survivors (ranks other than %d): %s\n",
      kRanks, kNodes, kRanks, kVictim, kItersBeforeKill, kCount, total, kVictim,
      survErr.empty() ? "all passed" : survErr.c_str());
  EXPECT_EQ(survErr, "") << "survivor output above (lines 'SUMMARY survivor rank ...') says why";
  EXPECT_TRUE(victimDone) << "rank " << kVictim << " was still alive after the survivors ended";
  EXPECT_TRUE(victimDone && WIFSIGNALED(vs) && WTERMSIG(vs) == SIGKILL)
      << "rank " << kVictim << " should have died of SIGKILL after " << kItersBeforeKill
      << " iterations; wait status " << vs
      << (WIFEXITED(vs) ? " (it exited: it failed before the kill, its output says why)" : "");
  EXPECT_TRUE(killedFile) << "rank " << kVictim << " never reached its kill point";
  EXPECT_LT(total, (double)kParentS + 10);
}

}  // namespace
