// The xnode layout of the fused ring attention (fused/ops/ring_attn/xnode.h): the planner's
// invariants, the units' tiling of a k/v slice, the ready-counter target of a key block
// (rxUnitsFor: sufficient and minimal), the own-slice copier, and the ring order (gather
// index t holds rank me - t, the order the attention walks its sources). The window protocol
// itself (credits, acks, done) is the one the fused AllGather + GEMM runs; its model is
// test_gemm_coll_xnode.cc.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "fused/ops/ring_attn/xnode.h"

namespace {

using namespace mk::fused;

TEST(RingAttnXnodePlan, PlanOfALargeShape) {
  // 32 MiB windows, 4 ranks: 8 MiB areas, chunks of at most 2 MiB. B = 1, seqLocal 8192,
  // Hkv 8, D 128: rows of 2 KiB, chunks of 1024 rows, 8 chunks (16 units), 4 slots.
  const RxPlan p = rxPlan(32u << 20, 4, 8192, 8 * 128 * 2);
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(p.areaBytes, 8 << 20);
  EXPECT_EQ(p.chunkRows, 1024);
  EXPECT_EQ(p.chunkBytes, 2 << 20);
  EXPECT_EQ(p.chunks, 8);
  EXPECT_EQ(p.units, 16);
  EXPECT_EQ(p.slots, 4);
}

TEST(RingAttnXnodePlan, PlanInvariantsAndUnitsTileTheSlice) {
  int ok = 0, refused = 0;
  for (uint64_t w : {64ull << 10, 1ull << 20, 4ull << 20, 32ull << 20})
    for (int n : {2, 3, 4, 8, 16})
      for (int64_t rows : {1, 2, 34, 77, 150, 300, 4099, 3 * 8190})
        for (int64_t rowBytes : {128, 256, 1024, 2048, 8192, 65536}) {
          const RxPlan p = rxPlan(w, n, rows, rowBytes);
          const int64_t area = (int64_t)(w / n) / 256 * 256;
          if (!p.ok) {
            // Refused only when a row does not fit half an area.
            EXPECT_GT(rowBytes, area / 2) << w << " " << n << " " << rows << " " << rowBytes;
            ++refused;
            continue;
          }
          ++ok;
          EXPECT_EQ(p.areaBytes, area);
          EXPECT_LE((uint64_t)p.areaBytes * n, w);
          EXPECT_EQ(p.chunkBytes, (int64_t)p.chunkRows * rowBytes);
          EXPECT_EQ(p.chunkBytes % 16, 0);
          EXPECT_LE(p.chunkBytes, kGxChunkTarget);
          EXPECT_LE(p.chunkBytes * 2, p.areaBytes);
          EXPECT_GE(p.slots, 2);
          EXPECT_LE(p.slots, kGxMaxSlots);
          EXPECT_LE(p.slots * p.chunkBytes, p.areaBytes);
          EXPECT_EQ(p.units, 2 * p.chunks);
          // The largest chunk that fits: one more row would not (or the slice is one chunk).
          const int64_t cap = std::min<int64_t>(area / 2, kGxChunkTarget);
          EXPECT_TRUE(p.chunkRows == rows || (p.chunkRows + 1) * rowBytes > cap);
          // Units u = 2c (k), 2c + 1 (v): consecutive, non-empty, 16-byte aligned pieces that
          // end exactly at the slice's end; k and v of a chunk have the same extent; every
          // slot of the last source's area stays inside the window.
          const int64_t slice = rows * rowBytes;
          int64_t next = 0;
          for (int32_t u = 0; u < p.units; ++u) {
            const int64_t off = rxUnitOff(p.chunkBytes, u),
                          len = rxUnitBytes(p.chunkBytes, slice, u);
            ASSERT_GT(len, 0) << u;
            EXPECT_EQ(off % 16, 0);
            EXPECT_EQ(len % 16, 0);
            EXPECT_LE(len, p.chunkBytes);
            if (u % 2 == 0) {
              EXPECT_EQ(off, next) << u;
              next = off + len;
            } else {
              EXPECT_EQ(off, rxUnitOff(p.chunkBytes, u - 1));
              EXPECT_EQ(len, rxUnitBytes(p.chunkBytes, slice, u - 1));
            }
            EXPECT_LE(gxSlotOff(p.areaBytes, p.chunkBytes, p.slots, n - 1, u) + (uint64_t)len, w);
          }
          EXPECT_EQ(next, slice) << w << " " << n << " " << rows << " " << rowBytes;
        }
  EXPECT_GT(ok, 300);
  EXPECT_GT(refused, 0);  // the refusal branch above ran
}

TEST(RingAttnXnodePlan, RefusesWhatItCannotRun) {
  EXPECT_FALSE(rxPlan(1 << 20, 1, 100, 256).ok);  // one rank: no peer
  EXPECT_FALSE(rxPlan(1 << 20, kGxMaxRanks + 1, 100, 256).ok);
  EXPECT_FALSE(rxPlan(1 << 20, 2, 0, 256).ok);
  EXPECT_FALSE(rxPlan(1 << 20, 2, 100, 24).ok);           // rows not of whole 16-byte vectors
  EXPECT_FALSE(rxPlan(64 << 10, 4, 100, 8192 + 128).ok);  // a row > half a 16 KiB area
  const RxPlan p = rxPlan(64 << 10, 4, 100, 8192);        // exactly half: 1-row chunks
  EXPECT_TRUE(p.ok);
  EXPECT_EQ(p.chunkRows, 1);
  EXPECT_EQ(p.slots, 2);
  EXPECT_EQ(p.units, 200);
}

// The attention producer waits for ready[j] >= rxUnitsFor(b * S + min(n0 + kBN, S), chunkRows)
// before it loads key block [n0, n0 + kBN) of batch b (attn_kernel.cuh KvRing::load, the same
// formula). With units landing in order, the counter at that target means: every byte of k
// and of v that the block reads is in place; one unit less would leave some of them out.
TEST(RingAttnXnodePlan, ReadyTargetCoversTheBlockAndNoMore) {
  std::mt19937_64 rng(0x5eed);
  int checked = 0;
  for (int it = 0; it < 400; ++it) {
    const int64_t B = 1 + rng() % 3, S = 1 + rng() % 700, rowBytes = 128 * (1 + rng() % 16);
    const int n = 2 + rng() % 7;
    const uint64_t w = (64ull << 10) << (rng() % 6);
    const RxPlan p = rxPlan(w, n, B * S, rowBytes);
    if (!p.ok) continue;
    const int64_t slice = B * S * rowBytes;
    for (int kBN : {64, 128, 176, 192}) {
      for (int64_t b = 0; b < B; ++b)
        for (int64_t n0 = 0; n0 < S; n0 += kBN) {
          const int64_t end = b * S + std::min<int64_t>(n0 + kBN, S);
          const uint64_t need = rxUnitsFor(end, p.chunkRows);
          ASSERT_LE(need, (uint64_t)p.units);
          ASSERT_EQ(need % 2, 0u);  // k and v of the same rows
          // Bytes of k (and of v) in place after `need` units landed in order.
          const int64_t kIn = std::min<int64_t>(slice, (int64_t)(need / 2) * p.chunkBytes);
          EXPECT_GE(kIn, end * rowBytes) << "block " << b << "," << n0 << " reads rows not in";
          // Minimal: with the last pair of units missing, the block's last row is not in.
          const int64_t kLess = (int64_t)(need / 2 - 1) * p.chunkBytes;
          EXPECT_LT(kLess, end * rowBytes);
          // The engine's inline form (attn_kernel.cuh) gives the same target.
          const int32_t rpu = p.chunkRows;
          EXPECT_EQ(2u * (uint32_t)((end + rpu - 1) / rpu), (uint32_t)need);
          ++checked;
        }
    }
  }
  EXPECT_GT(checked, 1000);  // most random shapes have a plan
}

TEST(RingAttnXnodePlan, OwnCopierAndRingOrder) {
  for (int n = 2; n <= 16; ++n)
    for (int nRecv = 1; nRecv <= 2 * n; ++nRecv) {
      const int k = rxOwnCopier(nRecv, n);
      ASSERT_GE(k, 0);
      ASSERT_LT(k, nRecv);
      // A receive CTA that serves no source copies the own slices when there is one.
      const bool spare = nRecv > n - 1;
      EXPECT_EQ(spare, 1 + k >= n) << n << " " << nRecv;
    }
  // Receive CTA rounds t = 1 + k, 1 + k + nRecv, ... serve gather index t = source me - t:
  // the attention's srcRank[t] = (me - t + n) % n (fused.cu), so sources land in the order
  // the attention walks them; each source is served by exactly one receive CTA, and each
  // destination by exactly one send CTA, in matching rounds.
  for (int n = 2; n <= 12; ++n)
    for (int me = 0; me < n; ++me)
      for (int nComm = 2; nComm <= 2 * n + 1; ++nComm) {
        const int nSend = gxSendCtas(nComm, n), nRecv = nComm - nSend;
        ASSERT_GE(nRecv, 1);
        std::vector<int> served(n, 0), sent(n, 0);
        for (int k = 0; k < nRecv; ++k)
          for (int t = 1 + k; t < n; t += nRecv) {
            EXPECT_EQ(gxRecvPeer(me, t, n), (me - t + n) % n);
            ++served[gxRecvPeer(me, t, n)];
          }
        for (int i = 0; i < nSend; ++i)
          for (int t = 1 + i; t < n; t += nSend) {
            ++sent[gxSendPeer(me, t, n)];
            EXPECT_EQ(gxRecvPeer(gxSendPeer(me, t, n), t, n), me);  // the peer's round t
          }
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(served[r], r == me ? 0 : 1);
          EXPECT_EQ(sent[r], r == me ? 0 : 1);
        }
      }
}

}  // namespace
