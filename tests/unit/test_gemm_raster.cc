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

// The tall tail (GemmParams::tall): a group of b row blocks has b wide tiles in each of the
// first tilesN - 1 column blocks and one tall tile (row blocks 2j, 2j + 1 of a band) per pair in
// the last. Every (row block, column block) of the group must be covered exactly once, a tall
// tile must never span two bands, each band's tiles must come together, and the tall tiles'
// places in consecutive full bands must differ (the rotation that spreads them over CTAs).
TEST(GemmRaster, TallTailCoversEveryBlockOnceBandByBand) {
  using mk::gemm::tallTailCoords;
  using mk::gemm::tallTailTiles;
  std::mt19937 rng(mktest::testSeed() ^ 0x7a11u);
  for (int i = 0; i < 500; ++i) {
    const int32_t blocks = (int32_t)(rng() % 70), tilesN = 1 + (int32_t)(rng() % 12);
    const int32_t groupM = 2 * (1 + (int32_t)(rng() % 8));
    const int32_t full = tilesN - 1, tiles = tallTailTiles(blocks, tilesN, groupM);
    std::set<std::pair<int32_t, int32_t>> seen;
    int32_t lastBand = 0;
    std::vector<int32_t> firstTallAt;  // per band: the place in the band of its first tall tile
    for (int32_t r = 0; r < tiles; ++r) {
      int32_t blk, n;
      tallTailCoords(blocks, tilesN, groupM, r, &blk, &n);
      const std::string where = "tile " + std::to_string(r) + " of " + std::to_string(blocks) +
                                " blocks, tilesN " + std::to_string(tilesN) + ", groupM " +
                                std::to_string(groupM);
      ASSERT_TRUE(blk >= 0 && blk < blocks && n >= 0 && n < tilesN) << where;
      const int32_t band = blk / groupM;
      ASSERT_GE(band, lastBand) << where << ": bands out of order";
      lastBand = band;
      const int32_t perBand = groupM * full + groupM / 2;
      ASSERT_TRUE(seen.insert({blk, n}).second) << where << ": (" << blk << "," << n << ") twice";
      if (n == full) {
        if ((int32_t)firstTallAt.size() == band) firstTallAt.push_back(r - band * perBand);
        ASSERT_EQ((blk - band * groupM) % 2, 0) << where << ": tall tile at an odd row block";
        if (blk + 1 < blocks) {
          ASSERT_EQ((blk + 1) / groupM, band) << where << ": tall tile spans two bands";
          ASSERT_TRUE(seen.insert({blk + 1, n}).second) << where << ": second block twice";
        }
      }
    }
    // Full bands (all but maybe the last) with wide tiles: consecutive ones place their first
    // tall tile differently.
    for (int32_t b = 1; b < blocks / groupM && full > 0; ++b)
      ASSERT_NE(firstTallAt[b], firstTallAt[b - 1])
          << "bands " << b - 1 << " and " << b << " of " << blocks << " blocks, tilesN " << tilesN
          << ", groupM " << groupM << ": tall tiles at the same place";
    ASSERT_EQ((int64_t)seen.size(), (int64_t)blocks * tilesN)
        << blocks << " blocks, tilesN " << tilesN << ", groupM " << groupM;
  }
}

}  // namespace
