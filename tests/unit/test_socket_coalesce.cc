// Socket backend, MKERNEL_SOCKET_TX_COALESCE: small messages posted back to back on the
// inline connection leave in one sendmsg() per kTxGatherFrames of them when it is 1 (isend
// only queues, the next test() writes them all) and in one sendmsg() each when it is 0
// (isend writes at once). Counted by the backend itself (Net::sendCounts), so the test fails
// if the gathering breaks (a write per message comes back) and not only if it gets slower.
// Either way every message arrives whole, in posting order, nothing past its end.
#include <cstdint>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/debug.h"
#include "common/test_util.h"
#include "transport/net.h"
#include "transport/net_socket_impl.h"

namespace {

struct Pair {
  std::unique_ptr<mk::Net> net;
  void* listenComm = nullptr;
  void* sendComm = nullptr;
  void* recvComm = nullptr;
  ~Pair() {
    if (sendComm) net->closeSend(sendComm);
    if (recvComm) net->closeRecv(recvComm);
    if (listenComm) net->closeListen(listenComm);
  }
};

// A connected send/recv comm pair of the socket backend over loopback, with the parameters
// read now (the caller's ScopedEnvs).
void connectPair(Pair* p) {
  ASSERT_EQ(mk::netCreateSocket(&p->net), ncclSuccess) << mk::lastError();
  int ndev = 0;
  ASSERT_EQ(p->net->devices(&ndev), ncclSuccess);
  ASSERT_GE(ndev, 1) << "NCCL_SOCKET_IFNAME=lo found no interface";
  char handle[mk::kNetHandleSize] = {};
  ASSERT_EQ(p->net->listen(0, handle, &p->listenComm), ncclSuccess) << mk::lastError();
  ncclResult_t acc = ncclInternalError;
  std::thread t(
      [&] { acc = mk::netAcceptBlocking(p->net.get(), p->listenComm, &p->recvComm, 10000); });
  const ncclResult_t con = mk::netConnectBlocking(p->net.get(), 0, handle, &p->sendComm, 10000);
  t.join();
  ASSERT_EQ(con, ncclSuccess) << mk::lastError();
  ASSERT_EQ(acc, ncclSuccess) << mk::lastError();
}

// Tests `req` until done, bounded (a lost message fails here instead of hanging).
ncclResult_t waitDone(mk::Net* net, void* req, size_t* size) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    int done = 0;
    const ncclResult_t r = net->test(req, &done, size);
    if (r != ncclSuccess || done) return r;
    if (std::chrono::steady_clock::now() > end) return ncclRemoteError;
    std::this_thread::yield();
  }
}

// Send system calls for n messages: `want` (one per kGather coalesced, or one each) when
// every call writes whole frames; a call that would block or writes part of a frame adds
// one, so the check is "at least want", and with coalescing "fewer than one per message".
void expectCalls(uint64_t calls, uint64_t want, int n, bool coalesce) {
  EXPECT_GE(calls, want) << n << " messages, coalesce " << coalesce;
  if (coalesce && n > 1) EXPECT_LT(calls, (uint64_t)n) << n << " messages were not coalesced";
}

void runRounds(bool coalesce) {
  mktest::ScopedEnv ifn("NCCL_SOCKET_IFNAME", "lo");
  mktest::ScopedEnv tmo("MKERNEL_NET_TIMEOUT_S", "10");
  mktest::ScopedEnv co("MKERNEL_SOCKET_TX_COALESCE", coalesce ? "1" : "0");
  Pair p;
  connectPair(&p);
  if (::testing::Test::HasFatalFailure()) return;
  mk::NetSendCounts sc;
  ASSERT_TRUE(p.net->sendCounts(p.sendComm, &sc)) << "the socket backend counts its sends";
  ASSERT_FALSE(p.net->sendCounts(p.recvComm, &sc)) << "a recv comm has no send counts";
  ASSERT_EQ(sc.calls, 0u);
  std::mt19937_64 rng(mktest::testSeed());
  constexpr size_t kMax = 256, kGuard = 64;
  constexpr int kGather = mk::sock::kTxGatherFrames;
  uint64_t calls = 0, msgs = 0;
  // Up to kGather messages (one gathered write), a single one, and more than kGather (one
  // write per kGather: the gather's iovec array is bounded).
  for (int n : {kGather, 5, 1, 2 * kGather + 3}) {
    std::vector<std::vector<uint8_t>> out((size_t)n), in((size_t)n);
    std::vector<void*> sreq((size_t)n), rreq((size_t)n);
    for (int i = 0; i < n; i++) {
      in[(size_t)i].assign(kMax + kGuard, 0xa5);
      void* d = in[(size_t)i].data();
      size_t cap = kMax + kGuard;
      int tag = 7;
      ASSERT_EQ(p.net->irecv(p.recvComm, 1, &d, &cap, &tag, nullptr, &rreq[(size_t)i]),
                ncclSuccess);
      ASSERT_NE(rreq[(size_t)i], nullptr);
    }
    for (int i = 0; i < n; i++) {
      out[(size_t)i].resize(1 + rng() % kMax);
      for (auto& b : out[(size_t)i]) b = (uint8_t)rng();
      ASSERT_EQ(p.net->isend(p.sendComm, out[(size_t)i].data(), out[(size_t)i].size(), 7, nullptr,
                             &sreq[(size_t)i]),
                ncclSuccess);
      ASSERT_NE(sreq[(size_t)i], nullptr);
    }
    ASSERT_TRUE(p.net->sendCounts(p.sendComm, &sc));
    // Posted, not tested yet: queued (coalescing) or already written, one call each.
    // (A call that would block or writes part of a frame counts too: at least, not exactly.)
    if (coalesce)
      EXPECT_EQ(sc.calls - calls, 0u) << n << " messages";
    else
      EXPECT_GE(sc.calls - calls, (uint64_t)n) << n << " messages";
    EXPECT_EQ(sc.msgs - msgs, coalesce ? 0u : (uint64_t)n) << n << " messages";
    // One test() writes every queued message (the socket buffer holds them all: a few KiB).
    int done = 0;
    ASSERT_EQ(p.net->test(sreq[0], &done, nullptr), ncclSuccess);
    if (done) sreq[0] = nullptr;
    ASSERT_TRUE(p.net->sendCounts(p.sendComm, &sc));
    const uint64_t want = coalesce ? (uint64_t)((n + kGather - 1) / kGather) : (uint64_t)n;
    expectCalls(sc.calls - calls, want, n, coalesce);
    EXPECT_EQ(sc.msgs - msgs, (uint64_t)n) << n << " messages, coalesce " << coalesce;
    for (int i = 0; i < n; i++) {
      size_t sz = 0;
      if (sreq[(size_t)i]) ASSERT_EQ(waitDone(p.net.get(), sreq[(size_t)i], &sz), ncclSuccess);
      ASSERT_EQ(waitDone(p.net.get(), rreq[(size_t)i], &sz), ncclSuccess) << mk::lastError();
      const std::vector<uint8_t>& o = out[(size_t)i];
      ASSERT_EQ(sz, o.size()) << "message " << i << " of " << n;
      EXPECT_EQ(memcmp(in[(size_t)i].data(), o.data(), o.size()), 0)
          << "message " << i << " of " << n << " (order or bytes)";
      for (size_t k = o.size(); k < kMax + kGuard; k++)
        ASSERT_EQ(in[(size_t)i][k], 0xa5) << "message " << i << " ran past its end";
    }
    // Completing the requests wrote nothing more: the counts are the messages' own.
    ASSERT_TRUE(p.net->sendCounts(p.sendComm, &sc));
    expectCalls(sc.calls - calls, want, n, coalesce);
    calls = sc.calls, msgs = sc.msgs;
  }
}

}  // namespace

TEST(SocketTxCoalesce, QueuedMessagesLeaveInOneSendmsg) {
  runRounds(true);
}

TEST(SocketTxCoalesce, OffWritesEachMessageAtOnce) {
  runRounds(false);
}
