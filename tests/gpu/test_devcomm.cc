// The device communication API (src/device/net/devcomm.cuh) on virtual nodes: ranks share
// GPU 0, MKERNEL_EMULATE_NODES splits them into nodes, and traffic between nodes takes the
// proxy + socket path while traffic inside a node uses P2P stores. Every rank puts fresh
// random data to every rank (itself included) with put_signal, receivers wait for the
// signals and every byte is checked; the proxy's byte counters prove which path was taken.
// Then back-pressure (a 2-slot ring, 4 staging slots), abort while waiting, a timeout
// naming an absent peer, a killed peer failing fast, bad arguments.
#include <cstdint>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "comm/comm.h"
#include "gpu/test_devcomm_util.h"
#include "transport/net_state.h"

using namespace dctest;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// n ranks in `nodes` virtual nodes exchange random data `iters` times.
void exchange(int n, int nodes, bool warpScope, int iters = 3) {
  MKTEST_REQUIRE_GPU();
  const size_t window = 4 << 20;
  TestEnv env(nodes, window);
  Ranks r;
  std::string e = makeRanks(n, &r);
  ASSERT_EQ(e, "");
  for (int i = 0; i < n; i++) {
    ASSERT_NE(r.comms[i]->net, nullptr) << "rank " << i << " has no inter-node state";
    mk::NetHostView hv;
    ASSERT_EQ(mk::netHostView(r.comms[i], &hv), ncclSuccess);
    EXPECT_STREQ(hv.backend, "socket") << "virtual nodes must use the socket backend";
    EXPECT_EQ(hv.nProxyPeers, n - n / nodes) << "rank " << i
                                             << ": the proxy connects to every "
                                                "rank of the other nodes and no other";
  }
  uint64_t seed = mktest::testSeed();
  std::vector<uint64_t> wantSent(n, 0), wantRecv(n, 0);
  for (int it = 0; it < iters; it++) {
    Exchange x = makeExchange(n, window, seed, it, warpScope);
    std::vector<std::vector<uint8_t>> outs;
    std::string err = runPlans(r, x.plans, 120, &outs);
    ASSERT_EQ(err, "") << "iteration " << it << " (seed " << seed << ")";
    std::string bad = checkExchange(x, outs);
    ASSERT_EQ(bad, "") << "iteration " << it << " (seed " << seed << ")";
    std::vector<uint64_t> s, v;
    remoteBytes(x, nodes, &s, &v);
    for (int i = 0; i < n; i++) wantSent[i] += s[i], wantRecv[i] += v[i];
  }
  // Inter-node bytes went through the proxy, intra-node bytes did not (quiet() at the end
  // of every kernel: every send completed).
  for (int i = 0; i < n; i++) {
    mk::NetStats st;
    ASSERT_EQ(mk::netStats(r.comms[i], &st), ncclSuccess);
    EXPECT_EQ(st.bytesSent, wantSent[i]) << "rank " << i << ": bytes sent by the proxy";
    EXPECT_EQ(st.bytesRecv, wantRecv[i]) << "rank " << i << ": bytes received by the proxy";
  }
}

TEST(DevComm, Exchange2Nodes2Ranks) {
  exchange(4, 2, false);
}
TEST(DevComm, Exchange2Nodes4Ranks) {
  exchange(8, 2, false);
}
TEST(DevComm, Exchange4Nodes2Ranks) {
  exchange(8, 4, false);
}
TEST(DevComm, ExchangeWarpScope2Nodes2Ranks) {
  exchange(4, 2, true, 2);
}

// A 2-slot command ring and 4 staging slots of 64 KiB: 64 staged puts and 200 signal-adds
// per rank to its peer on the other node run through ring and staging back-pressure.
TEST(DevComm, BackPressureTinyRingAndStaging) {
  MKTEST_REQUIRE_GPU();
  const int n = 4, nodes = 2, kPuts = 64, kAdds = 200;
  const size_t window = 256 << 10, region = window / n;
  TestEnv env(nodes, window, /*ringSlots=*/2);
  Ranks r;
  ASSERT_EQ(makeRanks(n, &r), "");
  std::vector<Plan> plans(n);
  uint64_t seed = mktest::testSeed();
  for (int s = 0; s < n; s++) {
    Plan& p = plans[s];
    int peer = (s + n / 2) % n;
    p.src.resize(region);
    for (size_t i = 0; i < region; i++)
      p.src[i] = (uint8_t)(seed * 7 + s * 131 + i * 13 + (i >> 8));
    p.outBytes = region;
    p.grid = 1;
    for (int i = 0; i < kPuts; i++) {
      mk::NetTestOp op{};
      op.peer = peer;
      op.flags = mk::kNetTestSignal;
      op.srcOff = (size_t)i * 1024;
      op.dstOff = s * region + (size_t)i * 1024;
      op.bytes = 900 + i % 64;
      op.slot = (uint32_t)s;
      op.value = i + 1;
      p.sends.push_back(op);
    }
    for (int i = 0; i < kAdds; i++) {
      mk::NetTestOp op{};
      op.peer = peer;
      op.flags = mk::kNetTestSignal | mk::kNetTestAdd;
      op.slot = kAddSlot;
      op.value = 1;
      p.sends.push_back(op);
    }
  }
  for (int d = 0; d < n; d++) {
    int from = (d + n / 2) % n;
    mk::NetTestOp w{};
    w.peer = from;
    w.dstOff = from * region;
    w.bytes = region;
    w.slot = (uint32_t)from;
    w.value = kPuts;
    plans[d].recvs.push_back(w);
    mk::NetTestOp a{};
    a.peer = from;
    a.slot = kAddSlot;
    a.value = kAdds;
    plans[d].recvs.push_back(a);
  }
  std::vector<std::vector<uint8_t>> outs;
  ASSERT_EQ(runPlans(r, plans, 120, &outs), "");
  for (int d = 0; d < n; d++) {
    int from = (d + n / 2) % n;
    const std::vector<uint8_t>& src = plans[from].src;
    for (int i = 0; i < kPuts; i++) {
      size_t bytes = 900 + i % 64;
      for (size_t b = 0; b < bytes; b++)
        ASSERT_EQ(outs[d][i * 1024 + b], src[i * 1024 + b])
            << "rank " << d << " from " << from << " put " << i << " byte " << b;
    }
    mk::NetStats st;
    ASSERT_EQ(mk::netStats(r.comms[d], &st), ncclSuccess);
    EXPECT_EQ(st.cmds, (uint64_t)(kPuts + kAdds)) << "rank " << d;
  }
}

// Rank 0 waits for a signal nobody sends (from a remote and from a local peer); an abort
// from another thread ends the kernel promptly, and the GPU keeps working afterwards.
TEST(DevComm, AbortWhileWaiting) {
  MKTEST_REQUIRE_GPU();
  {
    TestEnv env(2, 1 << 20, 0, /*timeoutMs=*/300000);
    Ranks r;
    ASSERT_EQ(makeRanks(4, &r), "");
    Plan p;
    p.grid = 2;
    p.quietAtEnd = false;
    mk::NetTestOp w{};
    w.peer = 2;  // remote
    w.slot = 2;
    w.value = 1;
    p.recvs.push_back(w);
    w.peer = 1;  // local
    w.slot = 1;
    p.recvs.push_back(w);
    Launch l;
    ASSERT_EQ(startPlan(r, 0, p, &l), "");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_EQ(cudaStreamQuery(r.streams[0]), cudaErrorNotReady)
        << "the kernel should still wait for its signals";
    auto t0 = Clock::now();
    double took = -1;
    std::thread aborter([&] {
      killRank(r, 0, 10);
      took = since(t0);
    });
    aborter.join();
    EXPECT_LT(took, 5.0) << "the abort must end the waits promptly";
    EXPECT_TRUE(streamDone(r.streams[0], 5)) << "the kernel must leave after the abort";
    std::vector<int> st;
    ASSERT_EQ(finishPlan(l, nullptr, &st), "");
    EXPECT_NE(st[0], 0) << "the remote wait must report failure";
    EXPECT_NE(st[1], 0) << "the local wait must report failure";
  }
  // The context is not poisoned: a fresh exchange works.
  exchange(4, 2, false, 1);
}

// An absent peer: the wait ends at MKERNEL_TIMEOUT_MS with ncclRemoteError naming it.
TEST(DevComm, TimeoutNamesAbsentPeer) {
  MKTEST_REQUIRE_GPU();
  TestEnv env(2, 1 << 20, 0, /*timeoutMs=*/1500);
  Ranks r;
  ASSERT_EQ(makeRanks(4, &r), "");
  Plan p;
  p.quietAtEnd = false;
  mk::NetTestOp w{};
  w.peer = 3;
  w.slot = 3;
  w.value = 1;
  p.recvs.push_back(w);
  Launch l;
  auto t0 = Clock::now();
  ASSERT_EQ(startPlan(r, 0, p, &l), "");
  ASSERT_TRUE(streamDone(r.streams[0], 20)) << "the wait must end at its deadline";
  double took = since(t0);
  EXPECT_GT(took, 1.0);
  EXPECT_LT(took, 15.0);
  std::vector<int> st;
  ASSERT_EQ(finishPlan(l, nullptr, &st), "");
  EXPECT_EQ(st[0], 1000001);
  std::string msg;
  EXPECT_EQ(asyncError(r.comms[0], &msg), ncclRemoteError);
  EXPECT_NE(msg.find("rank 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MKERNEL_TIMEOUT_MS=1500"), std::string::npos) << msg;
  r.broken = true;
}

// A peer that goes away: the proxy sees the connection close, stops, and the waiting
// kernel fails long before its deadline, with an error naming the peer.
TEST(DevComm, KilledPeerFailsFast) {
  MKTEST_REQUIRE_GPU();
  TestEnv env(2, 1 << 20, 0, /*timeoutMs=*/120000);
  Ranks r;
  ASSERT_EQ(makeRanks(4, &r), "");
  Plan p;
  p.quietAtEnd = false;
  mk::NetTestOp w{};
  w.peer = 2;
  w.slot = 2;
  w.value = 1;
  p.recvs.push_back(w);
  Launch l;
  ASSERT_EQ(startPlan(r, 0, p, &l), "");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto t0 = Clock::now();
  killRank(r, 2);
  ASSERT_TRUE(streamDone(r.streams[0], 30))
      << "rank 0 still waits 30 s after its peer went away (the proxy did not notice?)";
  EXPECT_LT(since(t0), 30.0);
  std::vector<int> st;
  ASSERT_EQ(finishPlan(l, nullptr, &st), "");
  EXPECT_NE(st[0], 0);
  std::string msg;
  ncclResult_t a = asyncError(r.comms[0], &msg);
  EXPECT_TRUE(a == ncclRemoteError || a == ncclSystemError) << ncclGetErrorString(a) << ": " << msg;
  EXPECT_NE(msg.find("peer rank 2"), std::string::npos) << msg;
  r.broken = true;
}

// Bad arguments are caught on the device and reported with a message.
TEST(DevComm, BadArgumentsReported) {
  MKTEST_REQUIRE_GPU();
  TestEnv env(2, 1 << 20);
  Ranks r;
  ASSERT_EQ(makeRanks(4, &r), "");
  Plan p;
  p.src.resize(64);
  mk::NetTestOp op{};
  op.peer = 2;
  op.flags = mk::kNetTestSignal;
  op.dstOff = (1 << 20) - 8;  // 64 bytes do not fit
  op.bytes = 64;
  op.slot = 0;
  op.value = 1;
  p.sends.push_back(op);
  Launch l;
  ASSERT_EQ(startPlan(r, 0, p, &l), "");
  ASSERT_TRUE(streamDone(r.streams[0], 20));
  std::vector<int> st;
  ASSERT_EQ(finishPlan(l, nullptr, &st), "");
  EXPECT_EQ(st[0], 1);
  std::string msg;
  EXPECT_EQ(asyncError(r.comms[0], &msg), ncclInvalidUsage);
  EXPECT_NE(msg.find("dst_offset"), std::string::npos) << msg;
  r.broken = true;
}

// A comm on a single node has no inter-node state.
TEST(DevComm, SingleNodeHasNoNetState) {
  MKTEST_REQUIRE_GPU();
  TestEnv env(1, 1 << 20);
  Ranks r;
  ASSERT_EQ(makeRanks(2, &r), "");
  EXPECT_EQ(r.comms[0]->net, nullptr);
  mk::NetDev d;
  EXPECT_EQ(mk::netDevView(r.comms[0], &d), ncclInvalidUsage);
}

}  // namespace
