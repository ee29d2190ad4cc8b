// MoeNode.*: the per-node dedup of the MoE AllToAll path (fused/ops/moe/moe_node.h) against
// today's direct AllToAll, on the host model of moe_node_model.h: random routings on 2x2, 2x4,
// 4x2 and 3x3 virtual nodes, dedup-off layouts, the spill rule, the route checks and the bytes
// model on hand cases.
#include <cstdint>
#include <cstdio>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "common/test_util.h"
#include "unit/moe_node_model.h"

namespace mf = mk::fused;
using namespace moenode;

namespace {

// Independent of the model's transport: every slot of a receiver that did not overflow sits at
// moe_layout.h's moeSlotRow with its token's payload, source, slot and weight.
void checkSlotRows(const World& W, const std::vector<Out>& out) {
  const mf::MoeShape shape{0, W.k, W.E, W.n, W.epr};
  for (int s = 0; s < W.n; ++s) {
    std::vector<int32_t> at(W.E), seen(W.E, 0);
    for (int e = 0; e < W.E; ++e) at[e] = out[e / W.epr].srcRow[s * W.epr + e % W.epr];
    for (int64_t i = 0; i < (int64_t)W.idx[s].size(); ++i) {
      const int32_t e = W.idx[s][i];
      if (e < 0 || e >= W.E) continue;  // unused or bad: sent nowhere
      const int64_t row = mf::moeSlotRow(shape, W.idx[s].data(), i, at.data(), seen.data());
      const Out& o = out[e / W.epr];
      if (o.ovf) continue;
      ASSERT_GE(row, 0);
      ASSERT_LT(row, W.P);
      ASSERT_EQ(o.rowSource[row * 3], s) << "slot " << i << " of rank " << s;
      ASSERT_EQ(o.rowSource[row * 3 + 1], i / W.k);
      ASSERT_EQ(o.rowSource[row * 3 + 2], i % W.k);
      ASSERT_EQ(o.weight[row], bits(W.w[s][i]));
      for (int v = 0; v < kW; ++v) ASSERT_EQ(o.xRecv[row * kW + v], W.x[s][(i / W.k) * kW + v]);
    }
  }
}

void runLayout(int nNodes, int nLocal, int cases) {
  const uint64_t seed = mktest::testSeed() ^ (uint64_t)(nNodes * 131 + nLocal);
  printf("MoeNode %dx%d: seed %llu, %d cases\n", nNodes, nLocal, (unsigned long long)seed, cases);
  std::mt19937_64 rng(seed);
  Stats d0, d1;
  for (int c = 0; c < cases; ++c) {
    const int pattern = c % kPatterns;
    const World W = makeWorld(rng, nNodes, nLocal, pattern);
    SCOPED_TRACE(testing::Message() << "seed " << seed << " case " << c << " pattern " << pattern
                                    << " epr " << W.epr << " k " << W.k << " maxRows " << W.P);
    Stats a, b;
    std::vector<Out> direct, dedup;
    simulate(W, false, &a, &direct);
    simulate(W, true, &b, &dedup);
    ASSERT_FALSE(testing::Test::HasFatalFailure());
    for (int r = 0; r < W.n; ++r) ASSERT_TRUE(direct[r] == dedup[r]) << "outputs of rank " << r;
    checkSlotRows(W, dedup);
    EXPECT_EQ(a.rail + a.spills, 0) << "dedup off: every pair direct";
    EXPECT_LE(b.crossRows, a.crossRows) << "dedup never moves more rows across nodes";
    d0.crossRows += a.crossRows;
    d1.crossRows += b.crossRows;
    d1.spills += b.spills;
    d1.clamps += b.clamps;
    d1.ovf += b.ovf;
  }
  printf(
      "  cross-node token rows %lld direct, %lld dedup; spilled pairs %lld, dropped fan "
      "blocks %lld, overflowed receivers %lld\n",
      (long long)d0.crossRows, (long long)d1.crossRows, (long long)d1.spills, (long long)d1.clamps,
      (long long)d1.ovf);
  EXPECT_GT(d1.spills, 0) << "the spill rule ran";
  EXPECT_GT(d1.ovf, 0) << "overflows ran";
  EXPECT_LT(d1.crossRows, d0.crossRows);
}

}  // namespace

TEST(MoeNode, TwoByTwo) {
  runLayout(2, 2, 300);
}
TEST(MoeNode, TwoByFour) {
  runLayout(2, 4, 200);
}
TEST(MoeNode, FourByTwo) {
  runLayout(4, 2, 200);
}
TEST(MoeNode, ThreeByThree) {
  runLayout(3, 3, 200);
}

// Layouts without dedup (one node, one rank per node, uneven nodes): the model runs with
// dedup asked for and must equal the direct path, every pair direct.
TEST(MoeNode, DedupOffLayouts) {
  const uint64_t seed = mktest::testSeed() ^ 0x5eedull;
  printf("MoeNode dedup-off layouts: seed %llu\n", (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  for (int c = 0; c < 120; ++c) {
    const int which = c % 3;
    World W = makeWorld(rng, which == 0 ? 1 : 2,
                        which == 0   ? 4
                        : which == 1 ? 1
                                     : 3,
                        c / 3 % kPatterns);
    if (which == 2) {  // 6 ranks on nodes of 4 and 2
      W.nodeOf = {0, 0, 0, 0, 1, 1};
      std::shuffle(W.nodeOf.begin(), W.nodeOf.end(), rng);
    }
    SCOPED_TRACE(testing::Message() << "seed " << seed << " case " << c);
    mf::MoeNodeMap m;
    ASSERT_TRUE(mf::moeNodeMapInit(W.n, W.nodeOf.data(), 0, true, &m));
    EXPECT_EQ(m.rail, 0);
    Stats a, b;
    std::vector<Out> direct, dedup;
    simulate(W, false, &a, &direct);
    simulate(W, true, &b, &dedup);
    ASSERT_FALSE(testing::Test::HasFatalFailure());
    for (int r = 0; r < W.n; ++r) ASSERT_TRUE(direct[r] == dedup[r]) << "outputs of rank " << r;
    EXPECT_EQ(b.rail, 0);
    EXPECT_EQ(b.crossRows, a.crossRows);
  }
}

TEST(MoeNode, MapAndSwitch) {
  mf::MoeNodeMap m;
  const int32_t shuffled[6] = {1, 0, 2, 0, 1, 2};  // 3 nodes of 2, ranks interleaved
  ASSERT_TRUE(mf::moeNodeMapInit(6, shuffled, 4, true, &m));
  EXPECT_EQ(m.rail, 1);
  EXPECT_EQ(m.nNodes, 3);
  EXPECT_EQ(m.nLocal, 2);
  EXPECT_EQ(m.localOf[4], 1);  // second rank of node 1
  EXPECT_EQ(mf::moeRailPeer(m, 0), 3);
  EXPECT_EQ(mf::moeRailPeer(m, 2), 5);
  EXPECT_EQ(mf::moeFanGateway(m, 2), 0);  // src 2 is local 0 of node 2; local 0 of node 1 is 0
  EXPECT_EQ(mf::moeFanGateway(m, 5), 4);
  EXPECT_EQ(mf::moeCntStride(m, 3), 3 + 6 + 2);
  ASSERT_TRUE(mf::moeNodeMapInit(6, shuffled, 4, false, &m));
  EXPECT_EQ(m.rail, 0) << "dedup not asked";
  EXPECT_EQ(mf::moeCntStride(m, 3), 3 + 6);
  const int32_t oneEach[2] = {0, 1}, gap[3] = {0, 2, 2}, neg[2] = {0, -1};
  ASSERT_TRUE(mf::moeNodeMapInit(2, oneEach, 0, true, &m));
  EXPECT_EQ(m.rail, 0) << "one rank per node";
  EXPECT_FALSE(mf::moeNodeMapInit(3, gap, 0, true, &m)) << "node 1 has no rank";
  EXPECT_FALSE(mf::moeNodeMapInit(2, neg, 0, true, &m));
  EXPECT_FALSE(mf::moeNodeMapInit(0, neg, 0, true, &m));
  EXPECT_FALSE(mf::moeNodeMapInit(2, oneEach, 2, true, &m)) << "me outside the comm";
}

// Hand case, 2x2 (ranks 0,1 | 2,3), one expert per rank, rank 0's tokens: t0 -> {2, 3},
// t1 -> {2, -1}, t2 -> {1, 3}. Direct: 4 rows cross; dedup: 3, all to rank 0's gateway 2.
// With maxRows 2 the 3 tokens for node 1 do not fit one block: node 1 spills (4 rows).
TEST(MoeNode, HandCaseAndSpill) {
  const int32_t nodes[4] = {0, 0, 1, 1}, idx[6] = {2, 3, 2, -1, 1, 3};
  for (int64_t P : {3, 2}) {
    mf::MoeNodeMap m;
    ASSERT_TRUE(mf::moeNodeMapInit(4, nodes, 0, true, &m));
    const int st = mf::moeCntStride(m, 1);
    std::vector<int32_t> msg(4 * st, -5), rail(2, -5);
    int64_t bad = -1;
    ASSERT_TRUE(mf::moeSourceCounts(m, 3, 2, 4, 1, idx, P, msg.data(), rail.data(), &bad));
    EXPECT_EQ(rail[0], 1);
    EXPECT_EQ(rail[1], 3);
    const int32_t* c2 = &msg[2 * st];
    const int32_t* c3 = &msg[3 * st];
    EXPECT_EQ(c2[mf::moeCntToks(1)], 2);
    EXPECT_EQ(c3[mf::moeCntToks(1)], 2);
    EXPECT_EQ(msg[1 * st + mf::moeCntBlk(1)], 1);
    if (P == 3) {
      EXPECT_EQ(c2[mf::moeCntMode(1)], mf::kMoeRailBlock);
      EXPECT_EQ(c2[mf::moeCntBlk(1)], 3);
      EXPECT_EQ(c2[mf::moeCntFan(1, 0)], 2);
      EXPECT_EQ(c2[mf::moeCntFan(1, 1)], 2);
      EXPECT_EQ(c3[mf::moeCntMode(1)], mf::kMoeViaGateway);
      EXPECT_EQ(c3[mf::moeCntBlk(1)], 0);
      EXPECT_EQ(mf::moeCrossNodeRows(m, msg.data(), 1), 3);
    } else {
      EXPECT_EQ(c2[mf::moeCntMode(1)], mf::kMoeDirect);
      EXPECT_EQ(c3[mf::moeCntMode(1)], mf::kMoeDirect);
      EXPECT_EQ(c2[mf::moeCntBlk(1)], 2);
      EXPECT_EQ(mf::moeCrossNodeRows(m, msg.data(), 1), 4);
    }
  }
}

// The receiver's route check rejects every inconsistent entry (rank 2 of 2x2 receiving).
TEST(MoeNode, RouteValid) {
  const int32_t nodes[4] = {0, 0, 1, 1};
  mf::MoeNodeMap m;
  ASSERT_TRUE(mf::moeNodeMapInit(4, nodes, 2, true, &m));
  const int epr = 1;
  auto msgOf = [&](int32_t toks, int32_t blk, int32_t mode, int32_t f0, int32_t f1) {
    std::vector<int32_t> c(mf::moeCntStride(m, epr), 0);
    c[mf::moeCntToks(epr)] = toks;
    c[mf::moeCntBlk(epr)] = blk;
    c[mf::moeCntMode(epr)] = mode;
    c[mf::moeCntFan(epr, 0)] = f0;
    c[mf::moeCntFan(epr, 1)] = f1;
    return c;
  };
  auto ok = [&](const std::vector<int32_t>& c, int src) {
    return mf::moeCntRouteValid(m, c.data(), src, epr, 8);
  };
  EXPECT_TRUE(ok(msgOf(2, 3, mf::kMoeRailBlock, 2, 2), 0));  // I am rank 0's gateway
  EXPECT_TRUE(ok(msgOf(2, 0, mf::kMoeViaGateway, 0, 0), 1));
  EXPECT_TRUE(ok(msgOf(2, 2, mf::kMoeDirect, 0, 0), 1));
  EXPECT_TRUE(ok(msgOf(2, 2, mf::kMoeDirect, 0, 0), 3));
  EXPECT_FALSE(ok(msgOf(2, 0, mf::kMoeViaGateway, 0, 0), 0)) << "I am its gateway";
  EXPECT_FALSE(ok(msgOf(2, 3, mf::kMoeRailBlock, 2, 2), 1)) << "rank 3 is its gateway";
  EXPECT_FALSE(ok(msgOf(2, 1, mf::kMoeViaGateway, 0, 0), 1)) << "a via-gateway block is empty";
  EXPECT_FALSE(ok(msgOf(2, 0, mf::kMoeViaGateway, 0, 0), 3)) << "same node";
  EXPECT_FALSE(ok(msgOf(2, 1, mf::kMoeDirect, 0, 0), 1)) << "blk != toks";
  EXPECT_FALSE(ok(msgOf(2, 3, mf::kMoeRailBlock, 1, 2), 0)) << "fan to me != toks";
  EXPECT_FALSE(ok(msgOf(2, 5, mf::kMoeRailBlock, 2, 2), 0)) << "fan rows < rail rows";
  EXPECT_FALSE(ok(msgOf(2, 3, mf::kMoeRailBlock, 2, 4), 0)) << "a fan entry > rail rows";
  EXPECT_FALSE(ok(msgOf(9, 9, mf::kMoeDirect, 0, 0), 1)) << "more than maxRows";
  EXPECT_FALSE(ok(msgOf(-1, -1, -1, -1, -1), 0)) << "a message that never came";
  EXPECT_FALSE(ok(msgOf(2, 2, 3, 0, 0), 1)) << "unknown mode";
  mf::MoeNodeMap off;
  ASSERT_TRUE(mf::moeNodeMapInit(4, nodes, 2, false, &off));
  EXPECT_FALSE(mf::moeCntRouteValid(off, msgOf(2, 0, mf::kMoeViaGateway, 0, 0).data(), 1, epr, 8))
      << "no gateway without dedup";
}

// The bytes model on uniform top-k routing (distinct experts) matches the expectation the
// plan's GPU bytes test relies on: per token, direct sends one row per remote rank hit, dedup
// one per remote node hit. P(a group of g experts missed) = C(E-g, k) / C(E, k).
TEST(MoeNode, CrossNodeRowsUniform) {
  const uint64_t seed = mktest::testSeed() ^ 0xb17e5ull;
  printf("MoeNode cross-node rows: seed %llu\n", (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  struct Shape {
    int nNodes, nLocal, E, k;
  };
  for (const Shape sh : {Shape{2, 2, 64, 6}, Shape{2, 4, 64, 8}, Shape{2, 4, 256, 8}}) {
    const int n = sh.nNodes * sh.nLocal, epr = sh.E / n, T = 4096;
    std::vector<int32_t> nodes(n), idx((size_t)T * sh.k);
    for (int r = 0; r < n; ++r) nodes[r] = r / sh.nLocal;
    for (int t = 0; t < T; ++t) {
      std::vector<int32_t> all(sh.E);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      std::copy_n(all.begin(), sh.k, &idx[(size_t)t * sh.k]);
    }
    auto miss = [&](int g) {
      double p = 1;
      for (int i = 0; i < sh.k; ++i) p *= double(sh.E - g - i) / double(sh.E - i);
      return p;
    };
    const double remote = (sh.nNodes - 1) * sh.nLocal;
    const double wantDirect = remote * (1 - miss(epr));
    const double wantDedup = (sh.nNodes - 1) * (1 - miss(epr * sh.nLocal));
    double got[2];
    for (int dedup = 0; dedup < 2; ++dedup) {
      mf::MoeNodeMap m;
      ASSERT_TRUE(mf::moeNodeMapInit(n, nodes.data(), 0, dedup != 0, &m));
      std::vector<int32_t> msg((size_t)n * mf::moeCntStride(m, epr)), rail(sh.nNodes);
      int64_t bad = -1;
      ASSERT_TRUE(mf::moeSourceCounts(m, T, sh.k, sh.E, epr, idx.data(), (int64_t)T * sh.k,
                                      msg.data(), rail.data(), &bad));
      got[dedup] = double(mf::moeCrossNodeRows(m, msg.data(), epr)) / T;
    }
    printf("  %dx%d E=%d k=%d: remote rows/token direct %.3f (expect %.3f), dedup %.3f (%.3f)\n",
           sh.nNodes, sh.nLocal, sh.E, sh.k, got[0], wantDirect, got[1], wantDedup);
    EXPECT_NEAR(got[0], wantDirect, 0.05 * wantDirect);
    EXPECT_NEAR(got[1], wantDedup, 0.05 * wantDedup);
  }
}
