// The attention engine's host-visible schedule rules (fused/attention/attn.h), which the
// kernel's producer and consumers both walk: positions of a rank's slice (SeqMap, contiguous
// and zigzag), the position range of a block of rows, and kvVisible, the block-level causal
// verdict (skip / no mask / mask). Checked by brute force over every (query, key) pair of
// random configurations, plus the online-softmax recurrence of the consumers (running max
// with the -inf guard, rescaled sums) against a direct softmax, in fp64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "common/test_util.h"
#include "fused/attention/attn.h"

namespace {

using mk::attn::SeqMap;

SeqMap makeSeq(int S, int chunks, int n) {
  SeqMap m;
  m.S = S;
  m.chunks = chunks;
  m.nRanks = n;
  return m;
}

TEST(AttnSchedule, PositionsCoverTheSequenceOnce) {
  for (int chunks = 1; chunks <= 2; ++chunks) {
    for (int n : {1, 2, 3, 5, 8}) {
      for (int S : {2, 6, 128, 130}) {
        const SeqMap m = makeSeq(S, chunks, n);
        std::set<int64_t> seen;
        for (int r = 0; r < n; ++r)
          for (int s = 0; s < S; ++s) seen.insert(m.pos(r, s));
        ASSERT_EQ((int64_t)seen.size(), (int64_t)n * S) << "chunks " << chunks << " n " << n;
        EXPECT_EQ(*seen.begin(), 0);
        EXPECT_EQ(*seen.rbegin(), (int64_t)n * S - 1);
      }
    }
  }
  // zigzag: rank r holds chunk r then chunk 2n-1-r
  const SeqMap z = makeSeq(8, 2, 3);
  EXPECT_EQ(z.pos(0, 0), 0);
  EXPECT_EQ(z.pos(0, 4), 5 * 4);
  EXPECT_EQ(z.pos(2, 3), 2 * 4 + 3);
  EXPECT_EQ(z.pos(2, 4), 3 * 4);
}

TEST(AttnSchedule, RangeIsTheBruteForceMinMax) {
  std::mt19937_64 rng(mktest::testSeed());  // MKTEST_SEED repeats a failure
  for (int it = 0; it < 2000; ++it) {
    const int chunks = 1 + rng() % 2;
    const int n = 1 + rng() % 8;
    const int S = chunks * (1 + rng() % 300);
    const SeqMap m = makeSeq(S, chunks, n);
    const int r = rng() % n;
    const int s0 = rng() % S;
    const int s1 = s0 + 1 + rng() % (S - s0);
    int64_t lo, hi, blo = INT64_MAX, bhi = INT64_MIN;
    m.range(r, s0, s1, &lo, &hi);
    for (int s = s0; s < s1; ++s) {
      blo = std::min(blo, m.pos(r, s));
      bhi = std::max(bhi, m.pos(r, s));
    }
    ASSERT_EQ(lo, blo) << "S " << S << " chunks " << chunks << " rows " << s0 << ".." << s1;
    ASSERT_EQ(hi, bhi) << "S " << S << " chunks " << chunks << " rows " << s0 << ".." << s1;
  }
}

// The kernel's causal mask is one bound per query row (prefixUpTo): the rows of a slice with
// position <= q must be exactly its first prefixUpTo(r, q) rows, for every q including ones
// before and after the whole sequence.
TEST(AttnSchedule, VisibleKeysAreThePrefixCounted) {
  std::mt19937_64 rng(mktest::testSeed());  // MKTEST_SEED repeats a failure
  for (int it = 0; it < 600; ++it) {
    const int chunks = 1 + rng() % 2;
    const int n = 1 + rng() % 8;
    const int S = chunks * (1 + rng() % 200);
    const SeqMap m = makeSeq(S, chunks, n);
    const int r = rng() % n;
    const int64_t q = (int64_t)(rng() % (n * S + 20)) - 10;
    const int64_t pre = m.prefixUpTo(r, q);
    ASSERT_GE(pre, 0);
    ASSERT_LE(pre, S);
    for (int s = 0; s < S; ++s)
      ASSERT_EQ(m.pos(r, s) <= q, s < pre)
          << "S " << S << " chunks " << chunks << " n " << n << " rank " << r << " q " << q
          << " row " << s << " prefix " << pre;
  }
}

// The persistent CTAs' tile walk (producer and consumers both loop "for k: t =
// tileOfRound(k, ...); stop at t >= numTiles"): every tile exactly once, in either order; and
// with causal costs (descending in t) the snake's busiest CTA carries no more than the plain
// stride's.
TEST(AttnSchedule, TileWalkCoversEveryTileOnce) {
  std::mt19937_64 rng(mktest::testSeed());  // MKTEST_SEED repeats a failure
  for (int it = 0; it < 400; ++it) {
    const int32_t nCtas = 1 + rng() % 140;
    const int32_t numTiles = 1 + rng() % 3000;
    int64_t worst[2] = {0, 0};
    for (int snake = 0; snake < 2; ++snake) {
      std::vector<int> hits(numTiles, 0);
      for (int32_t cta = 0; cta < nCtas; ++cta) {
        int64_t load = 0;
        for (int32_t k = 0;; ++k) {
          const int32_t t = mk::attn::tileOfRound(k, cta, nCtas, snake != 0);
          if (t >= numTiles) break;
          ASSERT_GE(t, 0);
          ++hits[t];
          load += numTiles - t;  // causal: tile t (heaviest first) costs numTiles - t
        }
        worst[snake] = std::max(worst[snake], load);
      }
      for (int32_t t = 0; t < numTiles; ++t)
        ASSERT_EQ(hits[t], 1) << "tile " << t << " of " << numTiles << ", " << nCtas
                              << " CTAs, snake " << snake;
    }
    EXPECT_LE(worst[1], worst[0]) << numTiles << " tiles, " << nCtas << " CTAs";
  }
}

// tileCoords maps the tiles one to one onto (head, row block) in every order, and causal
// tiles come heaviest (highest row block) first.
TEST(AttnSchedule, TileCoordsAreABijection) {
  for (int bh : {1, 3, 16, 40})
    for (int mBlocks : {1, 2, 7, 64})
      for (int causal = 0; causal < 2; ++causal)
        for (int headMajor = 0; headMajor < 2; ++headMajor) {
          std::vector<int> seen(bh * mBlocks, 0);
          int lastMb = mBlocks;
          for (int t = 0; t < bh * mBlocks; ++t) {
            int32_t hb, mb;
            mk::attn::tileCoords(t, bh, mBlocks, causal != 0, headMajor != 0, &hb, &mb);
            ASSERT_TRUE(hb >= 0 && hb < bh && mb >= 0 && mb < mBlocks)
                << "t " << t << " -> " << hb << "," << mb;
            ++seen[hb * mBlocks + mb];
            if (causal) {
              ASSERT_LE(mb, lastMb) << "causal tiles must not get heavier, t " << t;
              lastMb = mb;
            }
          }
          for (int v : seen) ASSERT_EQ(v, 1) << bh << " heads, " << mBlocks << " row blocks";
        }
}

// kvVisible must never skip a block holding a visible pair, and must ask for the mask whenever
// some pair of the block is masked (or a key row lies past the slice).
TEST(AttnSchedule, BlockVerdictMatchesEveryPair) {
  std::mt19937_64 rng(mktest::testSeed());  // MKTEST_SEED repeats a failure
  int skipped = 0, unmasked = 0, masked = 0;
  for (int it = 0; it < 300; ++it) {
    const int chunks = 1 + rng() % 2;
    const int n = 1 + rng() % 6;
    const int S = chunks * (1 + rng() % 200);
    const bool causal = rng() % 4 != 0;
    const int bm = 128, bn = rng() % 2 ? 128 : 64;
    const SeqMap m = makeSeq(S, chunks, n);
    const int qRank = rng() % n;
    for (int m0 = 0; m0 < S; m0 += bm) {
      int64_t qLo, qHi;
      m.range(qRank, m0, std::min(m0 + bm, S), &qLo, &qHi);
      for (int kr = 0; kr < n; ++kr) {
        for (int n0 = 0; n0 < S; n0 += bn) {
          const int v = mk::attn::kvVisible(m, causal, qLo, qHi, kr, n0, bn);
          bool any = false, all = n0 + bn <= S;
          for (int qs = m0; qs < std::min(m0 + bm, S); ++qs) {
            for (int ks = n0; ks < std::min(n0 + bn, S); ++ks) {
              const bool vis = !causal || m.pos(kr, ks) <= m.pos(qRank, qs);
              any |= vis;
              all &= vis;
            }
          }
          if (v == 0) {
            ++skipped;
            ASSERT_FALSE(any) << "a block with a visible pair was skipped (S " << S << ")";
          } else if (v == 1) {
            ++unmasked;
            ASSERT_TRUE(all) << "a block with a masked pair runs without the mask (S " << S << ")";
          } else {
            ++masked;
          }
        }
      }
    }
  }
  EXPECT_GT(skipped, 0);
  EXPECT_GT(unmasked, 0);
  EXPECT_GT(masked, 0);
}

// The consumers' recurrence per row: m = max(m, block max) with m = -inf guarded (base 0),
// l = l * 2^(m_old - base) + sum 2^(s - base), o likewise; out = o / l, lse = (m + log2 l) ln 2.
TEST(AttnSchedule, OnlineSoftmaxMatchesDirect) {
  std::mt19937_64 rng(mktest::testSeed());  // MKTEST_SEED repeats a failure
  std::normal_distribution<double> nd(0.0, 3.0);
  for (int it = 0; it < 200; ++it) {
    const int keys = 1 + rng() % 700, bn = 64 << (rng() % 2);
    std::vector<double> s(keys), v(keys);
    std::vector<bool> vis(keys);
    bool anyVis = false;
    for (int j = 0; j < keys; ++j) {
      s[j] = nd(rng);
      v[j] = nd(rng);
      vis[j] = rng() % 3 != 0 || it % 7 == 0;
      // whole blocks masked at the start: the -inf guard must keep them from poisoning the row
      if (it % 5 == 0 && j < bn) vis[j] = false;
      anyVis |= vis[j];
    }
    double mrun = -INFINITY, l = 0, o = 0;
    for (int n0 = 0; n0 < keys; n0 += bn) {
      double mx = -INFINITY;
      for (int j = n0; j < std::min(keys, n0 + bn); ++j)
        if (vis[j]) mx = std::max(mx, s[j]);
      const double mNew = std::max(mrun, mx);
      const double base = mNew == -INFINITY ? 0.0 : mNew;
      const double alpha = std::exp2(mrun - base);
      l *= alpha;
      o *= alpha;
      for (int j = n0; j < std::min(keys, n0 + bn); ++j) {
        const double e = vis[j] ? std::exp2(s[j] - base) : 0.0;
        l += e;
        o += e * v[j];
      }
      mrun = mNew;
      ASSERT_FALSE(std::isnan(l) || std::isnan(o)) << "NaN after block " << n0;
    }
    double mx = -INFINITY, den = 0, num = 0;
    for (int j = 0; j < keys; ++j)
      if (vis[j]) mx = std::max(mx, s[j]);
    for (int j = 0; j < keys; ++j) {
      if (!vis[j]) continue;
      den += std::exp2(s[j] - mx);
      num += std::exp2(s[j] - mx) * v[j];
    }
    if (!anyVis) {
      EXPECT_EQ(l, 0.0);
      continue;
    }
    EXPECT_NEAR(o / l, num / den, 1e-9 * (1 + std::fabs(num / den)));
    EXPECT_NEAR(mrun + std::log2(l), mx + std::log2(den), 1e-9 * (1 + std::fabs(mx)));
  }
}

}  // namespace
