// CPU tests of the GEMM engine's stream-K schedule (fused/gemm/streamk.h, the same inline
// functions the kernel walks) and of canImplement's stream-K refusals: every (tile, k-step)
// is computed exactly once, the data-parallel part is whole waves of whole tiles, a split
// tile's k-step 0 is the last item of its finisher's range and its other parts are the first
// items of the contributors skContribEnd names, at most kSkMaxContrib CTAs per tile, and the
// CTAs' loads (in k-steps) differ by at most one k-step.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include <gtest/gtest.h>

#include "fused/gemm/gemm.h"
#include "fused/gemm/streamk.h"

using mk::gemm::GemmArgs;
using mk::gemm::SkPlan;
using mk::gemm::SkWalk;

namespace {

struct Item {
  int32_t tile, kb, ke;
};

std::vector<Item> walk(const SkPlan& s, int32_t cta) {
  std::vector<Item> out;
  SkWalk w;
  mk::gemm::skWalkBegin(s, cta, &w);
  Item it;
  while (mk::gemm::skWalkNext(s, &w, &it.tile, &it.kb, &it.ke)) out.push_back(it);
  return out;
}

// Checks one (tiles, kIt, grid) schedule; returns the largest count of CTAs on one tile.
int checkPlan(int32_t tiles, int32_t kIt, int32_t grid) {
  SCOPED_TRACE("tiles " + std::to_string(tiles) + " kIt " + std::to_string(kIt) + " grid " +
               std::to_string(grid));
  const SkPlan s = mk::gemm::skMakePlan(tiles, kIt, grid, true);
  const bool expectSk = tiles > grid && tiles % grid != 0;
  EXPECT_EQ(s.units > 0, expectSk);
  EXPECT_EQ(s.dpTiles % grid, expectSk ? 0 : tiles % grid);
  if (expectSk) {
    EXPECT_EQ(s.dpTiles, (tiles / grid - 1) * grid);
    EXPECT_EQ(s.units, (int64_t)(tiles - s.dpTiles) * kIt);
  }
  std::vector<int> cover((size_t)tiles * kIt, 0);
  std::vector<std::vector<int>> ctasOf(tiles);
  int64_t maxLoad = 0, minLoad = INT64_MAX;
  for (int32_t c = 0; c < grid; ++c) {
    const std::vector<Item> items = walk(s, c);
    int64_t load = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const Item& it = items[i];
      EXPECT_GE(it.tile, 0);
      EXPECT_LT(it.tile, tiles);
      EXPECT_GE(it.kb, 0);
      EXPECT_LT(it.kb, it.ke) << "an empty item";
      EXPECT_LE(it.ke, kIt);
      if (it.tile < 0 || it.tile >= tiles || it.kb < 0 || it.ke > kIt) continue;
      for (int32_t k = it.kb; k < it.ke; ++k) ++cover[(size_t)it.tile * kIt + k];
      ctasOf[it.tile].push_back(c);
      load += it.ke - it.kb;
      if (it.tile < s.dpTiles) {
        EXPECT_EQ(it.tile % grid, c) << "data-parallel tiles walk cta, cta + grid, ...";
        EXPECT_TRUE(it.kb == 0 && it.ke == kIt);
      }
      // A non-finisher part opens the CTA's range; a finisher part closes it.
      if (it.kb > 0) {
        EXPECT_EQ(i, (size_t)(s.dpTiles / grid))
            << "a part past k-step 0 must be the first SK item";
      }
      if (it.kb == 0 && it.ke < kIt) {
        EXPECT_EQ(i + 1, items.size()) << "a finisher part must be the CTA's last item";
        const int32_t end = mk::gemm::skContribEnd(s, c, it.tile);
        // Its contributors: exactly the CTAs after c whose first SK item is a part of it.
        int32_t k = it.ke;
        for (int32_t o = c + 1; o < end; ++o) {
          const std::vector<Item> oi = walk(s, o);
          const size_t first = (size_t)(s.dpTiles / grid);
          EXPECT_LT(first, oi.size());
          if (first >= oi.size()) break;
          EXPECT_EQ(oi[first].tile, it.tile);
          EXPECT_EQ(oi[first].kb, k) << "contributor " << o << " continues where the last ended";
          k = oi[first].ke;
        }
        EXPECT_EQ(k, kIt) << "the contributors cover the tile's remaining k-steps";
      }
    }
    maxLoad = std::max(maxLoad, load);
    minLoad = std::min(minLoad, load);
  }
  for (size_t u = 0; u < cover.size(); ++u) {
    EXPECT_EQ(cover[u], 1) << "tile " << u / kIt << " k-step " << u % kIt;
    if (cover[u] != 1) break;
  }
  if (expectSk) {
    // Near-equal ranges: the loads differ by at most one k-step, and the longest is at most
    // the data-parallel schedule's (tiles / grid + 1 whole tiles).
    EXPECT_LE(maxLoad - minLoad, 1);
    EXPECT_LE(maxLoad, (int64_t)(tiles / grid + 1) * kIt);
  }
  int most = 0;
  for (const auto& v : ctasOf) most = std::max(most, (int)v.size());
  EXPECT_LE(most, mk::gemm::kSkMaxContrib);
  return most;
}

}  // namespace

TEST(GemmStreamKSchedule, CoversEveryKStepOnce) {
  // The H200 case (8192^2: 2048 tiles on 132 CTAs) at K = 512 .. 8192, one-step tiles, tails.
  for (int kIt : {1, 2, 3, 8, 16, 17, 32, 128})
    EXPECT_EQ(checkPlan(2048, kIt, 132), kIt == 1 ? 1 : 2);
  for (int grid : {1, 2, 3, 5, 7, 64, 114, 132})
    for (int tiles : {1, 2, 3, 4, 9, 10, 64, 135, 263, 512, 1000})
      for (int kIt : {1, 2, 5, 16}) checkPlan(tiles, kIt, grid);
}

TEST(GemmStreamKSchedule, OffOrWholeWavesIsDataParallel) {
  const SkPlan off = mk::gemm::skMakePlan(2048, 16, 132, false);
  EXPECT_EQ(off.units, 0);
  EXPECT_EQ(off.dpTiles, 2048);
  const SkPlan whole = mk::gemm::skMakePlan(1056, 16, 132, true);  // 8 whole waves
  EXPECT_EQ(whole.units, 0);
  const SkPlan h200 = mk::gemm::skMakePlan(2048, 16, 132, true);
  EXPECT_EQ(h200.dpTiles, 14 * 132);
  EXPECT_EQ(h200.units, 200 * 16);
}

TEST(GemmStreamKSchedule, CanImplementRefusesWhatItCannotCombine) {
  alignas(256) static char buf[4096];
  GemmArgs a;
  a.M = 1000;
  a.N = 3000;
  a.K = 512;
  a.A = buf;
  a.B = buf + 256;
  a.D = buf + 512;
  a.streamK = 1;
  std::string why;
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  a.dType = mk::gemm::DType::kF32;
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  a.bLayout = mk::gemm::BLayout::kKN;
  a.beta = 0.5f;
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  auto reject = [&](GemmArgs b, const char* frag) {
    std::string w;
    EXPECT_FALSE(mk::gemm::canImplement(b, &w));
    EXPECT_NE(w.find(frag), std::string::npos) << "message: " << w;
  };
  GemmArgs b = a;
  b.streamK = 2;
  reject(b, "streamK=");
  b = a;
  b.pipeline = 3;
  b.dType = mk::gemm::DType::kBF16;
  reject(b, "pipeline 3");
  b = a;
  b.cluster = 2;
  b.dType = mk::gemm::DType::kBF16;
  reject(b, "CTA pairs");
  b = a;
  b.tileClaim = reinterpret_cast<int32_t*>(buf + 1024);
  reject(b, "tileClaim");
  b = a;
  b.dTiled = true;
  b.beta = 0.0f;
  reject(b, "tile-by-tile");
  b = a;
  b.hooks.tileOrder = reinterpret_cast<const int32_t*>(buf + 1024);
  reject(b, "hooks");
  b = a;
  b.hooks.rowReady = reinterpret_cast<const uint64_t*>(buf + 1024);
  reject(b, "hooks");
  b = a;
  b.hooks.tileDone = reinterpret_cast<uint64_t*>(buf + 1024);
  reject(b, "hooks");
  b = a;
  b.hooks.rowBlockOffset = 1;
  reject(b, "hooks");
  b = a;
  b.groups.num = 2;
  b.groups.rowStart = reinterpret_cast<const int32_t*>(buf + 1024);
  b.groups.rowCount = reinterpret_cast<const int32_t*>(buf + 1024);
  reject(b, "groups");
  // Off (-1) and the environment default (0) take everything the engine takes.
  b.streamK = -1;
  EXPECT_TRUE(mk::gemm::canImplement(b, &why)) << why;
}
