// Proxy command ring with host producers: layout, ordering, wrap-around, several
// producer threads, back-pressure (bounded wait) and abort.
#include <cstdint>
#include <memory>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

#include "transport/proxy_ring.h"

using mk::ProxyCmd;
using mk::ProxyRing;

static_assert(offsetof(ProxyCmd, valid) == 0, "valid word first");
static_assert(offsetof(ProxyCmd, op) == 8 && offsetof(ProxyCmd, sigOp) == 12, "layout");
static_assert(offsetof(ProxyCmd, srcOff) == 24 && offsetof(ProxyCmd, value) == 56, "layout");
static_assert(sizeof(mk::ProxyRingCounters) == 256, "counters on separate lines");

namespace {

std::unique_ptr<ProxyRing> makeRing(uint64_t slots) {
  ProxyRing* r = nullptr;
  EXPECT_EQ(ProxyRing::create(slots, mk::ProxyRingMem::kHost, &r), ncclSuccess);
  return std::unique_ptr<ProxyRing>(r);
}

}  // namespace

TEST(ProxyRing, RoundsSlotsToPowerOfTwo) {
  auto r = makeRing(100);
  EXPECT_EQ(r->nslots(), 128u);
  ProxyRing* big = nullptr;
  EXPECT_EQ(ProxyRing::create(1ull << 30, mk::ProxyRingMem::kHost, &big), ncclInvalidArgument);
}

TEST(ProxyRing, SingleProducerOrderAndWrapAround) {
  auto r = makeRing(16);
  const uint64_t kN = 5000;  // > 300 laps
  std::thread prod([&] {
    for (uint64_t i = 0; i < kN; i++)
      ASSERT_EQ(
          r->putSignal(i % 7, i * 64, (1ull << 40) + i, i * 3, i % 5, i + 1, mk::kSignalSet, 5000),
          ncclSuccess);
  });
  uint64_t got = 0;
  ProxyCmd buf[8];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got < kN && std::chrono::steady_clock::now() < deadline) {
    uint64_t first;
    int n = r->poll(buf, 8, &first);
    ASSERT_EQ(first, got);
    for (int k = 0; k < n; k++, got++) {
      ASSERT_EQ(buf[k].op, (uint32_t)mk::kProxyPutSignal);
      ASSERT_EQ(buf[k].peer, got % 7);
      ASSERT_EQ(buf[k].srcOff, got * 64);
      ASSERT_EQ(buf[k].dstOff, (1ull << 40) + got);  // 64-bit offsets survive
      ASSERT_EQ(buf[k].bytes, got * 3);
      ASSERT_EQ(buf[k].slot, got % 5);
      ASSERT_EQ(buf[k].value, got + 1);
    }
    if (n)
      r->setDone(got);
    else
      std::this_thread::yield();
  }
  prod.join();
  EXPECT_EQ(got, kN);
  EXPECT_EQ(r->done(), kN);
}

TEST(ProxyRing, ManyProducersNoLossNoDuplicatePerProducerOrder) {
  auto r = makeRing(64);
  const int kProducers = 4;
  const uint64_t kPer = 5000;
  std::vector<std::thread> prods;
  for (int p = 0; p < kProducers; p++)
    prods.emplace_back([&, p] {
      for (uint64_t i = 0; i < kPer; i++)
        ASSERT_EQ(r->signal(/*peer=*/p, /*slot=*/i, /*value=*/i + 1, mk::kSignalAdd, 10000),
                  ncclSuccess);
    });
  std::vector<uint64_t> next(kProducers, 0);
  uint64_t total = 0;
  ProxyCmd buf[32];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (total < kProducers * kPer && std::chrono::steady_clock::now() < deadline) {
    uint64_t first;
    int n = r->poll(buf, 32, &first);
    for (int k = 0; k < n; k++) {
      int p = (int)buf[k].peer;
      ASSERT_LT(p, kProducers);
      ASSERT_EQ(buf[k].op, (uint32_t)mk::kProxySignal);
      ASSERT_EQ(buf[k].sigOp, (uint32_t)mk::kSignalAdd);
      // One producer's commands come out in its program order.
      ASSERT_EQ(buf[k].slot, next[p]) << "producer " << p;
      ASSERT_EQ(buf[k].value, next[p] + 1);
      next[p]++;
    }
    total += n;
    if (!n) std::this_thread::yield();
  }
  for (auto& t : prods) t.join();
  EXPECT_EQ(total, kProducers * kPer);
  for (int p = 0; p < kProducers; p++) EXPECT_EQ(next[p], kPer);
  EXPECT_EQ(r->tail(), kProducers * kPer);
}

TEST(ProxyRing, BackPressureBlocksThenTimesOut) {
  auto r = makeRing(8);
  for (int i = 0; i < 8; i++) ASSERT_EQ(r->put(0, i, i, 1, 1000), ncclSuccess);
  // Full: the next producer waits for the consumer...
  std::atomic<bool> pushed{false};
  std::thread t([&] {
    EXPECT_EQ(r->put(0, 8, 8, 1, 10000), ncclSuccess);
    pushed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(pushed.load());
  ProxyCmd buf[2];
  uint64_t first;
  ASSERT_EQ(r->poll(buf, 1, &first), 1);  // frees one slot
  t.join();
  EXPECT_TRUE(pushed.load());
  // ...and gives up after its bound when nobody consumes.
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(r->put(0, 9, 9, 1, 200), ncclRemoteError);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 0.15);
  EXPECT_LT(s, 5.0);
}

TEST(ProxyRing, AbortReleasesWaitingProducers) {
  auto r = makeRing(4);
  for (int i = 0; i < 4; i++) ASSERT_EQ(r->put(0, 0, 0, 0, 1000), ncclSuccess);
  std::vector<std::thread> ts;
  std::atomic<int> failed{0};
  for (int k = 0; k < 3; k++)
    ts.emplace_back([&] {
      if (r->put(0, 0, 0, 0, 60000) == ncclRemoteError) failed++;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto t0 = std::chrono::steady_clock::now();
  r->setAbort();
  for (auto& t : ts) t.join();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(failed.load(), 3);
  EXPECT_LT(s, 2.0);
  EXPECT_TRUE(r->aborted());
}

TEST(ProxyRing, ConsumerNeverSeesAHalfWrittenOrStaleSlot) {
  // A slot from the previous lap carries valid == ticket - nslots + 1: never "ready".
  auto r = makeRing(2);
  ProxyCmd buf[4];
  uint64_t first;
  for (uint64_t lap = 0; lap < 100; lap++) {
    ASSERT_EQ(r->put(1, lap, lap, 0, 1000), ncclSuccess);
    ASSERT_EQ(r->poll(buf, 4, &first), 1);
    ASSERT_EQ(buf[0].srcOff, lap);
    ASSERT_EQ(r->poll(buf, 4, &first), 0);
  }
}
