// What a peer holding the secret may make the bootstrap root believe: a hello claiming 2^22
// ranks must cost the root nothing up front (it allocates per rank that arrives), must not keep
// the real ranks from completing, and is refused outright once the id's creator has said how
// many ranks it expects.
#include <cstdint>
#include <gtest/gtest.h>
#include <malloc.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/proto.h"
#include "bootstrap/root.h"
#include "bootstrap/unique_id.h"
#include "common/test_util.h"
#include "unit/bootstrap_raw.h"

using namespace mk;
using bstest::closedWithin;
using bstest::Hello;
using bstest::rawSend;
using bstest::validHello;
using mktest::ScopedEnv;

namespace {

// A connection that has sent hello h to the root.
Socket sendHello(const SocketAddress& to, const Hello& h) {
  return rawSend(to, &h, sizeof(h));
}

// Bytes of heap in use, mmapped blocks included (the old root's tables were mmapped).
int64_t heapBytes() {
  struct mallinfo2 m = mallinfo2();
  return (int64_t)(m.uordblks + m.hblkhd);
}

int runRanks(const ncclUniqueId& id, int first, int n, int nranks) {
  std::atomic<int> ok{0};
  std::vector<std::thread> t;
  for (int r = first; r < first + n; r++)
    t.emplace_back([&, r] {
      Bootstrap* b = nullptr;
      if (bootstrapInit(&id, 1, r, nranks, nullptr, &b) != ncclSuccess) return;
      std::vector<int> v(nranks, -1);
      v[r] = 7 * r;
      bool good = bootstrapAllGather(b, v.data(), sizeof(int)) == ncclSuccess;
      for (int i = 0; i < nranks && good; i++) good = v[i] == 7 * i;
      if (bootstrapClose(b) == ncclSuccess && good) ok++;
    });
  for (auto& x : t) x.join();
  return ok.load();
}

}  // namespace

TEST(AbuseClaims, HugeNranksClaimCostsNothingAndRealRanksComplete) {
  ScopedEnv t("MKERNEL_BOOTSTRAP_TIMEOUT_S", "10");
  ncclUniqueId id;
  ASSERT_EQ(bootstrapGetUniqueId(&id), ncclSuccess);
  BootstrapId d;
  ASSERT_EQ(bootstrapIdDecode(&id, &d), ncclSuccess);
  const int64_t before = heapBytes();
  // The fake arrives first, before anyone has told the root what to expect.
  Socket fake = sendHello(d.root, validHello(d.secret, 5, kBootstrapMaxRanks));
  Socket fake2 = sendHello(d.root, validHello(d.secret, 0, kBootstrapMaxRanks - 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the root has read them
  const int64_t grown = heapBytes() - before;
  printf("[claims] heap growth after two hellos claiming ~2^22 ranks: %lld bytes\n",
         (long long)grown);
  EXPECT_LT(grown, 4ll << 20);
  const int n = 3;
  EXPECT_EQ(runRanks(id, 0, n, n), n);
  EXPECT_TRUE(closedWithin(&fake, 2000));  // dropped once the real group completed
  EXPECT_TRUE(closedWithin(&fake2, 2000));
  socketClose(&fake);
  socketClose(&fake2);
  EXPECT_EQ(bootstrapRootsWait(5000), 0);
}

TEST(AbuseClaims, CreatorsExpectationRefusesOtherClaims) {
  ScopedEnv t("MKERNEL_BOOTSTRAP_TIMEOUT_S", "10");
  ncclUniqueId id;
  ASSERT_EQ(bootstrapGetUniqueId(&id), ncclSuccess);
  BootstrapId d;
  ASSERT_EQ(bootstrapIdDecode(&id, &d), ncclSuccess);
  const int n = 3;
  // Rank 0 runs in the process that made the id: its init tells the root to expect n ranks.
  std::atomic<int> ok0{-1};
  std::thread r0([&] { ok0 = runRanks(id, 0, 1, n); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int claim : {kBootstrapMaxRanks, n + 1, n - 1}) {
    Socket fake = sendHello(d.root, validHello(d.secret, 1, claim));
    EXPECT_TRUE(closedWithin(&fake, 1000)) << "a claim of " << claim << " ranks was kept";
    socketClose(&fake);
  }
  EXPECT_EQ(runRanks(id, 1, n - 1, n), n - 1);
  r0.join();
  EXPECT_EQ(ok0.load(), 1);
  EXPECT_EQ(bootstrapRootsWait(5000), 0);
}

TEST(AbuseClaims, CommIdRootKnowsNranksFromTheStart) {
  ScopedEnv t("MKERNEL_BOOTSTRAP_TIMEOUT_S", "10");
  Socket probe;
  socketInit(&probe, nullptr, 1000);
  SocketAddress any;
  ASSERT_EQ(socketAddressFromString("127.0.0.1:0", &any), ncclSuccess);
  ASSERT_EQ(socketListen(&probe, &any), ncclSuccess);
  std::string commId = "127.0.0.1:" + std::to_string(socketAddressPort(&probe.addr));
  socketClose(&probe);
  ScopedEnv e("NCCL_COMM_ID", commId.c_str());
  ncclUniqueId id;
  ASSERT_EQ(bootstrapGetUniqueId(&id), ncclSuccess);
  BootstrapId d;
  ASSERT_EQ(bootstrapIdDecode(&id, &d), ncclSuccess);
  const int n = 2;
  std::atomic<int> ok0{-1};
  std::thread r0([&] { ok0 = runRanks(id, 0, 1, n); });  // starts the root
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Socket fake = sendHello(d.root, validHello(d.secret, 1, kBootstrapMaxRanks));
  EXPECT_TRUE(closedWithin(&fake, 1000));
  socketClose(&fake);
  EXPECT_EQ(runRanks(id, 1, 1, n), 1);
  r0.join();
  EXPECT_EQ(ok0.load(), 1);
  EXPECT_EQ(bootstrapRootsWait(5000), 0);
}
