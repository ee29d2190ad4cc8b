// Multi-process bootstrap on loopback: the parent makes the id(s) (so the root runs in the
// parent), children init, allgather, barrier, send/recv, check and close. Fault cases kill one
// child before, during or after the rendezvous; the survivors must fail within the timeout.
#include <cstdint>
#include <gtest/gtest.h>

#include "common/test_util.h"
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "bootstrap/unique_id.h"
#include "base/param.h"
#include "mp/mp_util.h"

using namespace mk;
using namespace mktest;

namespace {

constexpr const char* kChild = "BootstrapMpChild.DISABLED_Rank";
constexpr int kFaultTimeoutS = 3;

using mktest::ScopedEnv;

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t valueOf(int src, int dst, int i) {
  uint64_t k[3] = {(uint64_t)src, (uint64_t)dst, (uint64_t)i};
  return bootstrapHash(k, sizeof(k));
}

// The normal life of a rank. Uses gtest assertions: the child's exit code reports them.
void childBasic(const std::vector<ncclUniqueId>& ids, int r, int n) {
  Bootstrap* b = nullptr;
  ASSERT_EQ(bootstrapInit(ids.data(), (int)ids.size(), r, n, nullptr, &b), ncclSuccess);
  ASSERT_EQ(bootstrapRank(b), r);
  ASSERT_EQ(bootstrapNRanks(b), n);
  std::vector<int64_t> pids(n, -1);
  pids[r] = getpid();
  ASSERT_EQ(bootstrapAllGather(b, pids.data(), sizeof(int64_t)), ncclSuccess);
  for (int p = 0; p < n; p++) EXPECT_GT(pids[p], 0) << p;
  if (n > 1) EXPECT_NE(pids[(r + 1) % n], pids[r]);  // really different processes
  std::vector<uint64_t> big(n * 1000);
  for (int i = 0; i < 1000; i++) big[r * 1000 + i] = valueOf(r, -1, i);
  ASSERT_EQ(bootstrapAllGather(b, big.data(), 1000 * sizeof(uint64_t)), ncclSuccess);
  for (int p = 0; p < n; p++)
    for (int i = 0; i < 1000; i++) ASSERT_EQ(big[p * 1000 + i], valueOf(p, -1, i));
  ASSERT_EQ(bootstrapBarrier(b), ncclSuccess);
  for (int p = 0; p < n; p++) {
    uint64_t v[3] = {valueOf(r, p, 0), valueOf(r, p, 1), valueOf(r, p, 2)};
    ASSERT_EQ(bootstrapSend(b, p, 42, v, sizeof(v)), ncclSuccess);
  }
  for (int k = 0; k < n; k++) {
    int p = (r + n - k) % n;  // a different order on every rank
    uint64_t v[3] = {};
    ASSERT_EQ(bootstrapRecv(b, p, 42, v, sizeof(v)), ncclSuccess);
    for (int i = 0; i < 3; i++) ASSERT_EQ(v[i], valueOf(p, r, i));
  }
  ASSERT_EQ(bootstrapBarrier(b), ncclSuccess);
  ASSERT_EQ(bootstrapClose(b), ncclSuccess);
}

// A survivor of a fault: whatever it was doing must fail, and in time.
void expectFailsInTime(std::chrono::steady_clock::time_point t0, ncclResult_t res) {
  EXPECT_NE(res, ncclSuccess);
  EXPECT_LT(secondsSince(t0), kFaultTimeoutS + 3.0);
}

[[noreturn]] void die() {
  kill(getpid(), SIGKILL);
  for (;;) pause();
}

}  // namespace

TEST(BootstrapMpChild, DISABLED_Rank) {
  if (!mpIsChild()) GTEST_SKIP() << "only runs as a child of the mp tests";
  const int r = mpRank(), n = mpNRanks();
  const std::string mode = mpEnv("MKTEST_MP_MODE");
  const int victim = atoi(mpEnv("MKTEST_MP_VICTIM").c_str());
  std::vector<ncclUniqueId> ids;
  std::string hex = mpEnv("MKTEST_MP_IDS");
  for (size_t off = 0; off + 2 * sizeof(ncclUniqueId) <= hex.size();
       off += 2 * sizeof(ncclUniqueId)) {
    ncclUniqueId u;
    ASSERT_TRUE(hexDecode(hex.substr(off, 2 * sizeof(u)), &u, sizeof(u)));
    ids.push_back(u);
  }
  if (mode == "commid") {  // no id from the parent: NCCL_COMM_ID is in the environment
    ids.resize(1);
    ASSERT_EQ(bootstrapGetUniqueId(&ids[0]), ncclSuccess);
  }
  ASSERT_FALSE(ids.empty());
  if (mode == "basic" || mode == "commid") {
    childBasic(ids, r, n);
    return;
  }
  Bootstrap* b = nullptr;
  auto t0 = std::chrono::steady_clock::now();
  if (mode == "kill_before") {
    if (r == victim) die();
    expectFailsInTime(t0, bootstrapInit(ids.data(), 1, r, n, nullptr, &b));
  } else if (mode == "kill_during") {
    if (r == victim) {  // registered with the root, then gone while waiting for its answer
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        die();
      }).detach();
      bootstrapInit(ids.data(), 1, r, n, nullptr, &b);
      die();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    t0 = std::chrono::steady_clock::now();
    expectFailsInTime(t0, bootstrapInit(ids.data(), 1, r, n, nullptr, &b));
  } else if (mode == "kill_after") {
    ASSERT_EQ(bootstrapInit(ids.data(), 1, r, n, nullptr, &b), ncclSuccess);
    if (r == victim) die();
    std::vector<int> v(n, r);
    t0 = std::chrono::steady_clock::now();
    expectFailsInTime(t0, bootstrapAllGather(b, v.data(), sizeof(int)));
  } else {
    FAIL() << "unknown mode " << mode;
  }
  EXPECT_EQ(bootstrapClose(b), ncclSuccess);
}

namespace {

std::vector<MpResult> runChildren(int n, const std::string& mode, int nIds, int victim = -1,
                                  std::vector<std::string> env = {}) {
  std::string hex;
  for (int i = 0; i < nIds; i++) {
    ncclUniqueId id;
    EXPECT_EQ(bootstrapGetUniqueId(&id), ncclSuccess);
    hex += hexEncode(&id, sizeof(id));
  }
  env.push_back("MKTEST_MP_MODE=" + mode);
  env.push_back("MKTEST_MP_IDS=" + hex);
  env.push_back("MKTEST_MP_VICTIM=" + std::to_string(victim));
  std::vector<pid_t> pids = mpSpawn(kChild, n, env);
  EXPECT_EQ((int)pids.size(), n);
  return mpWait(pids, 60000);
}

void expectAllPassed(const std::vector<MpResult>& res) {
  for (size_t i = 0; i < res.size(); i++)
    EXPECT_TRUE(res[i].exited && res[i].code == 0) << mpDescribe(res);
}

void expectSurvivorsFailedInTime(const std::vector<MpResult>& res, int victim) {
  for (size_t i = 0; i < res.size(); i++) {
    if ((int)i == victim) {
      EXPECT_TRUE(res[i].signaled && res[i].signal == SIGKILL && !res[i].timedOut)
          << mpDescribe(res);
    } else {
      EXPECT_TRUE(res[i].exited && res[i].code == 0) << mpDescribe(res);
      EXPECT_LT(res[i].seconds, kFaultTimeoutS + 8.0) << mpDescribe(res);
    }
  }
}

}  // namespace

class BootstrapMp : public ::testing::TestWithParam<int> {};

TEST_P(BootstrapMp, InitAllGatherBarrierSendRecv) {
  auto res = runChildren(GetParam(), "basic", 1);
  expectAllPassed(res);
  EXPECT_EQ(bootstrapRootsWait(5000), 0);
}
INSTANTIATE_TEST_SUITE_P(Procs, BootstrapMp, ::testing::Values(2, 4, 8, 16));

TEST(BootstrapMpMisc, SeveralRootsAcrossProcesses) {
  expectAllPassed(runChildren(6, "basic", 3));
  EXPECT_EQ(bootstrapRootsWait(5000), 0);
}

TEST(BootstrapMpMisc, CommIdRootStartedByRankZero) {
  Socket probe;
  socketInit(&probe, nullptr, 1000);
  SocketAddress any;
  ASSERT_EQ(socketAddressFromString("127.0.0.1:0", &any), ncclSuccess);
  ASSERT_EQ(socketListen(&probe, &any), ncclSuccess);
  std::string commId = "127.0.0.1:" + std::to_string(socketAddressPort(&probe.addr));
  socketClose(&probe);
  std::vector<pid_t> pids = mpSpawn(kChild, 4, {"MKTEST_MP_MODE=commid", "NCCL_COMM_ID=" + commId});
  expectAllPassed(mpWait(pids, 60000));
}

class BootstrapMpFault : public ::testing::Test {
 protected:
  // The root runs in this process and reads the timeout when it starts.
  ScopedEnv timeout_{"MKERNEL_BOOTSTRAP_TIMEOUT_S", std::to_string(kFaultTimeoutS).c_str()};
};

TEST_F(BootstrapMpFault, RankKilledBeforeRendezvous) {
  expectSurvivorsFailedInTime(runChildren(4, "kill_before", 1, 3), 3);
  EXPECT_EQ(bootstrapRootsWait(kFaultTimeoutS * 1000 + 3000), 0);
}

TEST_F(BootstrapMpFault, RankKilledDuringRendezvous) {
  expectSurvivorsFailedInTime(runChildren(4, "kill_during", 1, 1), 1);
  EXPECT_EQ(bootstrapRootsWait(kFaultTimeoutS * 1000 + 3000), 0);
}

TEST_F(BootstrapMpFault, RankKilledAfterInit) {
  auto t0 = std::chrono::steady_clock::now();
  expectSurvivorsFailedInTime(runChildren(4, "kill_after", 1, 2), 2);
  // A dead peer is noticed from its closed connections, not by waiting for the timeout.
  EXPECT_LT(secondsSince(t0), kFaultTimeoutS + 2.0);
  EXPECT_EQ(bootstrapRootsWait(3000), 0);
}
