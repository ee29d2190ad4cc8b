// MoeNode.*: the per-node dedup of the MoE AllToAll path (fused/ops/moe/moe_node.h) against
// today's direct AllToAll, on the host model of moe_node_model.h: random routings on 2x2, 2x4,
// 4x2 and 3x3 virtual nodes, dedup-off layouts, the spill rule, the route checks and the bytes
// model on hand cases.
#include <cstdint>
#include <cstdio>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "common/test_util.h"
#include "unit/moe_node_model.h"

namespace mf = mk::fused;
using namespace moenode;

namespace {

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
