// Proxy end to end between processes over the socket backend: host-produced commands
// land their data and then their signal, in order; the ring's done counter follows; bad
// commands and dead peers become async errors naming the peer.
#include <cstdint>
#include <string>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "base/debug.h"
#include "base/param.h"
#include "common/test_util.h"
#include "mp/proxy_rank.h"
#include "mp/test_net_harness.inl"
#include "transport/net.h"
#include "transport/proxy.h"
#include "transport/proxy_impl.h"  // kOobBlock

namespace {

// Polls every pollUs until done() holds or `seconds` pass: the waits of these tests are
// bounded, and their EXPECTs then check the state they waited for.
template <class F>
void pollFor(int seconds, int pollUs, F done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!done() && std::chrono::steady_clock::now() < end) usleep(pollUs);
}

using mknet::Ctx;

constexpr size_t kSignals = 8;

uint8_t pat(int from, uint64_t cmd, size_t i) {
  return (uint8_t)(from * 97 + cmd * 13 + i * 7 + (i >> 9));
}

struct Rank : mknet::ProxyRank {
  ncclResult_t init(const Ctx& ctx, std::vector<int> peers, size_t window,
                    uint64_t ringSlots = 64) {
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
    setenv("MKERNEL_SOCKET_NCONNS", "2", 1);
    setenv("MKERNEL_NET_TIMEOUT_S", "10", 1);
    mk::paramReset();
    if (mk::netCreateSocket(&net) != ncclSuccess) return ncclSystemError;
    mk::ProxyRing* r = nullptr;
    if (mk::ProxyRing::create(ringSlots, mk::ProxyRingMem::kHost, &r) != ncclSuccess)
      return ncclSystemError;
    ring.reset(r);
    sendBuf.assign(window, 0);
    recvBuf.assign(window, 0xee);
    signals.assign(kSignals, 0);
    return mk::proxyCreate(config(ctx, peers), &proxy);
  }
  uint64_t sig(int slot) { return __atomic_load_n(&signals[slot], __ATOMIC_ACQUIRE); }
  // init for a rank body: a failure is a test failure, and the body returns 2.
  bool start(const Ctx& ctx, std::vector<int> peers, size_t window, uint64_t ringSlots = 64) {
    const ncclResult_t res = init(ctx, std::move(peers), window, ringSlots);
    EXPECT_EQ(res, ncclSuccess) << mk::lastError();
    return res == ncclSuccess;
  }
  // The proxy's async error once there is one (ncclSuccess after `seconds` without).
  ncclResult_t awaitAsyncError(std::string* msg, int seconds = 10) {
    ncclResult_t r = ncclSuccess;
    pollFor(seconds, 1000, [&] { return (r = mk::proxyGetAsyncError(proxy, msg)) != ncclSuccess; });
    return r;
  }
};

// An inline put (kProxyPut | kProxyInline: its 1..8 bytes ride in the command as srcOff);
// with signal, a put_signal that then sets the peer's slot to value.
mk::ProxyCmd inlinePut(int peer, uint64_t data, uint64_t dstOff, uint64_t bytes,
                       bool signal = false, uint64_t slot = 0, uint64_t value = 0) {
  mk::ProxyCmd c{};
  c.op = (signal ? mk::kProxyPutSignal : mk::kProxyPut) | mk::kProxyInline;
  c.sigOp = mk::kSignalSet;
  c.peer = (uint64_t)peer;
  c.srcOff = data;
  c.dstOff = dstOff;
  c.bytes = bytes;
  c.slot = slot;
  c.value = value;
  return c;
}

void expectAllExitedZero(const std::vector<int>& codes) {
  for (size_t r = 0; r < codes.size(); r++) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// Both ranks send kCmds put_signal commands to each other at once. Command i writes its
// own region (1 B .. 5 MiB; the large ones span several data messages) and sets slot 0
// to i + 1; a signal-add after it counts in slot 1. Whenever the receiver sees slot 0 ==
// v, the regions of every command < v must be complete: data lands before its signal,
// and signals apply in command order.
TEST(ProxyE2E, PutSignalDataBeforeSignalInOrder) {
  auto codes = mknet::runRanks(
      2,
      [](const Ctx& ctx) {
        const int kCmds = 300;
        std::vector<size_t> off(kCmds), len(kCmds);
        size_t cur = 0;
        for (int i = 0; i < kCmds; i++) {
          len[i] = (i % 50 == 49) ? (5u << 20) : (size_t)(1 + (i * 977) % 20000);
          off[i] = cur;
          cur += len[i];
        }
        Rank rk;
        if (!rk.start(ctx, {1 - ctx.rank}, cur)) return 2;
        int peer = 1 - ctx.rank;
        for (int i = 0; i < kCmds; i++)
          for (size_t k = 0; k < len[i]; k++) rk.sendBuf[off[i] + k] = pat(ctx.rank, i, k);
        std::thread producer([&] {
          for (int i = 0; i < kCmds; i++) {
            ASSERT_EQ(
                rk.ring->putSignal(peer, off[i], off[i], len[i], 0, i + 1, mk::kSignalSet, 20000),
                ncclSuccess);
            ASSERT_EQ(rk.ring->signal(peer, 1, 1, mk::kSignalAdd, 20000), ncclSuccess);
          }
        });
        uint64_t seen = 0, checked = 0;
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
        while (checked < (uint64_t)kCmds && std::chrono::steady_clock::now() < deadline) {
          uint64_t v = rk.sig(0);
          EXPECT_GE(v, seen) << "signal went backwards";
          seen = v;
          for (; checked < seen; checked++) {  // every command up to v must be complete
            size_t c = checked;
            for (size_t k : {(size_t)0, len[c] / 2, len[c] - 1})
              EXPECT_EQ(rk.recvBuf[off[c] + k], pat(peer, c, k)) << "cmd " << c << " byte " << k;
          }
          std::string msg;
          if (mk::proxyGetAsyncError(rk.proxy, &msg) != ncclSuccess) {
            ADD_FAILURE() << msg;
            break;
          }
        }
        producer.join();
        EXPECT_EQ(seen, (uint64_t)kCmds);
        while (rk.sig(1) < (uint64_t)kCmds && std::chrono::steady_clock::now() < deadline)
          std::this_thread::yield();
        EXPECT_EQ(rk.sig(1), (uint64_t)kCmds);
        for (int i = 0; i < kCmds; i++)
          for (size_t k = 0; k < len[i]; k += 61)
            if (rk.recvBuf[off[i] + k] != pat(peer, i, k)) {
              ADD_FAILURE() << "cmd " << i << " byte " << k;
              break;
            }
        while (rk.ring->done() < (uint64_t)(2 * kCmds) &&
               std::chrono::steady_clock::now() < deadline)
          std::this_thread::yield();
        EXPECT_EQ(rk.ring->done(), (uint64_t)(2 * kCmds));
        mk::ProxyStats st = mk::proxyStats(rk.proxy);
        EXPECT_EQ(st.cmds, (uint64_t)(2 * kCmds));
        EXPECT_EQ(st.signalsApplied, (uint64_t)(2 * kCmds));
        EXPECT_EQ(st.bytesRecv, (uint64_t)cur);
        // Both sides finish receiving before either closes.
        EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        return 0;
      },
      90);
  expectAllExitedZero(codes);
}

// A command whose destination lies outside the peer's window is refused by the peer's
// proxy: an async error there names the sender; the bytes never land.
TEST(ProxyE2E, OutOfRangeDestinationIsAnAsyncError) {
  auto codes = mknet::runRanks(
      2,
      [](const Ctx& ctx) {
        Rank rk;
        if (rk.init(ctx, {1 - ctx.rank}, 1 << 20) != ncclSuccess) return 2;
        if (ctx.rank == 0) {
          EXPECT_EQ(rk.ring->put(1, 0, (1 << 20) - 10, 100, 5000), ncclSuccess);
        } else {
          std::string msg;
          EXPECT_EQ(rk.awaitAsyncError(&msg), ncclInvalidUsage);
          EXPECT_NE(msg.find("peer rank 0"), std::string::npos) << msg;
          EXPECT_EQ(rk.recvBuf[(1 << 20) - 1], 0xee);
        }
        EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        return 0;
      },
      30);
  expectAllExitedZero(codes);
}

// Small puts whose data rides in the command (kProxyInline: srcOff holds up to 8 bytes, the
// source window is not read): 1..8 bytes land at their offsets, in order with their signals,
// also mixed with window-sourced puts in one batch; 65 bytes inline (more than a group
// carries) is refused as a bad command (an async error naming no peer, nothing lands).
TEST(ProxyE2E, InlineCommandsCarryTheirData) {
  const uint64_t seed = mktest::testSeed();  // before the fork: both ranks draw rank 0's payloads
  auto codes = mknet::runRanks(
      2,
      [seed](const Ctx& ctx) {
        Rank rk;
        if (!rk.start(ctx, {1 - ctx.rank}, 1 << 16)) return 2;
        EXPECT_TRUE(mk::proxyAllInline(rk.proxy));
        std::mt19937_64 rng(seed);
        const int kCmds = 200;
        std::vector<uint64_t> payload(kCmds);
        for (auto& v : payload) v = rng();
        auto len = [](int i) { return (uint64_t)(1 + i % 8); };
        if (ctx.rank == 0) {
          for (int i = 0; i < kCmds; i++) {
            EXPECT_EQ(rk.ring->push(inlinePut(1, payload[i], (uint64_t)i * 16, len(i), true, 0,
                                              (uint64_t)i + 1),
                                    5000),
                      ncclSuccess);
            if (i % 10 == 9) {  // a window-sourced put in between, same batch or the next
              const size_t off = 8192 + (size_t)i * 4;
              for (int k = 0; k < 4; k++) rk.sendBuf[off + k] = (uint8_t)(i + k);
              EXPECT_EQ(rk.ring->put(1, off, off, 4, 5000), ncclSuccess);
            }
          }
        }
        EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        const std::vector<uint64_t>& sent = payload;  // the same seed on both ranks
        if (ctx.rank == 1) {
          pollFor(10, 100, [&] { return rk.sig(0) >= (uint64_t)kCmds; });
          EXPECT_EQ(rk.sig(0), (uint64_t)kCmds);
          for (int i = 0; i < kCmds; i++) {
            uint64_t got = 0;
            memcpy(&got, &rk.recvBuf[(size_t)i * 16], len(i));
            const uint64_t mask = len(i) == 8 ? ~0ull : ((1ull << (8 * len(i))) - 1);
            EXPECT_EQ(got, sent[i] & mask) << "command " << i;
            EXPECT_EQ(rk.recvBuf[(size_t)i * 16 + len(i)], 0xee) << "command " << i << " overran";
            if (i % 10 == 9)
              for (int k = 0; k < 4; k++)
                EXPECT_EQ(rk.recvBuf[8192 + (size_t)i * 4 + k], (uint8_t)(i + k));
          }
        }
        EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        // A header filled by window-sourced inline data (8 x 512 bytes: kInlineCap) pushed
        // in one burst with an inline command: that command opens the next batch.
        if (ctx.rank == 0) {
          for (int k = 0; k < 8; k++) {
            for (int i = 0; i < 512; i++) rk.sendBuf[16384 + k * 512 + i] = (uint8_t)(k * 31 + i);
            EXPECT_EQ(rk.ring->put(1, 16384 + k * 512, 16384 + k * 512, 512, 5000), ncclSuccess);
          }
          EXPECT_EQ(rk.ring->push(inlinePut(1, 0x0807060504030201ull, 24576, 8, true, 1, 1), 5000),
                    ncclSuccess);
        } else {
          pollFor(10, 100, [&] { return rk.sig(1) >= 1; });
          EXPECT_EQ(rk.sig(1), 1u);
          int bad = 0;
          for (int k = 0; k < 8; k++)
            for (int i = 0; i < 512; i++)
              bad += rk.recvBuf[16384 + k * 512 + i] != (uint8_t)(k * 31 + i);
          EXPECT_EQ(bad, 0);
          for (int i = 0; i < 8; i++) EXPECT_EQ(rk.recvBuf[24576 + i], (uint8_t)(i + 1));
        }
        EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        if (ctx.rank == 0) {  // 65 bytes inline: refused
          EXPECT_EQ(rk.ring->push(inlinePut(1, 0, 40000, mk::kProxyInlineExtMax + 1), 5000),
                    ncclSuccess);
          std::string msg;
          EXPECT_EQ(rk.awaitAsyncError(&msg), ncclInvalidUsage);
          EXPECT_NE(msg.find("invalid ring command"), std::string::npos) << msg;
        }
        EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        if (ctx.rank == 1) EXPECT_EQ(rk.recvBuf[40000], 0xee);
        return 0;
      },
      60);
  expectAllExitedZero(codes);
}

// Inline puts of 1..64 bytes (ProxyRing::pushInline: 9..64 bytes are a header plus a
// continuation slot, MKERNEL_PROXY_INLINE_CMD=2's path) land byte for byte at their offsets,
// in order with their signals, mixed with window-sourced puts, with nothing past their end
// (the window is poisoned with 0xee).
TEST(ProxyE2E, InlineGroupsCarryUpTo64Bytes) {
  const uint64_t seed = mktest::testSeed();  // before the fork: both ranks draw rank 0's bytes
  auto codes = mknet::runRanks(
      2,
      [seed](const Ctx& ctx) {
        Rank rk;
        if (!rk.start(ctx, {1 - ctx.rank}, 1 << 16)) return 2;
        EXPECT_TRUE(mk::proxyAllInline(rk.proxy));
        const int kCmds = 4 * 64;
        const size_t kStride = 80;  // > 64: a guard byte after every put
        std::mt19937_64 rng(seed);
        std::vector<uint8_t> payload((size_t)kCmds * 64);
        for (auto& b : payload) b = (uint8_t)rng();
        auto len = [](int i) { return (uint64_t)(1 + (i * 37) % 64); };
        if (ctx.rank == 0) {
          for (int i = 0; i < kCmds; i++) {
            mk::ProxyCmd c{};
            c.op = mk::kProxyPutSignal;
            c.sigOp = mk::kSignalSet;
            c.peer = 1;
            c.dstOff = (uint64_t)i * kStride;
            c.slot = 0;
            c.value = (uint64_t)i + 1;
            EXPECT_EQ(rk.ring->pushInline(c, &payload[(size_t)i * 64], len(i), 5000), ncclSuccess);
            if (i % 10 == 9) {
              const size_t off = 32768 + (size_t)i * 4;
              for (int k = 0; k < 4; k++) rk.sendBuf[off + k] = (uint8_t)(i + k);
              EXPECT_EQ(rk.ring->put(1, off, off, 4, 5000), ncclSuccess);
            }
          }
        }
        EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        if (ctx.rank == 1) {
          pollFor(10, 100, [&] { return rk.sig(0) >= (uint64_t)kCmds; });
          EXPECT_EQ(rk.sig(0), (uint64_t)kCmds);
          int bad = 0;
          for (int i = 0; i < kCmds; i++) {
            const uint8_t* got = &rk.recvBuf[(size_t)i * kStride];
            for (uint64_t b = 0; b < len(i); b++) bad += got[b] != payload[(size_t)i * 64 + b];
            EXPECT_EQ(got[len(i)], 0xee) << "put " << i << " overran";
            if (i % 10 == 9)
              for (int k = 0; k < 4; k++)
                EXPECT_EQ(rk.recvBuf[32768 + (size_t)i * 4 + k], (uint8_t)(i + k));
          }
          EXPECT_EQ(bad, 0);
        }
        EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        return 0;
      },
      60);
  expectAllExitedZero(codes);
}

// The proxy's "inline group cut short" error (proxy_io.cc) for a group header whose
// continuation slot is not there, from a broken producer (the header written alone): in a
// 1-slot ring (the group cannot fit: poll hands out the header alone) at once; in a 2-slot
// ring whose continuation slot (the group wraps to slot 0) still holds the previous lap's
// command, and in a 64-slot ring whose continuation slot was never written, after the
// proxy's grace (kGroupStallNs, 1 s), well before the 10 s any waiter would take. Never a
// hang and never wrong data: neither the stale slot's bytes nor anything behind the header
// land at the peer, and the header's ticket is never done.
TEST(ProxyE2E, InlineGroupCutShortIsAnError) {
  for (const uint64_t slots : {1u, 2u, 64u}) {
    SCOPED_TRACE(std::to_string(slots) + "-slot ring");
    auto codes = mknet::runRanks(
        2,
        [slots](const Ctx& ctx) {
          Rank rk;
          if (!rk.start(ctx, {1 - ctx.rank}, 1 << 16, slots)) return 2;
          EXPECT_TRUE(mk::proxyAllInline(rk.proxy));
          uint64_t header = 0;
          if (ctx.rank == 0) {
            if (slots == 2) {  // one good command first: slot 0 then holds ticket 0
              EXPECT_EQ(rk.ring->push(inlinePut(1, 0x5555555555555555ull, 0, 8, true, 1, 1), 5000),
                        ncclSuccess);
              pollFor(10, 100, [&] { return mk::proxyCompleted(rk.proxy, 0) >= 1; });
              EXPECT_EQ(mk::proxyCompleted(rk.proxy, 0), 1u);
            }
            // The broken producer: tickets for the group taken, the header alone published.
            mk::ProxyRingView v = rk.ring->hostView();
            const uint64_t g = mk::proxyGroupSlots(mk::kProxyPut | mk::kProxyInline, 40);
            header = __atomic_fetch_add(v.tail, g, __ATOMIC_RELAXED);
            mk::ProxyCmd* h = &v.slots[header & (v.nslots - 1)];
            h->op = mk::kProxyPutSignal | mk::kProxyInline;
            h->sigOp = mk::kSignalSet;
            h->peer = 1, h->srcOff = 0x6666666666666666ull, h->dstOff = 1024, h->bytes = 40;
            h->slot = 0, h->value = 7;
            const auto t0 = std::chrono::steady_clock::now();
            __atomic_store_n(&h->valid, header + 1, __ATOMIC_RELEASE);
            if (slots == 64)  // a good command behind it: must not leave either
              EXPECT_EQ(rk.ring->putSignal(1, 0, 2048, 8, 2, 1, mk::kSignalSet, 5000), ncclSuccess);
            std::string msg;
            const ncclResult_t r = rk.awaitAsyncError(&msg);
            const double s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            EXPECT_EQ(r, ncclInvalidUsage) << msg;
            EXPECT_NE(msg.find("inline group cut short"), std::string::npos) << msg;
            if (slots == 1)
              EXPECT_LT(s, 0.9) << "a group larger than the ring is refused at once";
            else
              EXPECT_GT(s, 0.9) << "an incomplete group is refused after the grace only";
            EXPECT_LT(s, 5.0);
            EXPECT_TRUE(rk.ring->aborted());
            EXPECT_LE(mk::proxyCompleted(rk.proxy, 0), header) << "the header's ticket done";
          }
          EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
          if (ctx.rank == 1) {
            usleep(100000);  // anything wrongly sent has had time to land
            int bad = 0;
            for (size_t i = 0; i < rk.recvBuf.size(); i++)  // the good command: 8 x 0x55 at 0
              bad += rk.recvBuf[i] != (slots == 2 && i < 8 ? 0x55 : 0xee);
            EXPECT_EQ(bad, 0) << "bytes landed from a broken group or behind it";
            EXPECT_EQ(rk.sig(0), 0u);
            EXPECT_EQ(rk.sig(2), 0u);
            EXPECT_EQ(rk.sig(1), slots == 2 ? 1u : 0u);  // the good command before it only
          }
          EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
          return 0;
        },
        60);
    expectAllExitedZero(codes);
  }
}

// Held acknowledgements (kSignalLazy, MKERNEL_PROXY_ACK_HOLD_US). A lazy signal to a peer
// we have sent nothing to leaves at once (held, it would only slow a one-way stream). Once
// traffic goes both ways and after small messages, it waits for the next command to that peer
// and travels in its batch (one batch, applied first), or leaves alone when the hold expires;
// after bulk data from that peer it leaves at once. A held signal is complete for the ring
// at once (it has no source data). Rank 1 holds, rank 0 watches. The hold is 1 s, so that
// "not yet" and "at once" are far apart on a loaded machine.
TEST(ProxyE2E, HeldAckRidesWithTheNextBatch) {
  auto codes = mknet::runRanks(
      2,
      [](const Ctx& ctx) {
        using Clock = std::chrono::steady_clock;
        setenv("MKERNEL_PROXY_ACK_HOLD_US", "1000000", 1);
        Rank rk;
        const ncclResult_t res = rk.init(ctx, {1 - ctx.rank}, 1 << 17);
        unsetenv("MKERNEL_PROXY_ACK_HOLD_US");
        EXPECT_EQ(res, ncclSuccess) << mk::lastError();
        if (res != ncclSuccess) return 2;
        const auto lazy = (mk::ProxySignalOp)(mk::kSignalSet | mk::kSignalLazy);
        auto waitSig = [&](int slot, uint64_t v, double s) {
          const auto end = Clock::now() + std::chrono::duration<double>(s);
          while (rk.sig(slot) < v && Clock::now() < end) usleep(100);
          return rk.sig(slot) >= v;
        };
        auto waitDone = [&](uint64_t n, double s) {
          const auto end = Clock::now() + std::chrono::duration<double>(s);
          while (mk::proxyCompleted(rk.proxy, 0) < n && Clock::now() < end) usleep(100);
          return mk::proxyCompleted(rk.proxy, 0) >= n;
        };
        auto secs = [](Clock::time_point t0) {
          return std::chrono::duration<double>(Clock::now() - t0).count();
        };
        auto batches = [&] { return mk::proxyStats(rk.proxy).batches; };
        // 0. Nothing sent to the peer yet: not held; nor the next one (an ack sent at once
        // is no traffic for later acks to ride with: a one-way stream of small messages).
        for (uint64_t v = 1; v <= 2; v++) {
          if (ctx.rank == 1) EXPECT_EQ(rk.ring->signal(0, 2, v, lazy, 5000), ncclSuccess);
          if (ctx.rank == 0)
            EXPECT_TRUE(waitSig(2, v, 0.5)) << "ack " << v << " held with no traffic to ride with";
          EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        }
        // 1. After a small put to the peer: held (yet complete for the ring), then carried by
        // the next command's batch.
        uint64_t b0 = 0;
        if (ctx.rank == 1) {
          EXPECT_EQ(rk.ring->putSignal(0, 0, 64, 8, 3, 1, mk::kSignalSet, 5000), ncclSuccess);
          EXPECT_TRUE(waitDone(3, 5));  // the two acks of step 0 and the put
          b0 = batches();
          EXPECT_EQ(rk.ring->signal(0, 2, 5, lazy, 5000), ncclSuccess);
          EXPECT_TRUE(waitDone(4, 0.5)) << "a held signal kept the ring's done counter back";
          usleep(50000);
          EXPECT_EQ(batches(), b0) << "the lazy signal left alone";
        }
        EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        if (ctx.rank == 0) EXPECT_EQ(rk.sig(2), 2u) << "the lazy signal arrived before the hold";
        EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        if (ctx.rank == 1) {
          rk.sendBuf[0] = 0x5a;
          EXPECT_EQ(rk.ring->putSignal(0, 0, 0, 8, 3, 7, mk::kSignalSet, 5000), ncclSuccess);
          EXPECT_TRUE(waitDone(5, 0.5));
          EXPECT_EQ(batches(), b0 + 1) << "held signal and put: one batch";
        } else {
          EXPECT_TRUE(waitSig(3, 7, 0.5));
          EXPECT_EQ(rk.sig(2), 5u);  // applied with (before) the put's signal
          EXPECT_EQ(rk.recvBuf[0], 0x5a);
        }
        EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        // 2. Alone: it leaves when the hold expires, not before.
        if (ctx.rank == 1) {
          EXPECT_EQ(rk.ring->signal(0, 2, 6, lazy, 5000), ncclSuccess);
        } else {
          const auto t0 = Clock::now();
          EXPECT_FALSE(waitSig(2, 6, 0.5)) << "left before the hold expired";
          EXPECT_TRUE(waitSig(2, 6, 10));
          EXPECT_GE(secs(t0), 0.8);
        }
        EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        // 3. After bulk data from the peer (64 KiB), acks pace a stream: no hold.
        if (ctx.rank == 0) {
          EXPECT_EQ(rk.ring->putSignal(1, 0, 0, 1 << 16, 4, 1, mk::kSignalSet, 5000), ncclSuccess);
          EXPECT_TRUE(waitSig(2, 7, 0.5)) << "the ack after bulk data was held";
        } else {
          EXPECT_TRUE(waitSig(4, 1, 5));
          EXPECT_EQ(rk.ring->putSignal(0, 0, 64, 8, 3, 8, mk::kSignalSet, 5000), ncclSuccess);
          EXPECT_EQ(rk.ring->signal(0, 2, 7, lazy, 5000), ncclSuccess);
        }
        EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        return 0;
      },
      60);
  expectAllExitedZero(codes);
}

// Abort during connection set-up: rank 1 hands out a listening handle but never connects or
// accepts, so rank 0's proxyCreate waits for it; its abort word, set 500 ms in, ends the wait
// with ncclRemoteError long before MKERNEL_NET_TIMEOUT_S (10 s here).
TEST(ProxyFault, AbortEndsConnectionSetUp) {
  auto codes = mknet::runRanks(
      2,
      [](const Ctx& ctx) {
        setenv("NCCL_SOCKET_IFNAME", "lo", 1);
        setenv("MKERNEL_NET_TIMEOUT_S", "10", 1);
        mk::paramReset();
        if (ctx.rank == 1) {
          std::unique_ptr<mk::Net> net;
          if (mk::netCreateSocket(&net) != ncclSuccess) return 2;
          std::vector<char> send(2 * mk::prx::kOobBlock, 0), recv(2 * mk::prx::kOobBlock, 0);
          void* listenComm = nullptr;
          if (net->listen(0, &send[0], &listenComm) != ncclSuccess) return 3;
          if (mknet::hubAllToAll(ctx, send.data(), recv.data(), mk::prx::kOobBlock) != ncclSuccess)
            return 4;
          mknet::hubBarrier(ctx);  // until rank 0 has given up
          net->closeListen(listenComm);
          return 0;
        }
        Rank rk;
        if (mk::netCreateSocket(&rk.net) != ncclSuccess) return 2;
        mk::ProxyRing* r = nullptr;
        if (mk::ProxyRing::create(64, mk::ProxyRingMem::kHost, &r) != ncclSuccess) return 3;
        rk.ring.reset(r);
        rk.sendBuf.assign(4096, 0);
        rk.recvBuf.assign(4096, 0);
        rk.signals.assign(kSignals, 0);
        uint32_t abortWord = 0;
        rk.net->setAbortFlag(&abortWord);
        mk::ProxyConfig cfg = rk.config(ctx, {1});
        cfg.abortFlag = &abortWord;
        std::thread aborter([&] {
          usleep(500 * 1000);
          __atomic_store_n(&abortWord, 1u, __ATOMIC_RELEASE);
        });
        const auto t0 = std::chrono::steady_clock::now();
        const ncclResult_t res = mk::proxyCreate(cfg, &rk.proxy);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        aborter.join();
        mknet::hubBarrier(ctx);
        EXPECT_EQ(res, ncclRemoteError);
        EXPECT_EQ(rk.proxy, nullptr);
        EXPECT_LT(s, 5.0) << "proxyCreate returned " << s << " s in (the net timeout is 10 s)";
        return res == ncclRemoteError && s < 5.0 ? 0 : 10;
      },
      60);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

// Fault test: three ranks fully connected; rank 2 is SIGKILLed. Ranks 0 and 1 get an
// ncclRemoteError naming peer rank 2 well within the timeout, and their rings are aborted
// so producers waiting for space fail instead of hanging.
TEST(ProxyFault, KilledRankIsReportedByTheOthers) {
  auto codes = mknet::runRanks(
      3,
      [](const Ctx& ctx) {
        std::vector<int> peers;
        for (int r = 0; r < ctx.nranks; r++)
          if (r != ctx.rank) peers.push_back(r);
        Rank rk;
        if (rk.init(ctx, peers, 1 << 20) != ncclSuccess) return 2;
        // Some healthy traffic first.
        for (int r : peers)
          EXPECT_EQ(rk.ring->putSignal(r, 0, 0, 4096, 0, 1, mk::kSignalAdd, 5000), ncclSuccess);
        pollFor(10, 1000, [&] { return rk.sig(0) >= 2; });
        EXPECT_EQ(rk.sig(0), 2u);
        EXPECT_EQ(mknet::hubBarrier(ctx), ncclSuccess);
        if (ctx.rank == 2) kill(getpid(), SIGKILL);
        auto t0 = std::chrono::steady_clock::now();
        std::string msg;
        ncclResult_t res = ncclSuccess;
        while ((res = mk::proxyGetAsyncError(rk.proxy, &msg)) == ncclSuccess &&
               std::chrono::steady_clock::now() < t0 + std::chrono::seconds(15)) {
          // Keep traffic flowing to the dead peer so the sender side notices too.
          rk.ring->put(2, 0, 0, 1024, 100);
          usleep(2000);
        }
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_EQ(res, ncclRemoteError) << msg;
        EXPECT_NE(msg.find("peer rank "), std::string::npos) << msg;
        EXPECT_LT(s, 10.0);
        EXPECT_TRUE(rk.ring->aborted());
        // Survivors leave together: one that exits early would look dead to the other.
        mknet::hubBarrier(ctx);  // fails (a rank is dead) but only once both arrived
        // A survivor may see the other survivor's connection drop first (its proxy stopped
        // on the same failure); at least one of them must name the killed rank.
        return msg.find("peer rank 2") != std::string::npos ? 0 : 10;
      },
      60);
  EXPECT_TRUE(codes[0] == 0 || codes[0] == 10) << codes[0];
  EXPECT_TRUE(codes[1] == 0 || codes[1] == 10) << codes[1];
  EXPECT_TRUE(codes[0] == 0 || codes[1] == 0) << "no survivor named the killed rank";
  EXPECT_EQ(codes[2], 128 + SIGKILL);
}

}  // namespace
