// mktest::parallelFor / parallelForRanges (tests/common/parallel.h), which the GPU suites' host
// references run on: every index exactly once, whatever the thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include "common/parallel.h"
#include "common/test_util.h"

namespace {

TEST(ParallelFor, EveryIndexOnceAtAnyCount) {
  std::mt19937_64 rng(mktest::testSeed());
  for (size_t count :
       {size_t(0), size_t(1), size_t(2), size_t(31), size_t(1000), size_t(50000 + rng() % 1000)}) {
    for (unsigned maxThreads : {1u, 3u, 32u}) {
      std::vector<std::atomic<int>> hits(count);
      for (auto& h : hits) h = 0;
      mktest::parallelFor(
          count, [&](size_t i) { hits[i].fetch_add(1); }, maxThreads);
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(hits[i].load(), 1)
            << "index " << i << " of " << count << ", " << maxThreads << " threads";
    }
  }
}

TEST(ParallelForRanges, RangesTileTheIndicesOnce) {
  std::mt19937_64 rng(mktest::testSeed() ^ 0x5a5a);
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(4096), size_t(100003 + rng() % 97)}) {
    for (size_t minPer : {size_t(0), size_t(1), size_t(64), size_t(1 << 20)}) {
      std::mutex m;
      std::vector<std::pair<size_t, size_t>> got;
      mktest::parallelForRanges(n, minPer, [&](size_t b, size_t e) {
        std::lock_guard<std::mutex> l(m);
        got.emplace_back(b, e);
      });
      std::sort(got.begin(), got.end());
      size_t at = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].first, at) << "n " << n << " minPer " << minPer;
        ASSERT_LT(got[i].first, got[i].second);
        // Every range but the last holds at least minPer indices.
        if (i + 1 < got.size()) ASSERT_GE(got[i].second - got[i].first, minPer);
        at = got[i].second;
      }
      ASSERT_EQ(at, n) << "n " << n << " minPer " << minPer;
    }
  }
}

}  // namespace
