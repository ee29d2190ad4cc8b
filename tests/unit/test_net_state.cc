// CPU parts of the inter-node state (transport/net_state*.cc): window layout, routing of
// peers (P2P or proxy, symmetric), the device control block layout, the text of device
// error records and the bootstrap all-to-all the proxy connects with.
#include <cstdint>
#include <utility>
#include <gtest/gtest.h>

#include "common/test_util.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "base/param.h"
#include "transport/net_state_impl.h"

using namespace mk;

namespace {

// Topology of n ranks in k nodes of consecutive ranks (what topoCompute gives for
// MKERNEL_EMULATE_NODES=k), seen from `rank`.
Topo makeTopo(int n, int k, int rank) {
  Topo t;
  t.nNodes = k;
  int per = n / k;
  t.rankToNode.resize(n);
  t.rankToLocalRank.resize(n);
  t.nodeRanks.assign(k, {});
  for (int r = 0; r < n; r++) {
    t.rankToNode[r] = r / per;
    t.rankToLocalRank[r] = r % per;
    t.nodeRanks[r / per].push_back(r);
  }
  t.node = rank / per;
  t.localRank = rank % per;
  t.localRanks = per;
  t.virtualNodes = true;
  return t;
}

TEST(NetState, LayoutSizes) {
  NetLayout l;
  ASSERT_EQ(netLayout(32 << 20, &l), ncclSuccess);
  EXPECT_EQ(l.windowBytes, 32u << 20);
  EXPECT_EQ(l.sendUser, 32u << 20);
  EXPECT_EQ(l.stageChunk, 1u << 20);
  EXPECT_EQ(l.stageSlots, 16u);
  EXPECT_EQ(l.sendBytes, l.sendUser + l.stageChunk * l.stageSlots);
  EXPECT_EQ(l.sigBytes % 4096, 0u);
  EXPECT_GE(l.sigBytes, sizeof(uint64_t) * kNetSignals);
  EXPECT_EQ(l.localBytes, l.sigBytes + l.windowBytes);
  // Small windows keep at least 4 staging slots of 64 KiB.
  ASSERT_EQ(netLayout(64 << 10, &l), ncclSuccess);
  EXPECT_EQ(l.stageChunk, 64u << 10);
  EXPECT_GE(l.stageSlots, 4u);
  // Not a multiple of 4 KiB: rounded down.
  ASSERT_EQ(netLayout((1 << 20) + 100, &l), ncclSuccess);
  EXPECT_EQ(l.windowBytes, 1u << 20);
  // Every window size gives power-of-two chunks within [64 KiB, 1 MiB], <= 256 slots.
  for (uint64_t w = 64 << 10; w <= (1ull << 32); w *= 3) {
    ASSERT_EQ(netLayout(w, &l), ncclSuccess) << w;
    EXPECT_EQ(l.stageChunk & (l.stageChunk - 1), 0u) << w;
    EXPECT_GE(l.stageChunk, 64u << 10) << w;
    EXPECT_LE(l.stageChunk, 1u << 20) << w;
    EXPECT_GE(l.stageSlots, 4u) << w;
    EXPECT_LE(l.stageSlots, 256u) << w;
  }
  EXPECT_EQ(netLayout(32 << 10, &l), ncclInvalidArgument);
  EXPECT_EQ(netLayout(0, &l), ncclInvalidArgument);
}

TEST(NetState, WindowBytesFollowsItsParam) {
  mktest::ScopedEnv env("MKERNEL_NET_WINDOW_BYTES", "1048576");
  EXPECT_EQ(netWindowBytes(), 1u << 20);
}

TEST(NetState, PeerRoutingIsSymmetric) {
  for (auto shape : std::vector<std::pair<int, int>>{{4, 2}, {8, 2}, {8, 4}, {6, 3}, {2, 2}}) {
    int n = shape.first, k = shape.second;
    for (bool p2p : {true, false}) {
      std::vector<std::set<int>> peers(n);
      for (int r = 0; r < n; r++) {
        Topo t = makeTopo(n, k, r);
        std::vector<int> pl = netProxyPeers(t, r, n, p2p);
        peers[r] = std::set<int>(pl.begin(), pl.end());
        std::vector<int> loc = netPeerLocal(t, r, n, p2p);
        ASSERT_EQ((int)loc.size(), n);
        for (int q = 0; q < n; q++) {
          bool sameNode = q / (n / k) == r / (n / k);
          // Proxy peers and P2P peers partition the other ranks.
          EXPECT_EQ(peers[r].count(q) == 1, q != r && (!sameNode || !p2p))
              << n << "x" << k << " rank " << r << " peer " << q;
          EXPECT_EQ(loc[q] >= 0, q == r || (sameNode && p2p));
          if (loc[q] >= 0) EXPECT_EQ(loc[q], q % (n / k));
        }
      }
      // The proxy of r lists q exactly when the proxy of q lists r.
      for (int r = 0; r < n; r++)
        for (int q : peers[r]) EXPECT_EQ(peers[q].count(r), 1u) << r << " " << q;
    }
  }
}

TEST(NetState, ControlBlockLayout) {
  NetCtlLayout l = netCtlLayout(16, 8, 4);
  std::vector<std::pair<size_t, size_t>> parts = {
      {l.hdrOff, sizeof(rt::CtlHdr)}, {l.stageNextOff, 8},     {l.stagePubOff, 16 * 8},
      {l.stageTicketOff, 16 * 8},     {l.peerLocalOff, 8 * 4}, {l.localWinsOff, 4 * 8}};
  size_t end = 0;
  for (auto& p : parts) {
    EXPECT_EQ(p.first % 64, 0u);
    EXPECT_GE(p.first, end);
    end = p.first + p.second;
  }
  EXPECT_GE(l.bytes, end);
}

// The messages of device error records are tested with the poller (test_rt_err.cc).

TEST(NetState, BootstrapAllToAllReachesPeersOnly) {
  const int n = 6, k = 3;
  ncclUniqueId id;
  ASSERT_EQ(bootstrapGetUniqueId(&id), ncclSuccess);
  std::vector<std::string> errs(n);
  std::vector<std::thread> th;
  for (int r = 0; r < n; r++) {
    th.emplace_back([&, r] {
      Bootstrap* b = nullptr;
      if (bootstrapInit(&id, 1, r, n, nullptr, &b) != ncclSuccess) {
        errs[r] = "bootstrapInit failed";
        return;
      }
      Topo t = makeTopo(n, k, r);
      std::vector<int> peers = netProxyPeers(t, r, n, true);
      const size_t bytes = 24;
      std::vector<uint8_t> s(n * bytes), d(n * bytes, 0xee);
      for (int p = 0; p < n; p++)
        for (size_t i = 0; i < bytes; i++) s[p * bytes + i] = (uint8_t)(r * 31 + p * 7 + i);
      if (netBootstrapAllToAll(b, peers, kNetBootstrapTag, s.data(), d.data(), bytes) !=
          ncclSuccess) {
        errs[r] = "alltoall failed";
      } else {
        for (int p = 0; p < n; p++) {
          bool isPeer = std::find(peers.begin(), peers.end(), p) != peers.end();
          for (size_t i = 0; i < bytes && errs[r].empty(); i++) {
            uint8_t want = isPeer ? (uint8_t)(p * 31 + r * 7 + i) : 0xee;
            if (d[p * bytes + i] != want)
              errs[r] = "block from rank " + std::to_string(p) + " byte " + std::to_string(i);
          }
        }
      }
      bootstrapBarrier(b);
      bootstrapClose(b);
    });
  }
  for (auto& t : th) t.join();
  for (int r = 0; r < n; r++) EXPECT_EQ(errs[r], "") << "rank " << r;
}

}  // namespace
