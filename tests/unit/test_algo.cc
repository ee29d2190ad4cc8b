// Pure host logic of the collectives: workspace layout, CTA budget, algorithm choice,
// chunking and the cost model (src/coll/algo.h). CPU only.
#include <algorithm>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "coll/algo.h"

using namespace mk;

namespace {

void checkLayout(const WsLayout& w, uint64_t wsBytes, int n) {
  EXPECT_EQ(w.nLocal, n);
  EXPECT_GE(w.lanes, 1);
  EXPECT_LE(w.lanes, kMaxLanes);
  EXPECT_GE(w.slots, 2) << "two-shot and ring steps need two slots per lane";
  EXPECT_GE(w.p2pLanes, 1);
  EXPECT_LE(w.p2pLanes, w.lanes);
  EXPECT_LE(2 * (n - 1) * w.p2pLanes, 1024) << "copy-engine streams must fit the args";
  EXPECT_EQ(w.slotBytes % 256, 0u);
  EXPECT_GE(w.slotBytes, 1024u);
  uint64_t flags = (uint64_t)n * w.lanes * w.slots;
  EXPECT_LE(w.readyOff + 8 * flags, w.consumedOff);
  EXPECT_LE(w.consumedOff + 8 * flags, w.dataOff);
  EXPECT_EQ(w.dataOff % 256, 0u);
  EXPECT_EQ(w.zcOff, w.dataOff + flags * w.slotBytes);
  EXPECT_EQ(w.zcOff % 256, 0u);
  EXPECT_EQ(w.totalBytes, w.zcOff + kWsZcBytes);
  EXPECT_LE(w.totalBytes, wsBytes);
  // The last slot of the last flag index ends inside the workspace.
  EXPECT_LE(wsDataOffset(w, n - 1, w.lanes - 1, w.slots - 1) + w.slotBytes, wsBytes);
  EXPECT_EQ(wsReadyOffset(w, 1, 0, 0), w.readyOff + 8ull * w.lanes * w.slots);
}

}  // namespace

TEST(CollAlgo, LayoutDefaultWorkspace) {
  const uint64_t ws = 32ull << 20;
  for (int n : {2, 3, 4, 8, 16, 72, 128}) {
    SCOPED_TRACE(n);
    WsLayout w;
    ASSERT_EQ(wsLayoutCompute(ws, n, &w), ncclSuccess);
    checkLayout(w, ws, n);
    if (n <= 8) {
      EXPECT_EQ(w.lanes, 16);
      EXPECT_EQ(w.slots, 4);
      EXPECT_GE(w.slotBytes, 32u << 10);
    }
  }
}

TEST(CollAlgo, LayoutSmallAndOddWorkspaces) {
  for (uint64_t ws : {64ull << 10, 1ull << 20, (3ull << 20) + 12345, 2ull << 30}) {
    for (int n : {2, 3, 8}) {
      SCOPED_TRACE(testing::Message() << ws << " bytes, " << n << " ranks");
      WsLayout w;
      ASSERT_EQ(wsLayoutCompute(ws, n, &w), ncclSuccess);
      checkLayout(w, ws, n);
    }
  }
}

TEST(CollAlgo, LayoutTooSmallIsRefused) {
  WsLayout w;
  EXPECT_EQ(wsLayoutCompute(4096, 8, &w), ncclInvalidUsage);
  EXPECT_EQ(wsLayoutCompute(32ull << 20, kMaxLocalRanks + 1, &w), ncclInvalidArgument);
}

TEST(CollAlgo, LayoutSingleRankNeedsNoWorkspace) {
  WsLayout w;
  ASSERT_EQ(wsLayoutCompute(0, 1, &w), ncclSuccess);
  EXPECT_EQ(w.nLocal, 1);
  EXPECT_EQ(w.totalBytes, 0u);
  EXPECT_GE(w.slotBytes, 16u);
}

TEST(CollAlgo, CtaBudget) {
  CtaBudget b = ctaBudget(132, 1, 0, 0, 0, 0);
  EXPECT_EQ(b.lo, 1);
  EXPECT_EQ(b.hi, 132);
  b = ctaBudget(132, 8, 0, 0, 0, 0);
  EXPECT_EQ(b.hi, 16);
  b = ctaBudget(132, 200, 0, 0, 0, 0);
  EXPECT_EQ(b.hi, 1) << "never fewer than one CTA";
  b = ctaBudget(132, 8, 2, 4, 0, 0);  // ncclConfig_t
  EXPECT_EQ(b.lo, 2);
  EXPECT_EQ(b.hi, 4);
  b = ctaBudget(132, 8, 2, 4, 3, 6);  // MKERNEL_MIN/MAX_CTAS win over the config
  EXPECT_EQ(b.lo, 3);
  EXPECT_EQ(b.hi, 6);
  b = ctaBudget(132, 8, 0, 0, 0, 1000);
  EXPECT_EQ(b.hi, 132) << "clamped to the SM count";
  b = ctaBudget(132, 8, 0, 0, 40, 0);
  EXPECT_EQ(b.lo, 40);
  EXPECT_EQ(b.hi, 40) << "a minimum above the default budget raises it";
  EXPECT_EQ(ctaGrid(ctaBudget(132, 8, 0, 0, 0, 0), 3), 3);
  EXPECT_EQ(ctaGrid(ctaBudget(132, 8, 0, 0, 0, 0), 300), 16);
  EXPECT_EQ(ctaGrid(ctaBudget(132, 8, 4, 0, 0, 0), 1), 4);
  EXPECT_EQ(ctaGrid(ctaBudget(132, 8, 0, 0, 0, 0), 0), 1);
}

TEST(CollAlgo, ParseAlgo) {
  bool ok;
  EXPECT_EQ(parseAlgo("", &ok), Algo::kAuto);
  EXPECT_TRUE(ok);
  EXPECT_EQ(parseAlgo(nullptr, &ok), Algo::kAuto);
  EXPECT_EQ(parseAlgo("oneshot", &ok), Algo::kOneShot);
  EXPECT_EQ(parseAlgo("TwoShot", &ok), Algo::kTwoShot);
  EXPECT_EQ(parseAlgo("RING", &ok), Algo::kRing);
  EXPECT_EQ(parseAlgo("ZeroCopy", &ok), Algo::kZeroCopy);
  EXPECT_TRUE(ok);
  EXPECT_EQ(parseAlgo("tree", &ok), Algo::kAuto);
  EXPECT_FALSE(ok);
}

TEST(CollAlgo, AllReduceChoiceBySize) {
  EXPECT_EQ(allReduceAlgo(1 << 30, 1, Algo::kRing), Algo::kOneShot) << "one rank: local";
  for (int n : {2, 3, 4, 8}) {
    SCOPED_TRACE(n);
    EXPECT_EQ(allReduceAlgo(4, n, Algo::kAuto), Algo::kOneShot);
    EXPECT_EQ(allReduceAlgo(8 << 10, n, Algo::kAuto), Algo::kOneShot);
    // Large: ring for 2 ranks, two-shot beyond (fitted on ranks sharing one H200).
    EXPECT_EQ(allReduceAlgo(1ull << 30, n, Algo::kAuto), n == 2 ? Algo::kRing : Algo::kTwoShot);
    // The choice never goes back to a latency algorithm as the size grows.
    int last = 0;
    for (uint64_t b = 1; b < (1ull << 34); b *= 2) {
      int a = (int)allReduceAlgo(b, n, Algo::kAuto);
      EXPECT_GE(a, last) << b << " bytes";
      last = a;
    }
    for (Algo f : {Algo::kOneShot, Algo::kTwoShot, Algo::kRing})
      EXPECT_EQ(allReduceAlgo(12345, n, f), f) << "MKERNEL_ALGO is honoured";
  }
  EXPECT_EQ(allReduceAlgo(1 << 20, 8, Algo::kAuto), Algo::kTwoShot);
  EXPECT_EQ(allReduceAlgo(256 << 10, 8, Algo::kAuto), Algo::kOneShot);
  EXPECT_EQ(allReduceAlgo(512 << 10, 2, Algo::kAuto), Algo::kOneShot);
  EXPECT_EQ(allReduceAlgo(3 << 20, 2, Algo::kAuto), Algo::kTwoShot);
  EXPECT_EQ(allReduceAlgo(16 << 20, 2, Algo::kAuto), Algo::kRing);
}

// Zero-copy only where the comm allows it: from kZeroCopyMinBytes up automatically, at any
// size when forced; forced on a comm that does not allow it, the automatic choice stands.
TEST(CollAlgo, ZeroCopyChoice) {
  for (int n : {2, 4, 8}) {
    SCOPED_TRACE(n);
    EXPECT_EQ(allReduceAlgo(kZeroCopyMinBytes, n, Algo::kAuto, true), Algo::kZeroCopy);
    EXPECT_EQ(allReduceAlgo(1ull << 30, n, Algo::kAuto, true), Algo::kZeroCopy);
    EXPECT_EQ(allReduceAlgo(8, n, Algo::kAuto, true), Algo::kOneShot);
    EXPECT_EQ(allReduceAlgo(8, n, Algo::kZeroCopy, true), Algo::kZeroCopy);
    EXPECT_EQ(allReduceAlgo(1ull << 30, n, Algo::kZeroCopy, false),
              allReduceAlgo(1ull << 30, n, Algo::kAuto, false));
    EXPECT_EQ(allReduceAlgo(1ull << 30, n, Algo::kRing, true), Algo::kRing);
  }
  EXPECT_EQ(allReduceAlgo(1ull << 30, 1, Algo::kZeroCopy, true), Algo::kOneShot) << "one rank";
  WsLayout w{};
  ASSERT_EQ(wsLayoutCompute(32ull << 20, 4, &w), ncclSuccess);
  ReducePlan p = planReduce(CollType::kAllReduce, Algo::kZeroCopy, 1001, 4, 4, w);
  EXPECT_EQ(p.algo, Algo::kZeroCopy);
  EXPECT_EQ(p.segElems, 252u) << "ceil(1001 / 4) rounded up to whole 16-byte packs";
  EXPECT_EQ(p.nChunks, 1u);
}

TEST(CollAlgo, CostModelConsistentWithChoice) {
  for (int n : {2, 4, 8}) {
    for (uint64_t b = 64; b < (1ull << 32); b *= 4) {
      Algo a = allReduceAlgo(b, n, Algo::kAuto);
      double best = allReduceUs(a, b, n);
      for (Algo o : {Algo::kOneShot, Algo::kTwoShot, Algo::kRing})
        EXPECT_LE(best, allReduceUs(o, b, n) + 1e-9);
      EXPECT_GT(best, 0);
      EXPECT_GE(allReduceUs(a, 2 * b, n), best) << "time grows with size";
    }
  }
  for (int t = 0; t < (int)CollType::kCount; t++) {
    double small = collUs((CollType)t, Algo::kAuto, 1024, 4);
    double big = collUs((CollType)t, Algo::kAuto, 1 << 26, 4);
    EXPECT_GT(small, 0) << t;
    EXPECT_GT(big, small) << t;
  }
}

// ncclGroupSimulateEnd prices the zero-copy ReduceScatter and AllGather (one process, one
// GPU) by the bytes a rank reads, not as the staged copies: the 8192^2 bf16 ReduceScatter of 4
// ranks took 0.82 ms staged against the zero-copy AllReduce's 0.42 on the H200.
TEST(CollAlgo, ZeroCopyReduceScatterAndAllGatherCosts) {
  const uint64_t b = 32ull << 20;  // a rank's block
  const double rs = collUs(CollType::kReduceScatter, Algo::kZeroCopy, b, 4);
  const double ag = collUs(CollType::kAllGather, Algo::kZeroCopy, b, 4);
  EXPECT_LT(rs, collUs(CollType::kReduceScatter, Algo::kDirect, b, 4));
  EXPECT_LT(ag, collUs(CollType::kAllGather, Algo::kDirect, b, 4));
  // Fitted to the H200: the 8192^2 bf16 ReduceScatter of 4 ranks (32 MiB blocks) took
  // 0.30-0.36 ms zero-copy (session 26), the AllGather 0.46-0.77 of the staged time (session 21).
  EXPECT_GT(rs, 300.0);
  EXPECT_LT(rs, 360.0);
  const double agRatio = ag / collUs(CollType::kAllGather, Algo::kDirect, b, 4);
  EXPECT_GT(agRatio, 0.46);
  EXPECT_LT(agRatio, 0.77);
  EXPECT_GT(collUs(CollType::kReduceScatter, Algo::kZeroCopy, 2 * b, 4), rs);
  EXPECT_GT(collUs(CollType::kAllGather, Algo::kZeroCopy, b, 8), ag);
}

TEST(CollAlgo, ChunkElems) {
  for (size_t es : {1, 2, 4, 8}) {
    for (uint64_t slot : {1024ull, 61440ull, 1ull << 20}) {
      for (uint64_t total : {1ull, 7ull, 1023ull, 100000ull, 1ull << 30}) {
        uint64_t ce = chunkElemsFor(total, es, 16, slot);
        EXPECT_EQ(ce * es % 16, 0u) << es << " " << slot << " " << total;
        EXPECT_LE(ce * es, slot);
        EXPECT_GE(ce, 1u);
      }
    }
  }
  // Small slots still give at least one 16-byte pack.
  EXPECT_EQ(chunkElemsFor(100, 8, 16, 16), 2u);
}

namespace {
// Every element in [0, count) belongs to exactly one (segment, chunk) of the plan.
void checkCoverage(CollType t, Algo algo, uint64_t count, size_t es, int n, const WsLayout& w) {
  ReducePlan p = planReduce(t, algo, count, es, n, w);
  SCOPED_TRACE(testing::Message() << "count " << count << " es " << es << " n " << n << " algo "
                                  << algoName(p.algo));
  if (count == 0) {
    EXPECT_EQ(p.nChunks, 0u);
    EXPECT_EQ(p.lanes, 0);
    return;
  }
  const uint64_t align = 16 / es;
  EXPECT_EQ(p.chunkElems % align, 0u);
  EXPECT_LE(p.chunkElems * es, w.slotBytes);
  EXPECT_EQ(p.lanes, (int)std::min<uint64_t>(w.lanes, p.nChunks));
  std::vector<uint8_t> hit(count, 0);
  if (t == CollType::kReduce || (t == CollType::kAllReduce && p.algo == Algo::kOneShot)) {
    for (uint64_t c = 0; c < p.nChunks; c++) {
      uint64_t off = c * p.chunkElems;
      ASSERT_LT(off, count);
      for (uint64_t i = off; i < std::min(count, off + p.chunkElems); i++) hit[i]++;
    }
  } else if (t == CollType::kReduceScatter) {
    EXPECT_EQ(p.segElems, count);
    for (uint64_t c = 0; c < p.nChunks; c++) {
      uint64_t off = c * p.chunkElems;
      ASSERT_LT(off, count);
      for (uint64_t i = off; i < std::min(count, off + p.chunkElems); i++) hit[i]++;
    }
  } else if (p.algo == Algo::kTwoShot) {
    EXPECT_EQ(p.segElems % align, 0u) << "segments start 16-byte aligned";
    EXPECT_GE(p.segElems * n, count);
    for (int q = 0; q < n; q++) {
      uint64_t segLen = p.segElems * q >= count ? 0 : std::min(p.segElems, count - p.segElems * q);
      for (uint64_t c = 0; c < p.nChunks; c++) {
        uint64_t cOff = c * p.chunkElems;
        uint64_t len = segLen > cOff ? std::min(p.chunkElems, segLen - cOff) : 0;
        for (uint64_t i = 0; i < len; i++) hit[q * p.segElems + cOff + i]++;
      }
    }
  } else {  // ring
    EXPECT_EQ(p.algo, Algo::kRing);
    for (uint64_t g = 0; g < p.nChunks; g++)
      for (int s = 0; s < n; s++) {
        uint64_t off = (g * n + s) * p.chunkElems;
        uint64_t len = off >= count ? 0 : std::min(p.chunkElems, count - off);
        for (uint64_t i = 0; i < len; i++) hit[off + i]++;
      }
    EXPECT_LT((p.nChunks - 1) * n * p.chunkElems, count) << "no empty round";
  }
  for (uint64_t i = 0; i < count; i++) ASSERT_EQ(hit[i], 1) << "element " << i;
}
}  // namespace

TEST(CollAlgo, ReducePlansCoverEveryElementOnce) {
  WsLayout w;
  ASSERT_EQ(wsLayoutCompute(32ull << 20, 8, &w), ncclSuccess);
  WsLayout tiny;
  ASSERT_EQ(wsLayoutCompute(256ull << 10, 8, &tiny), ncclSuccess);
  std::mt19937_64 rng(42);
  std::vector<uint64_t> counts = {0, 1, 7, 15, 16, 17, 1023, 4096, 100003, (1 << 20) + 3};
  for (int i = 0; i < 4; i++) counts.push_back(rng() % 200000);
  for (const WsLayout* lw : {&w, &tiny})
    for (uint64_t count : counts)
      for (size_t es : {1, 2, 4, 8})
        for (int n : {1, 2, 3, 8}) {
          WsLayout l = *lw;
          if (n == 1) ASSERT_EQ(wsLayoutCompute(0, 1, &l), ncclSuccess);
          for (Algo a : {Algo::kOneShot, Algo::kTwoShot, Algo::kRing})
            checkCoverage(CollType::kAllReduce, n == 1 ? Algo::kOneShot : a, count, es, n, l);
          checkCoverage(CollType::kReduce, Algo::kDirect, count, es, n, l);
          checkCoverage(CollType::kReduceScatter, Algo::kDirect, count, es, n, l);
        }
}

TEST(CollAlgo, CopyChunks) {
  WsLayout w;
  ASSERT_EQ(wsLayoutCompute(32ull << 20, 8, &w), ncclSuccess);
  for (uint64_t b : {1ull, 15ull, 16ull, 4097ull, 1ull << 20, 1ull << 33}) {
    uint64_t c = copyChunkBytes(b, w);
    EXPECT_EQ(c % 16, 0u);
    EXPECT_LE(c, w.slotBytes);
    EXPECT_GE(c, std::min<uint64_t>(kMinChunkBytes, w.slotBytes));
    uint64_t chunks = (b + c - 1) / c;
    EXPECT_GE(chunks * c, b);
  }
  // Large transfers use every copy lane.
  EXPECT_GE((1ull << 24) / copyChunkBytes(1ull << 24, w), (uint64_t)w.p2pLanes);
}
