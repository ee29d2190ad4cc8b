// Bootstrap of N ranks as threads of one process: init (one or several roots), allgather,
// barrier, tagged send/recv, split and shrink-style subsets.
#include <cstdint>
#include <utility>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/ifaces.h"
#include "bootstrap/proto.h"
#include "bootstrap/unique_id.h"
#include "common/test_util.h"
#include "base/debug.h"
#include "base/param.h"

using namespace mk;

namespace {

using mktest::ScopedEnv;

void runRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> t;
  for (int r = 0; r < n; r++) t.emplace_back(fn, r);
  for (auto& x : t) x.join();
}

ncclUniqueId newId() {
  ncclUniqueId u;
  EXPECT_EQ(bootstrapGetUniqueId(&u), ncclSuccess);
  return u;
}

uint64_t wordOf(uint64_t seed, uint64_t a, uint64_t b, size_t w) {
  uint64_t k[4] = {seed, a, b, (uint64_t)w};
  return bootstrapHash(k, sizeof(k));
}

// Deterministic pseudo-random bytes for (seed, a, b): one hash per 8 bytes.
void fill(uint8_t* p, size_t n, uint64_t seed, uint64_t a, uint64_t b) {
  for (size_t w = 0; w * 8 < n; w++) {
    uint64_t v = wordOf(seed, a, b, w);
    memcpy(p + w * 8, &v, n - w * 8 < 8 ? n - w * 8 : 8);
  }
}

bool check(const uint8_t* p, size_t n, uint64_t seed, uint64_t a, uint64_t b) {
  for (size_t w = 0; w * 8 < n; w++) {
    uint64_t v = wordOf(seed, a, b, w);
    if (memcmp(p + w * 8, &v, n - w * 8 < 8 ? n - w * 8 : 8) != 0) return false;
  }
  return true;
}

size_t msgSize(uint64_t seed, int src, int dst) {
  uint64_t k[3] = {seed, (uint64_t)src, (uint64_t)dst};
  size_t s = bootstrapHash(k, sizeof(k)) % 20000;
  return s % 3 == 0 ? 0 : s;  // some empty messages too
}

// Allgather of several sizes, barriers, and all-pairs send/recv received in another order than
// sent (exercises the unexpected-message queue). Returns false on the first failure.
void exercise(Bootstrap* b, uint64_t seed) {
  int r = bootstrapRank(b), n = bootstrapNRanks(b);
  for (size_t sz : {(size_t)0, (size_t)1, (size_t)37, (size_t)4096, (size_t)4097, (size_t)100000}) {
    std::vector<uint8_t> buf(n * sz, 0xEE);
    fill(buf.data() + r * sz, sz, seed, r, sz);
    ASSERT_EQ(bootstrapAllGather(b, buf.data(), sz), ncclSuccess) << "rank " << r;
    for (int p = 0; p < n; p++)
      ASSERT_TRUE(check(buf.data() + p * sz, sz, seed, p, sz)) << "slice " << p << " size " << sz;
  }
  for (int i = 0; i < 3; i++) ASSERT_EQ(bootstrapBarrier(b), ncclSuccess);
  for (int p = 0; p < n; p++) {
    std::vector<uint8_t> m(msgSize(seed, r, p));
    fill(m.data(), m.size(), seed, 1000 + r, p);
    ASSERT_EQ(bootstrapSend(b, p, 1000 + r, m.data(), m.size()), ncclSuccess);
  }
  for (int p = n - 1; p >= 0; p--) {
    std::vector<uint8_t> m(msgSize(seed, p, r), 0xEE);
    ASSERT_EQ(bootstrapRecv(b, p, 1000 + p, m.data(), m.size()), ncclSuccess);
    ASSERT_TRUE(check(m.data(), m.size(), seed, 1000 + p, r)) << "from " << p;
  }
  ASSERT_EQ(bootstrapBarrier(b), ncclSuccess);
}

}  // namespace

class BootstrapThreads : public ::testing::TestWithParam<int> {};

TEST_P(BootstrapThreads, InitCollectivesSendRecvClose) {
  const int n = GetParam();
  ncclUniqueId id = newId();
  uint64_t seed = mktest::testSeed();
  runRanks(n, [&](int r) {
    Bootstrap* b = nullptr;
    ASSERT_EQ(bootstrapInit(&id, 1, r, n, nullptr, &b), ncclSuccess);
    EXPECT_EQ(bootstrapRank(b), r);
    EXPECT_EQ(bootstrapNRanks(b), n);
    exercise(b, seed);
    EXPECT_EQ(bootstrapClose(b), ncclSuccess);
  });
  EXPECT_EQ(bootstrapRootsWait(5000), 0);
}
INSTANTIATE_TEST_SUITE_P(N, BootstrapThreads, ::testing::Values(1, 2, 3, 8));

struct ScalableCase {
  int nranks, nIds;
};
class BootstrapScalable : public ::testing::TestWithParam<ScalableCase> {};

TEST_P(BootstrapScalable, SeveralRootsMergeIntoOneRing) {
  const ScalableCase c = GetParam();
  std::vector<ncclUniqueId> ids;
  for (int i = 0; i < c.nIds; i++) ids.push_back(newId());
  uint64_t seed = mktest::testSeed() + 1;
  runRanks(c.nranks, [&](int r) {
    Bootstrap* b = nullptr;
    ASSERT_EQ(bootstrapInit(ids.data(), c.nIds, r, c.nranks, nullptr, &b), ncclSuccess);
    exercise(b, seed);
    EXPECT_EQ(bootstrapClose(b), ncclSuccess);
  });
  EXPECT_EQ(bootstrapRootsWait(5000), 0);
}
INSTANTIATE_TEST_SUITE_P(Ids, BootstrapScalable,
                         ::testing::Values(ScalableCase{8, 2}, ScalableCase{8, 3},
                                           ScalableCase{4, 4}, ScalableCase{5, 2},
                                           ScalableCase{2, 2}));

TEST(Bootstrap, MessagesMatchByTagWhateverTheOrder) {
  ncclUniqueId id = newId();
  runRanks(2, [&](int r) {
    Bootstrap* b = nullptr;
    ASSERT_EQ(bootstrapInit(&id, 1, r, 2, nullptr, &b), ncclSuccess);
    if (r == 0) {
      for (int tag = 1; tag <= 5; tag++) ASSERT_EQ(bootstrapSend(b, 1, tag, &tag, 4), ncclSuccess);
      // Same tag twice: delivered in order.
      int v1 = 100, v2 = 200;
      ASSERT_EQ(bootstrapSend(b, 1, -7, &v1, 4), ncclSuccess);
      ASSERT_EQ(bootstrapSend(b, 1, -7, &v2, 4), ncclSuccess);
    } else {
      for (int tag = 5; tag >= 1; tag--) {
        int v = 0;
        ASSERT_EQ(bootstrapRecv(b, 0, tag, &v, 4), ncclSuccess);
        EXPECT_EQ(v, tag);
      }
      int v = 0;
      ASSERT_EQ(bootstrapRecv(b, 0, -7, &v, 4), ncclSuccess);
      EXPECT_EQ(v, 100);
      ASSERT_EQ(bootstrapRecv(b, 0, -7, &v, 4), ncclSuccess);
      EXPECT_EQ(v, 200);
    }
    // Sizes must match; the mismatch is an error, not a truncation.
    int x = 1;
    long long big = 0;
    ASSERT_EQ(bootstrapSend(b, 1 - r, 9, &x, sizeof(x)), ncclSuccess);
    EXPECT_EQ(bootstrapRecv(b, 1 - r, 9, &big, sizeof(big)), ncclInternalError);
    EXPECT_EQ(bootstrapSend(b, 2, 0, &x, 4), ncclInvalidArgument);
    EXPECT_EQ(bootstrapRecv(b, -1, 0, &x, 4), ncclInvalidArgument);
    ASSERT_EQ(bootstrapBarrier(b), ncclSuccess);
    EXPECT_EQ(bootstrapClose(b), ncclSuccess);
  });
}

// A message over the wire limit (kBootstrapMaxMsgBytes) is refused by the sender, naming the
// limit, before it reads a byte of the data: the receiver would drop the whole connection.
// The connection then still carries the next message.
TEST(Bootstrap, OversizedMessageRefusedBySenderConnectionLivesOn) {
  ncclUniqueId id = newId();
  runRanks(2, [&](int r) {
    Bootstrap* b = nullptr;
    ASSERT_EQ(bootstrapInit(&id, 1, r, 2, nullptr, &b), ncclSuccess);
    if (r == 0) {
      int small = 0;  // never read: the size is refused first
      EXPECT_EQ(bootstrapSend(b, 1, 3, &small, (size_t)kBootstrapMaxMsgBytes + 1),
                ncclInvalidArgument);
      EXPECT_NE(std::string(mk::lastError()).find("exceeds the limit"), std::string::npos)
          << mk::lastError();
      const int v = 42;
      ASSERT_EQ(bootstrapSend(b, 1, 4, &v, sizeof(v)), ncclSuccess);
    } else {
      int v = 0;
      ASSERT_EQ(bootstrapRecv(b, 0, 4, &v, sizeof(v)), ncclSuccess);
      EXPECT_EQ(v, 42);
    }
    ASSERT_EQ(bootstrapBarrier(b), ncclSuccess);
    EXPECT_EQ(bootstrapClose(b), ncclSuccess);
  });
}

TEST(Bootstrap, LargeCrossingSendsDoNotDeadlock) {
  // Both ranks send 8 MiB and only then post their receives: a send must complete without the
  // matching recv (the receiver thread drains incoming data into the queue).
  ncclUniqueId id = newId();
  const size_t sz = 8 << 20;
  uint64_t seed = mktest::testSeed() + 2;
  std::atomic<int> sent{0};
  runRanks(2, [&](int r) {
    Bootstrap* b = nullptr;
    ASSERT_EQ(bootstrapInit(&id, 1, r, 2, nullptr, &b), ncclSuccess);
    std::vector<uint8_t> out(sz), in(sz);
    fill(out.data(), sz, seed, r, 0);
    ASSERT_EQ(bootstrapSend(b, 1 - r, 3, out.data(), sz), ncclSuccess);
    sent++;
    auto t0 = std::chrono::steady_clock::now();  // bounded: the other rank may have failed
    while (sent.load() < 2 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(sent.load(), 2);
    ASSERT_EQ(bootstrapRecv(b, 1 - r, 3, in.data(), sz), ncclSuccess);
    EXPECT_TRUE(check(in.data(), sz, seed, 1 - r, 0));
    EXPECT_EQ(bootstrapClose(b), ncclSuccess);
  });
}

TEST(Bootstrap, ConcurrentSplits) {
  const int n = 8;
  ncclUniqueId id = newId();
  uint64_t seed = mktest::testSeed() + 3;
  runRanks(n, [&](int r) {
    Bootstrap* parent = nullptr;
    ASSERT_EQ(bootstrapInit(&id, 1, r, n, nullptr, &parent), ncclSuccess);
    // Split A: by parity, children ordered by descending parent rank. Split B: halves.
    std::vector<int> a, bm;
    for (int p = n - 1; p >= 0; p--)
      if (p % 2 == r % 2) a.push_back(p);
    for (int p = 0; p < n; p++)
      if ((p < n / 2) == (r < n / 2)) bm.push_back(p);
    Bootstrap* ca = nullptr;
    Bootstrap* cb = nullptr;
    uint32_t abortA = 0, abortB = 0;
    std::thread ta([&] {
      int me = (int)(std::find(a.begin(), a.end(), r) - a.begin());
      EXPECT_EQ(bootstrapSplit(parent, a.data(), (int)a.size(), me, 11, &abortA, &ca), ncclSuccess);
    });
    int me = (int)(std::find(bm.begin(), bm.end(), r) - bm.begin());
    EXPECT_EQ(bootstrapSplit(parent, bm.data(), (int)bm.size(), me, 12, &abortB, &cb), ncclSuccess);
    ta.join();
    ASSERT_NE(ca, nullptr);
    ASSERT_NE(cb, nullptr);
    for (auto [child, members] : {std::make_pair(ca, &a), std::make_pair(cb, &bm)}) {
      int cr = bootstrapRank(child);
      ASSERT_EQ(bootstrapNRanks(child), (int)members->size());
      EXPECT_EQ((*members)[cr], r);
      std::vector<int> ranks(members->size(), -1);
      ranks[cr] = r;
      ASSERT_EQ(bootstrapAllGather(child, ranks.data(), sizeof(int)), ncclSuccess);
      EXPECT_EQ(ranks, *members);
      exercise(child, seed);
    }
    // A split of a split works too.
    std::vector<int> sub = {0, 1};
    if (bootstrapRank(cb) < 2) {
      Bootstrap* cc = nullptr;
      ASSERT_EQ(bootstrapSplit(cb, sub.data(), 2, bootstrapRank(cb), 5, nullptr, &cc), ncclSuccess);
      exercise(cc, seed);
      EXPECT_EQ(bootstrapClose(cc), ncclSuccess);
    }
    EXPECT_EQ(bootstrapClose(ca), ncclSuccess);
    EXPECT_EQ(bootstrapClose(cb), ncclSuccess);
    // The parent still works after its children are gone.
    ASSERT_EQ(bootstrapBarrier(parent), ncclSuccess);
    EXPECT_EQ(bootstrapClose(parent), ncclSuccess);
  });
}

TEST(Bootstrap, ShrinkStyleSplitSkipsDeadRanks) {
  const int n = 5;
  ncclUniqueId id = newId();
  uint64_t seed = mktest::testSeed() + 4;
  std::vector<int> members = {0, 2, 4};
  runRanks(n, [&](int r) {
    Bootstrap* parent = nullptr;
    ASSERT_EQ(bootstrapInit(&id, 1, r, n, nullptr, &parent), ncclSuccess);
    ASSERT_EQ(bootstrapBarrier(parent), ncclSuccess);
    if (r == 3) {  // "dies": its endpoint disappears
      EXPECT_EQ(bootstrapClose(parent), ncclSuccess);
      return;
    }
    if (r == 1) {  // alive but excluded: must not be needed
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      EXPECT_EQ(bootstrapClose(parent), ncclSuccess);
      return;
    }
    int me = (int)(std::find(members.begin(), members.end(), r) - members.begin());
    Bootstrap* child = nullptr;
    ASSERT_EQ(bootstrapSplit(parent, members.data(), 3, me, 77, nullptr, &child), ncclSuccess);
    exercise(child, seed);
    EXPECT_EQ(bootstrapClose(child), ncclSuccess);
    EXPECT_EQ(bootstrapClose(parent), ncclSuccess);
  });
}

TEST(Bootstrap, SplitArgumentChecks) {
  ncclUniqueId id = newId();
  Bootstrap* b = nullptr;
  ASSERT_EQ(bootstrapInit(&id, 1, 0, 1, nullptr, &b), ncclSuccess);
  Bootstrap* c = nullptr;
  int m0[] = {0}, m1[] = {1}, mdup[] = {0, 0};
  EXPECT_EQ(bootstrapSplit(nullptr, m0, 1, 0, 0, nullptr, &c), ncclInvalidArgument);
  EXPECT_EQ(bootstrapSplit(b, m0, 0, 0, 0, nullptr, &c), ncclInvalidArgument);
  EXPECT_EQ(bootstrapSplit(b, m1, 1, 0, 0, nullptr, &c), ncclInvalidArgument);
  EXPECT_EQ(bootstrapSplit(b, mdup, 2, 0, 0, nullptr, &c), ncclInvalidArgument);
  EXPECT_EQ(bootstrapSplit(b, m0, 1, 1, 0, nullptr, &c), ncclInvalidArgument);
  ASSERT_EQ(bootstrapSplit(b, m0, 1, 0, 0, nullptr, &c), ncclSuccess);
  EXPECT_EQ(bootstrapNRanks(c), 1);
  int v = 5, w = 0;
  EXPECT_EQ(bootstrapSend(c, 0, 1, &v, 4), ncclSuccess);  // to self
  EXPECT_EQ(bootstrapRecv(c, 0, 1, &w, 4), ncclSuccess);
  EXPECT_EQ(w, 5);
  EXPECT_EQ(bootstrapClose(c), ncclSuccess);
  EXPECT_EQ(bootstrapClose(b), ncclSuccess);
  EXPECT_EQ(bootstrapClose(nullptr), ncclSuccess);
}

TEST(Bootstrap, WorksOverIpv6) {
  ScopedEnv fam("NCCL_SOCKET_FAMILY", "AF_INET6");
  ScopedEnv ifn("NCCL_SOCKET_IFNAME", "=lo");
  SocketAddress a;
  if (ifBootstrapAddress(&a, nullptr) != ncclSuccess) GTEST_SKIP() << "no IPv6 on lo";
  Socket probe;
  socketInit(&probe, nullptr, 1000);
  if (socketListen(&probe, &a) != ncclSuccess) GTEST_SKIP() << "cannot listen on IPv6 lo";
  socketClose(&probe);
  ncclUniqueId id = newId();
  BootstrapId d;
  ASSERT_EQ(bootstrapIdDecode(&id, &d), ncclSuccess);
  EXPECT_EQ(d.root.sa.sa_family, AF_INET6);
  uint64_t seed = mktest::testSeed() + 5;
  runRanks(3, [&](int r) {
    Bootstrap* b = nullptr;
    ASSERT_EQ(bootstrapInit(&id, 1, r, 3, nullptr, &b), ncclSuccess);
    exercise(b, seed);
    EXPECT_EQ(bootstrapClose(b), ncclSuccess);
  });
}
