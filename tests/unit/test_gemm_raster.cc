// The GEMM engine's raster arithmetic (fused/gemm/raster.h, which the kernel runs): the grouped
// raster and the walk of a grouped GEMM's groups, under both group rasters. Each must visit
// every tile exactly once; raster 1 must keep a group's tiles together, in group order, and put
// no two groups in one band.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/test_util.h"
#include "fused/gemm/raster.h"

namespace {

using mk::gemm::groupTileCoords;
using mk::gemm::rasterCoords;

TEST(GemmRaster, PlainVisitsEveryTileOnceBandByBand) {
  std::mt19937 rng(mktest::testSeed() ^ 0x7a57u);
  for (int i = 0; i < 300; ++i) {
    const int32_t tilesM = 1 + (int32_t)(rng() % 40), tilesN = 1 + (int32_t)(rng() % 24);
    const int32_t groupM = 1 + (int32_t)(rng() % 12);
    std::set<std::pair<int32_t, int32_t>> seen;
    for (int32_t t = 0; t < tilesM * tilesN; ++t) {
      int32_t m, n;
      rasterCoords(tilesM, tilesN, groupM, t, &m, &n);
      ASSERT_TRUE(m >= 0 && m < tilesM && n >= 0 && n < tilesN)
          << "t " << t << " of " << tilesM << "x" << tilesN << " groupM " << groupM;
      ASSERT_EQ(m / groupM, t / (groupM * tilesN)) << "tile " << t << " outside its band";
      ASSERT_TRUE(seen.insert({m, n}).second) << "tile (" << m << "," << n << ") twice";
    }
  }
}

// Random group sizes in row blocks (empty groups at the start, middle and end included).
std::vector<int32_t> drawPrefix(std::mt19937& rng, int32_t num) {
  std::vector<int32_t> prefix(num + 1, 0);
  for (int32_t g = 0; g < num; ++g) {
    const uint32_t kind = rng() % 4;
    const int32_t blocks =
        kind == 0 ? 0 : (kind == 1 ? 1 + (int32_t)(rng() % 3) : 1 + (int32_t)(rng() % 20));
    prefix[g + 1] = prefix[g] + blocks;
  }
  return prefix;
}

TEST(GemmRaster, GroupedVisitsEveryTileOnceUnderBothRasters) {
  std::mt19937 rng(mktest::testSeed() ^ 0x9e0bu);
  for (int i = 0; i < 400; ++i) {
    const int32_t num = 1 + (int32_t)(rng() % 40);
    const std::vector<int32_t> prefix = drawPrefix(rng, num);
    const int32_t tilesN = 1 + (int32_t)(rng() % 20), groupM = 1 + (int32_t)(rng() % 10);
    const int32_t tiles = prefix[num] * tilesN;
    for (int32_t raster : {0, 1}) {
      std::set<std::tuple<int32_t, int32_t, int32_t>> seen;
      int32_t lastGroup = 0;
      for (int32_t t = 0; t < tiles; ++t) {
        int32_t g, blk, n;
        groupTileCoords(num, prefix.data(), tilesN, groupM, raster, t, &g, &blk, &n);
        const std::string where = "raster " + std::to_string(raster) + " t " + std::to_string(t) +
                                  " of " + std::to_string(tiles) + " groupM " +
                                  std::to_string(groupM);
        ASSERT_TRUE(g >= 0 && g < num) << where;
        ASSERT_TRUE(blk >= 0 && blk < prefix[g + 1] - prefix[g]) << where << ": group " << g;
        ASSERT_TRUE(n >= 0 && n < tilesN) << where;
        ASSERT_TRUE(seen.insert({g, blk, n}).second) << where << ": a tile twice";
        if (raster == 1) {
          // Groups in order, each group's tiles together, bands inside the group.
          ASSERT_GE(g, lastGroup) << where;
          ASSERT_GE(t, prefix[g] * tilesN) << where;
          ASSERT_LT(t, prefix[g + 1] * tilesN) << where;
          ASSERT_EQ(blk / groupM, (t - prefix[g] * tilesN) / (groupM * tilesN)) << where;
          lastGroup = g;
        }
      }
      EXPECT_EQ((int32_t)seen.size(), tiles);
    }
  }
}

}  // namespace
