// Proxy command ring with host producers: layout, ordering, wrap-around, several
// producer threads, back-pressure (bounded wait) and abort.
#include <cstdint>
#include <memory>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/test_util.h"
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

// An inline put as the consumer sees it: poll's out[k..] decoded the way the proxy does
// (drainRings). Fails the test on a header whose group poll cut short.
struct InlinePut {
  ProxyCmd cmd;
  std::vector<uint8_t> data;
};
int decodeOne(const ProxyCmd* out, int n, int k, InlinePut* p) {
  p->cmd = out[k];
  const uint64_t g = mk::proxyGroupSlots(out[k].op, out[k].bytes);
  EXPECT_LE((uint64_t)k + g, (uint64_t)n) << "poll handed out a partial group";
  if ((uint64_t)k + g > (uint64_t)n) return n - k;
  p->data.assign(out[k].bytes, 0);
  if (out[k].op & mk::kProxyInline) {
    memcpy(p->data.data(), &out[k].srcOff, std::min<uint64_t>(out[k].bytes, mk::kProxyInlineMax));
    for (uint64_t j = 1; j < g; j++) {
      const uint64_t off = mk::kProxyInlineMax + (j - 1) * mk::kProxyContBytes;
      memcpy(p->data.data() + off, reinterpret_cast<const char*>(&out[k + j]) + 8,
             std::min<uint64_t>(out[k].bytes - off, mk::kProxyContBytes));
    }
  }
  return (int)g;
}
// Deterministic bytes of producer p's i-th put (mixed with the run's seed).
uint8_t byteOf(uint64_t seed, int p, uint64_t i, uint64_t b) {
  uint64_t x = seed ^ ((uint64_t)p << 56) ^ (i << 8) ^ b;
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull;
  return (uint8_t)(x >> 29);
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

TEST(ProxyRingInline, GroupSizes) {
  using mk::kProxyInline;
  using mk::kProxyPut;
  EXPECT_EQ(mk::proxyGroupSlots(kProxyPut | kProxyInline, 8), 1u);
  EXPECT_EQ(mk::proxyGroupSlots(kProxyPut | kProxyInline, 9), 2u);
  EXPECT_EQ(mk::proxyGroupSlots(kProxyPut | kProxyInline, 64), 2u);
  EXPECT_EQ(mk::proxyGroupSlots(kProxyPut | kProxyInline, 65), 1u);  // refused by the proxy
  EXPECT_EQ(mk::proxyGroupSlots(kProxyPut, 64), 1u);                 // window-sourced
}

// Every size 1..64 in a 4-slot ring, behind a varying number of single commands, so groups
// start at every slot index, including the last one (the group wraps to slot 0).
TEST(ProxyRingInline, GroupsWrapAroundAndComeOutWhole) {
  auto r = makeRing(4);
  const uint64_t seed = mktest::testSeed();
  ProxyCmd out[8];
  uint64_t first = 0, expectTicket = 0;
  for (uint64_t i = 0; i < 64 * 4; i++) {
    const uint64_t bytes = 1 + i % 64;
    for (uint64_t s = 0; s < i % 3; s++) {
      ASSERT_EQ(r->signal(0, s, i, mk::kSignalSet, 1000), ncclSuccess);
      ASSERT_EQ(r->poll(out, 8, &first), 1);
      ASSERT_EQ(first, expectTicket++);
    }
    std::vector<uint8_t> src(bytes);
    for (uint64_t b = 0; b < bytes; b++) src[b] = byteOf(seed, 0, i, b);
    ProxyCmd c = {};
    c.op = mk::kProxyPutSignal;
    c.peer = 1, c.dstOff = i * 80, c.slot = 3, c.value = i + 1;
    ASSERT_EQ(r->pushInline(c, src.data(), bytes, 1000), ncclSuccess);
    const int n = r->poll(out, 8, &first);
    const uint64_t g = mk::proxyGroupSlots(mk::kProxyPutSignal | mk::kProxyInline, bytes);
    ASSERT_EQ((uint64_t)n, g) << "bytes " << bytes;
    ASSERT_EQ(first, expectTicket);
    expectTicket += g;
    InlinePut p;
    ASSERT_EQ((uint64_t)decodeOne(out, n, 0, &p), g);
    EXPECT_EQ(p.cmd.op, (uint32_t)(mk::kProxyPutSignal | mk::kProxyInline));
    EXPECT_EQ(p.cmd.bytes, bytes);
    EXPECT_EQ(p.cmd.dstOff, i * 80);
    EXPECT_EQ(p.cmd.value, i + 1);
    ASSERT_EQ(p.data, src) << "bytes " << bytes << " at ticket " << first;
    EXPECT_EQ(r->poll(out, 8, &first), 0);
  }
  EXPECT_EQ(r->tail(), expectTicket);
}

// A group whose continuation slot is not yet valid stays in the ring (poll returns what came
// before it, then nothing), and so does a complete group that does not fit in max.
TEST(ProxyRingInline, PartialGroupIsNeverConsumed) {
  auto r = makeRing(8);
  mk::ProxyRingView v = r->hostView();
  ASSERT_EQ(r->put(0, 1, 2, 3, 1000), ncclSuccess);  // ticket 0
  // A producer in the middle of a group: tickets 1 and 2 taken, header written first.
  const uint64_t t = __atomic_fetch_add(v.tail, 2, __ATOMIC_RELAXED);
  ASSERT_EQ(t, 1u);
  ProxyCmd* h = &v.slots[t & (v.nslots - 1)];
  h->op = mk::kProxyPut | mk::kProxyInline;
  h->peer = 0, h->dstOff = 0, h->bytes = 20, h->srcOff = 0x1111111111111111ull;
  __atomic_store_n(&h->valid, t + 1, __ATOMIC_RELEASE);
  ProxyCmd out[8];
  uint64_t first = 0;
  ASSERT_EQ(r->poll(out, 8, &first), 1);  // ticket 0 only
  EXPECT_EQ(out[0].srcOff, 1u);
  for (int k = 0; k < 3; k++) EXPECT_EQ(r->poll(out, 8, &first), 0);
  ProxyCmd* c = &v.slots[(t + 1) & (v.nslots - 1)];
  memset(reinterpret_cast<char*>(c) + 8, 0x22, 56);
  __atomic_store_n(&c->valid, t + 2, __ATOMIC_RELEASE);
  EXPECT_EQ(r->poll(out, 1, &first), 0);  // complete but does not fit
  ASSERT_EQ(r->poll(out, 8, &first), 2);
  EXPECT_EQ(first, 1u);
  InlinePut p;
  ASSERT_EQ(decodeOne(out, 2, 0, &p), 2);
  for (int b = 0; b < 20; b++) EXPECT_EQ(p.data[b], b < 8 ? 0x11 : 0x22) << b;
}

// Back-pressure is on the group's LAST slot: with one slot free a 2-slot group waits for
// the consumer, then goes; a ring smaller than a group refuses it.
TEST(ProxyRingInline, BackPressureOnTheLastSlotOfAGroup) {
  auto r = makeRing(4);
  for (int i = 0; i < 3; i++) ASSERT_EQ(r->put(0, i, i, 1, 1000), ncclSuccess);
  uint8_t src[64];
  for (int b = 0; b < 64; b++) src[b] = (uint8_t)(b + 1);
  std::atomic<bool> pushed{false};
  std::thread t([&] {
    ProxyCmd c = {};
    c.op = mk::kProxyPut;
    EXPECT_EQ(r->pushInline(c, src, 64, 10000), ncclSuccess);
    pushed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(pushed.load());
  ProxyCmd out[8];
  uint64_t first;
  ASSERT_EQ(r->poll(out, 1, &first), 1);  // frees one slot: the group's last one fits
  t.join();
  EXPECT_TRUE(pushed.load());
  ASSERT_EQ(r->poll(out, 8, &first), 4);  // two singles, then the whole group
  InlinePut p;
  ASSERT_EQ(decodeOne(out, 4, 2, &p), 2);
  EXPECT_EQ(p.data, std::vector<uint8_t>(src, src + 64));
  // Timeout and abort apply to groups as to single commands.
  for (int i = 0; i < 3; i++) ASSERT_EQ(r->put(0, i, i, 1, 1000), ncclSuccess);
  ProxyCmd c = {};
  c.op = mk::kProxyPut;
  EXPECT_EQ(r->pushInline(c, src, 9, 200), ncclRemoteError);  // ring has one slot free
  r->setAbort();
  EXPECT_EQ(r->pushInline(c, src, 9, 60000), ncclRemoteError);
  auto one = makeRing(1);
  EXPECT_EQ(one->pushInline(c, src, 9, 1000), ncclInvalidArgument);
  EXPECT_EQ(one->pushInline(c, src, 65, 1000), ncclInvalidArgument);
}

// Concurrent producers mixing single commands and inline puts of 1..64 bytes in a small ring
// (many laps, groups across the wrap): every put comes out whole, every byte as written, each
// producer's in its program order.
TEST(ProxyRingInline, ConcurrentProducersMixGroupsAndSingles) {
  auto r = makeRing(8);
  const uint64_t seed = mktest::testSeed();
  const int kProducers = 4;
  const uint64_t kPer = 2000;
  std::vector<std::thread> prods;
  for (int p = 0; p < kProducers; p++)
    prods.emplace_back([&, p] {
      std::vector<uint8_t> buf(64);
      for (uint64_t i = 0; i < kPer; i++) {
        const uint64_t bytes = 1 + (i * 7 + (uint64_t)p * 13) % 64;
        ProxyCmd c = {};
        c.op = mk::kProxyPut;
        c.peer = (uint64_t)p, c.dstOff = i;
        if (i % 5 == 4) {
          ASSERT_EQ(r->put((uint64_t)p, 0, i, 0, 20000), ncclSuccess);
          continue;
        }
        for (uint64_t b = 0; b < bytes; b++) buf[b] = byteOf(seed, p, i, b);
        ASSERT_EQ(r->pushInline(c, buf.data(), bytes, 20000), ncclSuccess);
      }
    });
  std::vector<uint64_t> next(kProducers, 0);
  uint64_t total = 0, slots = 0, groups = 0;
  ProxyCmd out[16];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (total < kProducers * kPer && std::chrono::steady_clock::now() < deadline) {
    uint64_t first;
    const int n = r->poll(out, 16, &first);
    ASSERT_EQ(first, slots);
    for (int k = 0; k < n;) {
      InlinePut pt;
      const int g = decodeOne(out, n, k, &pt);
      const int p = (int)pt.cmd.peer;
      ASSERT_LT(p, kProducers);
      const uint64_t i = next[p]++;
      ASSERT_EQ(pt.cmd.dstOff, i) << "producer " << p;
      if (i % 5 == 4) {
        ASSERT_EQ(pt.cmd.op, (uint32_t)mk::kProxyPut);
      } else {
        const uint64_t bytes = 1 + (i * 7 + (uint64_t)p * 13) % 64;
        ASSERT_EQ(pt.cmd.op, (uint32_t)(mk::kProxyPut | mk::kProxyInline));
        ASSERT_EQ(pt.cmd.bytes, bytes);
        for (uint64_t b = 0; b < bytes; b++)
          ASSERT_EQ(pt.data[b], byteOf(seed, p, i, b)) << "producer " << p << " put " << i;
        groups += g > 1;
      }
      k += g;
      total++;
    }
    slots += (uint64_t)n;
    if (!n) std::this_thread::yield();
  }
  for (auto& t : prods) t.join();
  EXPECT_EQ(total, kProducers * kPer);
  EXPECT_EQ(r->tail(), slots);
  EXPECT_GT(groups, kProducers * kPer / 2);  // most puts were multi-slot groups
}

namespace {

// A producer's header written alone (a broken producer, or one caught between its header
// and continuation stores were the order reversed): tickets t..t+1 taken, only t published.
uint64_t pushHeaderOnly(ProxyRing* r, uint64_t bytes, uint64_t word0) {
  mk::ProxyRingView v = r->hostView();
  const uint64_t g = mk::proxyGroupSlots(mk::kProxyPut | mk::kProxyInline, bytes);
  const uint64_t t = __atomic_fetch_add(v.tail, g, __ATOMIC_RELAXED);
  ProxyCmd* h = &v.slots[t & (v.nslots - 1)];
  h->op = mk::kProxyPut | mk::kProxyInline;
  h->sigOp = 0;
  h->peer = 0, h->dstOff = t, h->bytes = bytes, h->srcOff = word0;
  __atomic_store_n(&h->valid, t + 1, __ATOMIC_RELEASE);
  return t;
}

}  // namespace

// A continuation slot still holding an earlier lap (its valid word: an older ticket + 1, its
// body: an older command or continuation) is never taken as the continuation of a new group:
// poll stops at the header and says so (stalledGroup), hands out nothing of it, and takes
// the group once its own continuation is written. Headers at every slot index (groups that
// wrap included), in rings of 2 (the smallest that carries a group), 4 and 8 slots, after
// laps of single commands and of whole groups (pushInline), so that the stale slot was a
// command of its own or a continuation.
TEST(ProxyRingInline, StaleContinuationFromAnEarlierLapIsNotTaken) {
  const uint64_t seed = mktest::testSeed();
  for (uint64_t slots : {2u, 4u, 8u}) {
    auto r = makeRing(slots);
    mk::ProxyRingView v = r->hostView();
    ProxyCmd out[16];
    uint64_t first = 0;
    for (uint64_t s = 0; s < slots; s++) {  // a first lap: every slot holds a command
      ASSERT_EQ(r->put(9, 0xdead0000 + s, 0xbeef, 0, 1000), ncclSuccess);
      ASSERT_EQ(r->poll(out, 16, &first), 1);
    }
    for (uint64_t i = 0; i < 8 * slots; i++) {
      // Filler: singles or whole groups, so that the next header lands at every index.
      for (uint64_t s = 0; s <= i % slots; s++) {
        if ((i + s) % 2) {
          ASSERT_EQ(r->put(9, 0xdead0000 + s, 0xbeef, 0, 1000), ncclSuccess);
        } else {
          uint8_t junk[64];
          memset(junk, 0xcc, sizeof(junk));
          ProxyCmd c = {};
          c.op = mk::kProxyPut;
          c.peer = 9;
          ASSERT_EQ(r->pushInline(c, junk, 64, 1000), ncclSuccess);
        }
        while (r->poll(out, 16, &first) > 0) {
        }
      }
      const uint64_t bytes = 9 + byteOf(seed, 1, i, 0) % 56;  // 9..64: a 2-slot group
      std::vector<uint8_t> src(bytes);
      for (uint64_t b = 0; b < bytes; b++) src[b] = byteOf(seed, 2, i, b);
      uint64_t w0 = 0;
      memcpy(&w0, src.data(), 8);
      const uint64_t t = pushHeaderOnly(r.get(), bytes, w0);
      ProxyCmd* c = &v.slots[(t + 1) & (v.nslots - 1)];
      // The case this test is about: the continuation's slot holds an earlier lap.
      ASSERT_EQ(__atomic_load_n(&c->valid, __ATOMIC_ACQUIRE), t + 2 - slots) << "ticket " << t;
      for (int k = 0; k < 3; k++) {
        ASSERT_EQ(r->poll(out, 16, &first), 0) << "stale continuation taken, ticket " << t;
        uint64_t at = 0;
        EXPECT_TRUE(r->stalledGroup(&at));
        EXPECT_EQ(at, t);
      }
      char* body = reinterpret_cast<char*>(c) + 8;
      memset(body, 0, mk::kProxyContBytes);
      memcpy(body, src.data() + 8, bytes - 8);
      __atomic_store_n(&c->valid, t + 2, __ATOMIC_RELEASE);
      ASSERT_EQ(r->poll(out, 16, &first), 2);
      EXPECT_EQ(first, t);
      uint64_t at = 0;
      EXPECT_FALSE(r->stalledGroup(&at));
      InlinePut p;
      ASSERT_EQ(decodeOne(out, 2, 0, &p), 2);
      EXPECT_EQ(p.cmd.dstOff, t);
      ASSERT_EQ(p.data, src) << slots << " slots, ticket " << t;
    }
  }
}

// What the proxy's "group cut short" checks see (drainRings, proxy_io.cc): a group larger
// than the ring (a 2-slot header in a 1-slot ring) comes out as its header alone, at once, for
// the proxy to reject; a header whose continuation is not valid is reported by stalledGroup
// at every poll, until it is; a group that only does not fit in max is not a stall.
TEST(ProxyRingInline, IncompleteGroupsAsTheProxySeesThem) {
  auto one = makeRing(1);
  const uint64_t t1 = pushHeaderOnly(one.get(), 20, 0x1111111111111111ull);
  ProxyCmd out[8];
  uint64_t first = 0, at = 0;
  ASSERT_EQ(one->poll(out, 8, &first), 1);
  EXPECT_EQ(first, t1);
  EXPECT_EQ(mk::proxyGroupSlots(out[0].op, out[0].bytes), 2u) << "a header, cut short";
  EXPECT_FALSE(one->stalledGroup(&at));

  auto r = makeRing(8);
  ASSERT_EQ(r->put(0, 1, 2, 3, 1000), ncclSuccess);
  const uint64_t t = pushHeaderOnly(r.get(), 64, 0x2222222222222222ull);
  ASSERT_EQ(r->poll(out, 8, &first), 1);  // the single before it
  EXPECT_TRUE(r->stalledGroup(&at));
  EXPECT_EQ(at, t);
  for (int k = 0; k < 5; k++) {
    ASSERT_EQ(r->poll(out, 8, &first), 0);
    EXPECT_TRUE(r->stalledGroup(&at));
    EXPECT_EQ(at, t);
  }
  mk::ProxyRingView v = r->hostView();
  __atomic_store_n(&v.slots[(t + 1) & (v.nslots - 1)].valid, t + 2, __ATOMIC_RELEASE);
  ASSERT_EQ(r->poll(out, 1, &first), 0);  // complete, but max is 1
  EXPECT_FALSE(r->stalledGroup(&at));
  ASSERT_EQ(r->poll(out, 8, &first), 2);
  EXPECT_FALSE(r->stalledGroup(&at));
}
