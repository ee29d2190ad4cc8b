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
#include <cstdio>
#include <random>
#include <set>
#include <string>
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
    const int bm = 128, bn = 64 * (1 + (int)(rng() % 3));  // 192: head dim 64's variant 1
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

// The kernel's block walk (KvCursor: producer and consumers share it) against the walk it
// replaced, kept here as the reference: every block n0 = 0, bn, .. of every source tested
// with kvVisible one by one, the skipped ones (0) passed over. The two must yield the same
// (source, block, verdict) sequence for every tile, so the results stay bit-identical and
// the fused ring's ready waits (one per source the walk reaches) stay the same.
struct Step {
  int32_t j, n0, vis;
  bool operator==(const Step& o) const { return j == o.j && n0 == o.n0 && vis == o.vis; }
};

std::vector<Step> oneByOneWalk(const SeqMap& m, bool causal, int64_t qLo, int64_t qHi,
                               const std::vector<int32_t>& srcRank, int bn) {
  std::vector<Step> out;
  for (int32_t j = 0; j < (int32_t)srcRank.size(); ++j)
    for (int32_t n0 = 0; n0 < m.S; n0 += bn) {
      const int v = mk::attn::kvVisible(m, causal, qLo, qHi, srcRank[j], n0, bn);
      if (v != 0) out.push_back({j, n0, v});
    }
  return out;
}

std::vector<Step> cursorWalk(const SeqMap& m, bool causal, int64_t qLo, int64_t qHi,
                             const std::vector<int32_t>& srcRank, int bn, int64_t* tests) {
  std::vector<Step> out;
  mk::attn::KvCursor c{};
  while (c.next(m, causal, qLo, qHi, srcRank.data(), (int32_t)srcRank.size(), bn)) {
    out.push_back({c.j, c.n0, c.vis});
    if (out.size() > srcRank.size() * (size_t)(m.S / bn + 1)) break;  // a runaway walk
  }
  *tests += (int64_t)out.size();
  EXPECT_EQ(c.j, (int32_t)srcRank.size()) << "the walk must end past the last source";
  return out;
}

// Checks every row block of one configuration; returns the visible blocks the walks found.
int64_t checkWalks(const SeqMap& m, bool causal, int qRank, const std::vector<int32_t>& srcRank,
                   int bn, int64_t* skippedRef) {
  int64_t found = 0;
  for (int m0 = 0; m0 < m.S; m0 += 128) {
    int64_t qLo, qHi;
    m.range(qRank, m0, std::min(m0 + 128, m.S), &qLo, &qHi);
    const std::vector<Step> ref = oneByOneWalk(m, causal, qLo, qHi, srcRank, bn);
    int64_t n = 0;
    const std::vector<Step> got = cursorWalk(m, causal, qLo, qHi, srcRank, bn, &n);
    *skippedRef += (int64_t)srcRank.size() * ((m.S + bn - 1) / bn) - (int64_t)ref.size();
    found += n;
    if (got != ref) {
      size_t i = 0;
      while (i < got.size() && i < ref.size() && got[i] == ref[i]) ++i;
      ADD_FAILURE() << "S " << m.S << " chunks " << m.chunks << " nRanks " << m.nRanks << " causal "
                    << causal << " qRank " << qRank << " nSrc " << srcRank.size() << " bn " << bn
                    << " m0 " << m0 << ": walks differ at step " << i << " of " << ref.size()
                    << " (cursor gave " << got.size() << " steps)";
      return found;
    }
  }
  return found;
}

TEST(AttnSchedule, CursorWalkIsTheVisibleBlocks) {
  std::mt19937_64 rng(mktest::testSeed());  // MKTEST_SEED repeats a failure
  int64_t visited = 0, skipped = 0;
  // Edge shapes: S below, at and just past a block (and zigzag halves of odd length), every
  // rank as query and as the single source.
  for (int chunks = 1; chunks <= 2; ++chunks)
    for (int n : {1, 2, 3, 4})
      for (int S :
           {2, 62, 64, 66, 126, 128, 130, 190, 192, 194, 254, 256, 258, 384, 510, 578, 1026})
        for (int bn : {64, 128, 192})
          for (int causal = 0; causal < 2; ++causal)
            for (int qr = 0; qr < n; ++qr)
              for (int kr = 0; kr < n; ++kr) {
                const SeqMap m = makeSeq(S, chunks, n);
                visited += checkWalks(m, causal != 0, qr, {kr}, bn, &skipped);
                if (::testing::Test::HasFailure()) return;
              }
  // Random: nSrc 1..4 sources of any ranks (repeats, any order), the ring's gathered sequence
  // (source j = rank j) and long slices.
  for (int it = 0; it < 1500; ++it) {
    const int chunks = 1 + rng() % 2;
    const int n = 1 + rng() % 8;
    const int half = 1 + rng() % (it % 10 == 0 ? 2048 : 300);
    const int S = chunks * half + (chunks == 1 ? (int)(rng() % 2) * half : 0);
    const bool causal = rng() % 5 != 0;
    const int bn = 64 * (1 + (int)(rng() % 3));
    const SeqMap m = makeSeq(S, chunks, n);
    std::vector<int32_t> src;
    if (it % 3 == 0) {
      for (int r = 0; r < n; ++r) src.push_back(r);
    } else {
      const int nSrc = 1 + rng() % 4;
      for (int j = 0; j < nSrc; ++j) src.push_back((int32_t)(rng() % n));
    }
    visited += checkWalks(m, causal, (int)(rng() % n), src, bn, &skipped);
    if (::testing::Test::HasFailure()) return;
  }
  // The long causal slice the change is for (S = 32K, one rank): walks stay equal.
  visited += checkWalks(makeSeq(32768, 1, 1), true, 0, {0}, 128, &skipped);
  visited += checkWalks(makeSeq(32768, 2, 2), true, 1, {0, 1}, 128, &skipped);
  visited += checkWalks(makeSeq(32768, 2, 2), true, 0, {0, 1}, 192, &skipped);
  printf("[AttnSchedule] %lld visible blocks walked, %lld skipped blocks never visited\n",
         (long long)visited, (long long)skipped);
  EXPECT_GT(visited, 0);
  EXPECT_GT(skipped, 0) << "no configuration had a block to skip: the test would not see a "
                           "walk that stops too late";
}

// The consumers' recurrence per row: m = max(m, block max) with m = -inf guarded (base 0),
// l = l * 2^(m_old - base) + sum 2^(s - base), o likewise; out = o / l, lse = (m + log2 l) ln 2.
TEST(AttnSchedule, OnlineSoftmaxMatchesDirect) {
  std::mt19937_64 rng(mktest::testSeed());  // MKTEST_SEED repeats a failure
  std::normal_distribution<double> nd(0.0, 3.0);
  for (int it = 0; it < 200; ++it) {
    const int keys = 1 + rng() % 700, bn = 64 * (1 + (int)(rng() % 3));
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

// A model of an mbarrier's phase: completed phases so far; try_wait.parity(P) succeeds once the
// phase of parity P has completed, i.e. while the current phase's parity differs from P.
struct Bar {
  uint32_t done = 0;
  bool passes(uint32_t parity) const { return (done & 1u) != parity; }
};

// The kernel's Q buffers (qSlot): round k uses buffer k % nBufs; the producer's wait on the
// buffer's release passes exactly when every earlier use was released, and the consumers' wait
// on its load passes exactly when this round's load has landed, never on an earlier one.
TEST(AttnSchedule, QBuffersTakeTurnsWithTheirPhases) {
  for (int nBufs = 1; nBufs <= 3; ++nBufs) {
    std::vector<Bar> full(nBufs), empty(nBufs);
    for (int32_t k = 0; k < 40; ++k) {
      int32_t buf = -1;
      uint32_t phase = 2;
      mk::attn::qSlot(k, nBufs, &buf, &phase);
      ASSERT_EQ(buf, k % nBufs) << "round " << k << " of " << nBufs << " buffers";
      ASSERT_LE(phase, 1u);
      // Producer: the previous use (round k - nBufs) not yet released must block it.
      if (k >= nBufs) {
        empty[buf].done--;
        EXPECT_FALSE(empty[buf].passes(phase ^ 1)) << "round " << k << ": Q load before release";
        empty[buf].done++;
      }
      EXPECT_TRUE(empty[buf].passes(phase ^ 1)) << "round " << k << ": released buffer blocks";
      // Consumers: not before this round's load, then yes.
      EXPECT_FALSE(full[buf].passes(phase)) << "round " << k << ": passes on an old load";
      full[buf].done++;
      EXPECT_TRUE(full[buf].passes(phase)) << "round " << k << ": misses its load";
      empty[buf].done++;  // the consumers release it
    }
  }
}

// The consumer WGs' turns (attn_kernel.cuh consumer): the last WG hands WG0 the first turn;
// per key block each WG waits on its own turn barrier, issues, and arrives on
// nextTurnWG's; after its tiles WG0 takes the last hand-over. Named-barrier model: a barrier
// joins one arrive and one sync (256 threads of two WGs). For 2 and 3 WGs and any number of
// blocks, run whichever WG can proceed: the turns must come round robin, nothing may
// deadlock, and no arrive may be left unmatched (a stale one would let a later turn through).
TEST(AttnSchedule, ConsumerTurnsGoRoundRobin) {
  for (int nWGs = 2; nWGs <= 3; ++nWGs) {
    for (int blocks = 0; blocks < 7; ++blocks) {
      std::vector<int> pending(nWGs, 0);  // arrives not yet matched, per turn barrier
      std::vector<int> done(nWGs, 0);     // turns taken per WG
      std::vector<bool> finished(nWGs, false);
      pending[0] += 1;  // the last WG's first hand-over (wg == nWGs - 1)
      std::vector<int> order;
      for (int steps = 0; steps < 1000; ++steps) {
        bool moved = false;
        for (int w = 0; w < nWGs; ++w) {
          if (finished[w] || pending[w] == 0) continue;
          if (done[w] < blocks) {
            pending[w]--;
            order.push_back(w);
            done[w]++;
            pending[mk::attn::nextTurnWG(w, nWGs)]++;
            moved = true;
          } else if (w == 0) {  // WG0's final sync takes the last hand-over
            pending[0]--;
            finished[0] = true;
            moved = true;
          }
        }
        for (int w = 1; w < nWGs; ++w)
          if (done[w] == blocks) finished[w] = true;
        if (!moved) break;
      }
      for (int w = 0; w < nWGs; ++w) {
        EXPECT_TRUE(finished[w]) << nWGs << " WGs, " << blocks << " blocks: WG " << w << " stuck";
        EXPECT_EQ(pending[w], 0) << nWGs << " WGs, " << blocks << " blocks: stale arrive";
      }
      ASSERT_EQ((int)order.size(), nWGs * blocks);
      for (size_t i = 0; i < order.size(); ++i)
        EXPECT_EQ(order[i], (int)(i % nWGs)) << nWGs << " WGs: turn " << i;
    }
  }
}

// canImplement on a valid call of head dim a.D (fake aligned pointers, never dereferenced)
// with the variant field `field` at every value of -1..maxVariant, then out of range on either
// side: refused with a message naming the field.
void expectVariantRange(mk::attn::AttnArgs a, int32_t mk::attn::AttnArgs::*field, int maxVariant,
                        const char* name) {
  a.q = reinterpret_cast<const void*>(uintptr_t(1) << 40);
  a.k = reinterpret_cast<const void*>(uintptr_t(2) << 40);
  a.v = reinterpret_cast<const void*>(uintptr_t(3) << 40);
  a.out = reinterpret_cast<void*>(uintptr_t(4) << 40);
  a.B = 1;
  a.S = a.seq.S = 300;
  a.Hq = a.Hkv = 2;
  std::string why;
  for (int v = -1; v <= maxVariant; ++v) {
    a.*field = v;
    EXPECT_TRUE(mk::attn::canImplement(a, &why)) << name << " " << v << ": " << why;
  }
  for (int v : {-2, maxVariant + 1}) {
    a.*field = v;
    why.clear();
    EXPECT_FALSE(mk::attn::canImplement(a, &why)) << name << " " << v;
    EXPECT_NE(why.find(name), std::string::npos) << why;
  }
}

// MKERNEL_ATTN_D128_VARIANT and AttnArgs::d128Variant select head dim 128's key block with the
// overlapped schedule, in the stand-alone kernel and (since session 33) the fused ring kernel.
TEST(AttnSchedule, D128VariantsResolve) {
  using mk::attn::AttnArgs;
  mktest::ScopedEnv sched("MKERNEL_ATTN_SCHEDULE", nullptr);
  mktest::ScopedEnv env("MKERNEL_ATTN_D128_VARIANT", nullptr);
  AttnArgs a;
  a.D = 128;
  EXPECT_EQ(mk::attn::variantOf(a), 1);  // the default (176-key blocks, measured fastest)
  for (int v = 0; v <= mk::attn::kMaxD128Variant; ++v) {
    a.d128Variant = v;
    EXPECT_EQ(mk::attn::variantOf(a), v);
    a.schedule = 0;
    EXPECT_EQ(mk::attn::variantOf(a), 0) << "schedule 0 has no variants";
    a.schedule = -1;
    uint64_t ready = 0;
    a.hooks.ready = &ready;
    EXPECT_EQ(mk::attn::variantOf(a), v) << "the fused ring kernel has every variant";
    a.hooks.ready = nullptr;
  }
  a.d128Variant = -1;
  {
    mktest::ScopedEnv zero("MKERNEL_ATTN_D128_VARIANT", "0");
    EXPECT_EQ(mk::attn::variantOf(a), 0);
    a.d128Variant = 1;  // the argument wins over the parameter
    EXPECT_EQ(mk::attn::variantOf(a), 1);
  }
  EXPECT_EQ(mk::attn::kvRows(128, 1), 176);
  EXPECT_EQ(mk::attn::qRows(128, 1), 128);
  // Q [128][128] bf16 = 32 KiB, a stage = K + V of 176 rows of 256 bytes, 2 stages (3 of 128).
  const size_t q = 32768, align = 1024;
  EXPECT_EQ(mk::attn::smemBytes(128, 1), q + 2 * (2 * 176 * 256) + 128 + align);
  EXPECT_EQ(mk::attn::smemBytes(128, 0), q + 3 * (2 * 128 * 256) + 128 + align);
  expectVariantRange(a, &AttnArgs::d128Variant, mk::attn::kMaxD128Variant, "d128Variant");
}

// MKERNEL_ATTN_D64_VARIANT and AttnArgs::d64Variant select head dim 64's configuration with the
// overlapped schedule only; the key block and shared memory follow the variant (the tensor
// maps' box must be the launched kernel's block), and out-of-range requests are refused.
TEST(AttnSchedule, D64VariantsResolve) {
  using mk::attn::AttnArgs;
  mktest::ScopedEnv sched("MKERNEL_ATTN_SCHEDULE", nullptr);
  mktest::ScopedEnv env("MKERNEL_ATTN_D64_VARIANT", nullptr);
  mktest::ScopedEnv env128("MKERNEL_ATTN_D128_VARIANT", nullptr);
  AttnArgs a;
  a.D = 64;
  EXPECT_EQ(mk::attn::variantOf(a), 1);  // the default (192-key blocks, measured fastest)
  for (int v = 0; v <= mk::attn::kMaxD64Variant; ++v) {
    a.d64Variant = v;
    EXPECT_EQ(mk::attn::variantOf(a), v);
    a.schedule = 0;
    EXPECT_EQ(mk::attn::variantOf(a), 0) << "schedule 0 has no variants";
    a.schedule = -1;
    a.D = 128;
    EXPECT_EQ(mk::attn::variantOf(a), 1) << "head dim 128 follows its own variant";
    a.D = 256;
    EXPECT_EQ(mk::attn::variantOf(a), 0) << "head dim 256 has no variants";
    a.D = 64;
  }
  a.d64Variant = -1;
  {
    mktest::ScopedEnv two("MKERNEL_ATTN_D64_VARIANT", "2");
    EXPECT_EQ(mk::attn::variantOf(a), 2);
    a.d64Variant = 3;  // the argument wins over the parameter
    EXPECT_EQ(mk::attn::variantOf(a), 3);
    a.d64Variant = -1;
  }
  {
    // The fused ring kernel (hooks.ready set) is not built with variant 4: it runs variant 0.
    uint64_t ready = 0;
    a.hooks.ready = &ready;
    for (int v = 0; v <= mk::attn::kMaxD64Variant; ++v) {
      a.d64Variant = v;
      EXPECT_EQ(mk::attn::variantOf(a), v <= mk::attn::kMaxRingD64Variant ? v : 0) << v;
    }
    a.hooks.ready = nullptr;
    a.d64Variant = -1;
  }
  EXPECT_EQ(mk::attn::kvRows(64, 0), 128);
  EXPECT_EQ(mk::attn::kvRows(64, 1), 192);
  EXPECT_EQ(mk::attn::kvRows(64, 2), 128);
  EXPECT_EQ(mk::attn::kvRows(64, 3), 128);
  EXPECT_EQ(mk::attn::kvRows(64, 4), 128);
  for (int v = 0; v <= mk::attn::kMaxD64Variant; ++v)
    EXPECT_EQ(mk::attn::qRows(64, v), v == 4 ? 192 : 128) << "variant " << v;
  EXPECT_EQ(mk::attn::qRows(128, 0), 128);
  EXPECT_EQ(mk::attn::qRows(256, 0), 128);
  EXPECT_EQ(mk::attn::kvRows(128, 0), 128);
  EXPECT_EQ(mk::attn::kvRows(256, 0), 64);
  // Q [128][64] bf16 = 16 KiB per buffer, a stage = K + V of kBN rows, barriers (8 bytes each)
  // and a 4-byte tile word per Q buffer in 128 or 256 bytes, 1 KiB align. Two Q buffers with 3
  // stages: 16 barriers fill 128 bytes, so the tile words take the 256-byte area.
  const size_t q = 16384, stage128 = 32768, stage192 = 49152, align = 1024;
  EXPECT_EQ(mk::attn::smemBytes(64, 0), q + 3 * stage128 + 128 + align);
  EXPECT_EQ(mk::attn::smemBytes(64, 1), q + 3 * stage192 + 128 + align);
  EXPECT_EQ(mk::attn::smemBytes(64, 2), q + 4 * stage128 + 256 + align);
  EXPECT_EQ(mk::attn::smemBytes(64, 3), 2 * q + 3 * stage128 + 256 + align);
  EXPECT_EQ(mk::attn::smemBytes(64, 4), q * 3 / 2 + 3 * stage128 + 128 + align);  // 192 rows
  for (int v = 0; v <= mk::attn::kMaxD64Variant; ++v)
    EXPECT_LE(mk::attn::smemBytes(64, v), 232448u) << "variant " << v;
  expectVariantRange(a, &AttnArgs::d64Variant, mk::attn::kMaxD64Variant, "d64Variant");
}

}  // namespace
