// MoE routing arithmetic (fused/ops/moe/moe_layout.h): every rank's routed slots land on
// distinct rows of their destination's packed layout, inside the right expert, in source then
// token order, with tile-aligned experts; bad expert ids are named.
#include <cstdint>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "fused/ops/moe/moe_layout.h"
#include "common/test_util.h"

using mk::fused::MoeShape;

namespace {

struct Case {
  int nRanks, epr, tokens, topk;
  bool hot;
};

void runCase(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int E = c.nRanks * c.epr, tile = 128;
  MoeShape s{c.tokens, c.topk, E, c.nRanks, c.epr};
  std::vector<std::vector<int32_t>> idx(c.nRanks), send(c.nRanks);
  for (int r = 0; r < c.nRanks; ++r) {
    idx[r].resize((size_t)c.tokens * c.topk);
    for (auto& v : idx[r]) {
      const uint64_t u = rng() % 10;
      v = u == 0 ? -1 : (c.hot && u < 6 ? 1 % E : (int32_t)(rng() % E));
    }
    send[r].resize(E);
    int64_t bad = -1;
    ASSERT_TRUE(mk::fused::moeSendCounts(s, idx[r].data(), send[r].data(), &bad));
  }
  // Each destination's layout from the counts the sources send it.
  std::vector<std::vector<int32_t>> start(c.nRanks), count(c.nRanks), srcRow(c.nRanks);
  std::vector<int64_t> rows(c.nRanks);
  for (int d = 0; d < c.nRanks; ++d) {
    std::vector<int32_t> recv((size_t)c.nRanks * c.epr);
    for (int src = 0; src < c.nRanks; ++src)
      for (int e = 0; e < c.epr; ++e) recv[src * c.epr + e] = send[src][d * c.epr + e];
    start[d].resize(c.epr);
    count[d].resize(c.epr);
    srcRow[d].resize((size_t)c.nRanks * c.epr);
    rows[d] = mk::fused::moeRecvLayout(s, recv.data(), tile, start[d].data(), count[d].data(),
                                       srcRow[d].data());
    int64_t expect = 0;
    for (int e = 0; e < c.epr; ++e) {
      EXPECT_EQ(start[d][e] % tile, 0) << "dst " << d << " expert " << e;
      EXPECT_EQ(start[d][e], expect) << "experts packed in order, tile-aligned";
      expect += (count[d][e] + tile - 1) / tile * tile;
    }
    EXPECT_EQ(rows[d], expect);
  }
  // Place every slot of every source; check owner, range, uniqueness and order.
  std::vector<std::map<int64_t, std::pair<int, int64_t>>> owner(c.nRanks);  // row -> (src, slot)
  for (int src = 0; src < c.nRanks; ++src) {
    std::vector<int32_t> at(E), seen(E, 0);
    for (int e = 0; e < E; ++e) at[e] = srcRow[e / c.epr][src * c.epr + e % c.epr];
    for (int64_t i = 0; i < (int64_t)idx[src].size(); ++i) {
      const int64_t row = mk::fused::moeSlotRow(s, idx[src].data(), i, at.data(), seen.data());
      const int32_t e = idx[src][i];
      if (e < 0) {
        EXPECT_EQ(row, -1);
        continue;
      }
      const int d = mk::fused::moeOwner(s, e), le = e % c.epr;
      ASSERT_GE(row, start[d][le]) << "src " << src << " slot " << i;
      ASSERT_LT(row, (int64_t)start[d][le] + count[d][le]) << "src " << src << " slot " << i;
      ASSERT_TRUE(owner[d].emplace(row, std::make_pair(src, i)).second)
          << "row " << row << " of rank " << d << " assigned twice";
    }
  }
  // Within an expert: sources in rank order, each source's slots in slot order.
  for (int d = 0; d < c.nRanks; ++d) {
    int64_t placed = 0;
    for (int e = 0; e < c.epr; ++e) placed += count[d][e];
    EXPECT_EQ((int64_t)owner[d].size(), placed);
    std::pair<int, int64_t> prev{-1, -1};
    int prevExpert = -1;
    for (const auto& kv : owner[d]) {
      const int le = idx[kv.second.first][kv.second.second] % c.epr;
      if (le == prevExpert) EXPECT_LT(prev, kv.second) << "order inside expert " << le;
      prev = kv.second;
      prevExpert = le;
    }
  }
}

}  // namespace

TEST(MoeLayout, EverySlotLandsOnceInOrder) {
  const uint64_t seed = mktest::testSeed();
  const Case cases[] = {{1, 1, 50, 1, false},  {2, 3, 300, 2, false}, {4, 16, 1000, 8, true},
                        {8, 1, 257, 8, false}, {3, 5, 129, 6, true},  {4, 2, 0, 4, false}};
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "ranks " << c.nRanks << " experts/rank " << c.epr
                                    << " tokens " << c.tokens << " k " << c.topk);
    runCase(c, seed + 31 * (++i));
  }
}

TEST(MoeLayout, BadExpertIdIsNamed) {
  MoeShape s{3, 2, 4, 2, 2};
  std::vector<int32_t> counts(4);
  int64_t bad = -1;
  const int32_t ok[] = {0, 3, -1, 2, 1, 1};
  EXPECT_TRUE(mk::fused::moeSendCounts(s, ok, counts.data(), &bad));
  EXPECT_EQ(counts, (std::vector<int32_t>{1, 2, 1, 1}));
  const int32_t high[] = {0, 3, -1, 2, 4, 1};
  EXPECT_FALSE(mk::fused::moeSendCounts(s, high, counts.data(), &bad));
  EXPECT_EQ(bad, 4);
  const int32_t neg[] = {0, -2, -1, 2, 1, 1};
  EXPECT_FALSE(mk::fused::moeSendCounts(s, neg, counts.data(), &bad));
  EXPECT_EQ(bad, 1);
}
