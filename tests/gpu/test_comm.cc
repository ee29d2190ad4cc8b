// Communicator lifecycle on a GPU: ranks sharing one GPU as threads and as processes,
// nonblocking init, split, shrink, abort from another thread, destroy, leak checks.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <spawn.h>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "common/test_util.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Creates n comms on device 0 with one thread per rank (the usual multi-thread pattern).
std::vector<ncclComm_t> initThreads(int n, ncclConfig_t* cfg = nullptr) {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> comms(n, nullptr);
  std::vector<ncclResult_t> res(n, ncclInternalError);
  std::vector<std::thread> th;
  for (int r = 0; r < n; r++)
    th.emplace_back([&, r] {
      cudaSetDevice(0);
      res[r] = cfg ? ncclCommInitRankConfig(&comms[r], n, id, r, cfg)
                   : ncclCommInitRank(&comms[r], n, id, r);
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < n; r++)
    EXPECT_EQ(res[r], ncclSuccess) << "rank " << r << ": " << ncclGetLastError(nullptr);
  return comms;
}

void checkComms(const std::vector<ncclComm_t>& comms) {
  for (size_t r = 0; r < comms.size(); r++) {
    int rank = -1, count = -1, dev = -1;
    ASSERT_EQ(ncclCommUserRank(comms[r], &rank), ncclSuccess);
    ASSERT_EQ(ncclCommCount(comms[r], &count), ncclSuccess);
    ASSERT_EQ(ncclCommCuDevice(comms[r], &dev), ncclSuccess);
    EXPECT_EQ(rank, (int)r);
    EXPECT_EQ(count, (int)comms.size());
    EXPECT_EQ(dev, 0);
    ncclResult_t async = ncclInternalError;
    ASSERT_EQ(ncclCommGetAsyncError(comms[r], &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
  }
}

void destroyAll(std::vector<ncclComm_t>& comms) {
  for (auto c : comms)
    if (c) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  comms.clear();
}

class CommInit : public ::testing::TestWithParam<int> {};

TEST_P(CommInit, ThreadsSharingOneGpu) {
  MKTEST_REQUIRE_GPU();
  auto comms = initThreads(GetParam());
  checkComms(comms);
  destroyAll(comms);
}

TEST_P(CommInit, InitAllWithRepeatedDevice) {
  MKTEST_REQUIRE_GPU();
  int n = GetParam();
  std::vector<int> devs(n, 0);
  std::vector<ncclComm_t> comms(n);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, devs.data()), ncclSuccess)
      << ncclGetLastError(nullptr);
  checkComms(comms);
  destroyAll(comms);
}

TEST_P(CommInit, OneThreadDrivesAllRanksInAGroup) {
  MKTEST_REQUIRE_GPU();
  int n = GetParam();
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> comms(n);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; r++) ASSERT_EQ(ncclCommInitRank(&comms[r], n, id, r), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  checkComms(comms);
  destroyAll(comms);
}

TEST_P(CommInit, Processes) {
  MKTEST_REQUIRE_GPU();
  int n = GetParam();
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::string hex;
  char b[3];
  for (unsigned char c : std::string(id.internal, sizeof(id.internal))) {
    snprintf(b, sizeof(b), "%02x", c);
    hex += b;
  }
  // Next to this test binary first (binaries copied elsewhere, e.g. to a GPU machine), then
  // the build tree it was built in.
  std::string worker = mktest::selfDir() + "/mk_comm_worker";
  if (access(worker.c_str(), X_OK) != 0)
    worker = std::string(MK_BUILD_DIR) + "/tests/mk_comm_worker";
  std::vector<pid_t> pids;
  for (int r = 0; r < n; r++) {
    std::string rs = std::to_string(r), ns = std::to_string(n);
    char* argv[] = {(char*)worker.c_str(), (char*)hex.c_str(), (char*)ns.c_str(), (char*)rs.c_str(),
                    nullptr};
    pid_t pid;
    ASSERT_EQ(posix_spawn(&pid, worker.c_str(), nullptr, nullptr, argv, environ), 0) << worker;
    pids.push_back(pid);
  }
  auto t0 = Clock::now();
  for (pid_t pid : pids) {
    int status = -1;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (secondsSince(t0) > 120) {
        for (pid_t p : pids) kill(p, SIGKILL);
        FAIL() << "worker processes did not finish within 120 s";
      }
      usleep(10000);
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "worker status " << status;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommInit, ::testing::Values(1, 2, 4, 8));

// Ranks (processes, so each reads its own environment) that disagree on a parameter every rank
// must share are refused at init, every one of them, quickly and with the parameter named:
// before, MKERNEL_EMULATE_NODES differing gave the ranks different node maps, and
// MKERNEL_MOE_NODE_DEDUP differing timed out in the first MoE call.
TEST(CommInitAgreed, MismatchedParametersAreRefusedOnEveryRank) {
  MKTEST_REQUIRE_GPU();
  std::string worker = mktest::selfDir() + "/mk_comm_worker";
  if (access(worker.c_str(), X_OK) != 0)
    worker = std::string(MK_BUILD_DIR) + "/tests/mk_comm_worker";
  struct Case {
    const char* var;
    const char* mine;    // ranks other than 1
    const char* theirs;  // rank 1
  };
  for (const Case& c :
       {Case{"MKERNEL_MOE_NODE_DEDUP", "1", "0"}, Case{"MKERNEL_EMULATE_NODES", "0", "3"},
        Case{"MKERNEL_ALGO", "ring", "oneshot"}}) {
    const int n = 3;
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    std::string hex;
    char b[3];
    for (unsigned char ch : std::string(id.internal, sizeof(id.internal))) {
      snprintf(b, sizeof(b), "%02x", ch);
      hex += b;
    }
    std::vector<pid_t> pids;
    for (int r = 0; r < n; r++) {
      std::vector<std::string> env;
      for (char** e = environ; *e; ++e) {
        const std::string kv = *e;
        if (kv.rfind(std::string(c.var) + "=", 0) == 0 ||
            kv.rfind("MK_TEST_EXPECT_REFUSE=", 0) == 0)
          continue;
        env.push_back(kv);
      }
      env.push_back(std::string(c.var) + "=" + (r == 1 ? c.theirs : c.mine));
      env.push_back(std::string("MK_TEST_EXPECT_REFUSE=") + c.var);
      std::vector<char*> envp;
      for (auto& kv : env) envp.push_back((char*)kv.c_str());
      envp.push_back(nullptr);
      std::string rs = std::to_string(r), ns = std::to_string(n);
      char* argv[] = {(char*)worker.c_str(), (char*)hex.c_str(), (char*)ns.c_str(),
                      (char*)rs.c_str(), nullptr};
      pid_t pid;
      ASSERT_EQ(posix_spawn(&pid, worker.c_str(), nullptr, nullptr, argv, envp.data()), 0)
          << worker;
      pids.push_back(pid);
    }
    auto t0 = Clock::now();
    for (pid_t pid : pids) {
      int status = -1;
      while (waitpid(pid, &status, WNOHANG) == 0) {
        if (secondsSince(t0) > 60) {
          for (pid_t p : pids) kill(p, SIGKILL);
          FAIL() << c.var << ": workers did not finish within 60 s";
        }
        usleep(10000);
      }
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << c.var << ": worker status " << status << " (5: init not refused as expected)";
    }
    EXPECT_LT(secondsSince(t0), 30.0) << c.var << ": the refusal should not wait for a timeout";
  }
}

TEST(CommLifecycle, NonblockingInit) {
  MKTEST_REQUIRE_GPU();
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  const int n = 4;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> comms(n, nullptr);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; r++) {
    ncclResult_t res = ncclCommInitRankConfig(&comms[r], n, id, r, &cfg);
    ASSERT_TRUE(res == ncclSuccess || res == ncclInProgress);
    ASSERT_NE(comms[r], nullptr) << "handle must be written at once";
  }
  ncclResult_t end = ncclGroupEnd();
  ASSERT_TRUE(end == ncclSuccess || end == ncclInProgress) << end;
  auto t0 = Clock::now();
  for (int r = 0; r < n; r++) {
    ncclResult_t st = ncclInProgress;
    while (st == ncclInProgress && secondsSince(t0) < 60) {
      ASSERT_EQ(ncclCommGetAsyncError(comms[r], &st), ncclSuccess);
      if (st == ncclInProgress) usleep(1000);
    }
    EXPECT_EQ(st, ncclSuccess) << ncclGetLastError(nullptr);
  }
  checkComms(comms);
  destroyAll(comms);
}

TEST(CommLifecycle, SplitEvenOddAndNoColor) {
  MKTEST_REQUIRE_GPU();
  const int n = 6;
  auto comms = initThreads(n);
  std::vector<ncclComm_t> kids(n, nullptr);
  std::vector<std::thread> th;
  std::vector<ncclResult_t> res(n);
  for (int r = 0; r < n; r++)
    th.emplace_back([&, r] {
      cudaSetDevice(0);
      int color = r == 5 ? NCCL_SPLIT_NOCOLOR : r % 2;
      res[r] = ncclCommSplit(comms[r], color, /*key=*/n - r, &kids[r], nullptr);
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < n; r++) ASSERT_EQ(res[r], ncclSuccess) << r;
  EXPECT_EQ(kids[5], nullptr);
  // Even ranks {0,2,4} ordered by key n-r: 4,2,0 -> child ranks 0,1,2.
  int rank = -1, count = -1;
  ASSERT_EQ(ncclCommUserRank(kids[4], &rank), ncclSuccess);
  EXPECT_EQ(rank, 0);
  ASSERT_EQ(ncclCommUserRank(kids[0], &rank), ncclSuccess);
  EXPECT_EQ(rank, 2);
  ASSERT_EQ(ncclCommCount(kids[1], &count), ncclSuccess);
  EXPECT_EQ(count, 2);  // odd ranks {1,3}
  destroyAll(kids);
  destroyAll(comms);
}

TEST(CommLifecycle, ShrinkExcludingARank) {
  MKTEST_REQUIRE_GPU();
  for (int flags : {NCCL_SHRINK_DEFAULT, NCCL_SHRINK_ABORT}) {
    const int n = 4;
    auto comms = initThreads(n);
    int exclude[1] = {2};
    std::vector<ncclComm_t> kids(n, nullptr);
    std::vector<std::thread> th;
    std::vector<ncclResult_t> res(n, ncclSuccess);
    for (int r = 0; r < n; r++) {
      if (r == 2) continue;  // the excluded rank does not call shrink
      th.emplace_back([&, r] {
        cudaSetDevice(0);
        res[r] = ncclCommShrink(comms[r], exclude, 1, &kids[r], nullptr, flags);
      });
    }
    for (auto& t : th) t.join();
    for (int r : {0, 1, 3}) {
      ASSERT_EQ(res[r], ncclSuccess) << "rank " << r << " flags " << flags;
      int rank = -1, count = -1;
      ASSERT_EQ(ncclCommUserRank(kids[r], &rank), ncclSuccess);
      ASSERT_EQ(ncclCommCount(kids[r], &count), ncclSuccess);
      EXPECT_EQ(count, 3);
      EXPECT_EQ(rank, r < 2 ? r : r - 1);
    }
    destroyAll(kids);
    for (auto c : comms) EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
  }
}

TEST(CommLifecycle, AbortFromAnotherThreadWhileInitWaits) {
  MKTEST_REQUIRE_GPU();
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  // Rank 0 of 2; rank 1 never comes.
  ncclResult_t res = ncclCommInitRankConfig(&comm, 2, id, 0, &cfg);
  ASSERT_TRUE(res == ncclInProgress || res == ncclSuccess);
  ASSERT_NE(comm, nullptr);
  usleep(200000);
  ncclResult_t st;
  ASSERT_EQ(ncclCommGetAsyncError(comm, &st), ncclSuccess);
  EXPECT_EQ(st, ncclInProgress);
  std::atomic<double> took{-1};
  std::thread aborter([&] {
    auto t0 = Clock::now();
    EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
    took = secondsSince(t0);
  });
  aborter.join();
  EXPECT_LT(took.load(), 5.0);
  // The GPU stays usable: a new comm works.
  auto comms = initThreads(2);
  checkComms(comms);
  destroyAll(comms);
}

TEST(CommLifecycle, FinalizeThenDestroyAndReuseAfterDestroy) {
  MKTEST_REQUIRE_GPU();
  auto comms = initThreads(2);
  for (auto c : comms) EXPECT_EQ(ncclCommFinalize(c), ncclSuccess);
  ncclComm_t first = comms[0];
  destroyAll(comms);
  int n;
  EXPECT_EQ(ncclCommCount(first, &n), ncclInvalidArgument);  // destroyed handle refused
}

TEST(CommLifecycle, RevokeThenShrinkAndDestroy) {
  MKTEST_REQUIRE_GPU();
  auto comms = initThreads(2);
  for (auto c : comms) EXPECT_EQ(ncclCommRevoke(c, NCCL_REVOKE_DEFAULT), ncclSuccess);
  float* buf;
  ASSERT_EQ(cudaMalloc(&buf, 64), cudaSuccess);
  EXPECT_EQ(ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, comms[0], nullptr), ncclInvalidUsage);
  cudaFree(buf);
  destroyAll(comms);
}

TEST(CommLifecycle, HundredCyclesLeaveNoFdsOrThreads) {
  MKTEST_REQUIRE_GPU();
  {  // warm up lazily created process-wide state (CUDA context, hwloc)
    auto comms = initThreads(2);
    destroyAll(comms);
  }
  usleep(100000);
  int fds = mktest::countOpenFds(), threads = mktest::countThreads();
  for (int i = 0; i < 100; i++) {
    auto comms = initThreads(2);
    destroyAll(comms);
  }
  usleep(300000);  // root threads exit after serving
  EXPECT_LE(mktest::countOpenFds(), fds);
  EXPECT_LE(mktest::countThreads(), threads);
}

}  // namespace
