// MoeXnode.*: the arithmetic of the fused MoE kernel across nodes (fused/ops/moe/moe_xnode.h):
// the plan's bounds for many window sizes and shapes, the chunking of a part, and on random
// routings (the count messages moe_node.h's moeSourceCounts builds, as the pack kernel does)
// that both ends of every stream count the same chunks, that the slots of a stream stay inside
// the sender's area of the receiver's window, and that every routed slot's return row sits in
// a chunk of its owner's return part.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/test_util.h"
#include "fused/ops/moe/moe_node.h"
#include "fused/ops/moe/moe_xnode.h"

namespace mf = mk::fused;

namespace {

TEST(MoeXnode, PlanBounds) {
  const uint64_t windows[] = {1 << 20, 4 << 20, 64 << 20, 256 << 20};
  const int64_t hiddens[] = {64, 512, 2048, 7168};
  for (uint64_t w : windows)
    for (int n : {2, 3, 4, 8, 16})
      for (int64_t h : hiddens)
        for (int k : {1, 6, 8})
          for (bool ret : {false, true}) {
            const int64_t rowBytes = h * 2;
            const mf::MxPlan p = mf::mxPlan(w, n, rowBytes, k, h, ret);
            const int64_t area = (int64_t)(w / n) / 256 * 256;
            const int64_t cap = std::min<int64_t>(area / 2, mf::kGxChunkTarget);
            const bool fits = rowBytes + 16 * k <= cap && (!ret || h * 4 <= cap);
            SCOPED_TRACE("window " + std::to_string(w) + " n " + std::to_string(n) + " H " +
                         std::to_string(h) + " k " + std::to_string(k));
            ASSERT_EQ(p.ok, fits);
            if (!p.ok) continue;
            EXPECT_EQ(p.areaBytes, area);
            EXPECT_EQ(p.recBytes, rowBytes + 16 * k);
            EXPECT_EQ(p.retBytes, ret ? h * 4 : 0);
            EXPECT_GE(p.dispRows, 1);
            EXPECT_LE(p.dispRows * p.recBytes, cap);
            EXPECT_GT((p.dispRows + 1) * p.recBytes, cap);  // the largest whole count
            if (ret) {
              EXPECT_LE(p.retRows * p.retBytes, cap);
              EXPECT_GT((p.retRows + 1) * p.retBytes, cap);
              EXPECT_GE(p.chunkBytes, p.retRows * p.retBytes);
            }
            EXPECT_GE(p.chunkBytes, p.dispRows * p.recBytes);
            EXPECT_EQ(p.chunkBytes % 16, 0);
            EXPECT_LE(p.chunkBytes, cap + 15);
            EXPECT_GE(p.slots, 2);
            EXPECT_LE(p.slots, mf::kGxMaxSlots);
            EXPECT_LE((int64_t)p.slots * p.chunkBytes, p.areaBytes);
            // Every chunk slot of every source inside the window.
            const uint64_t last =
                mf::gxSlotOff(p.areaBytes, p.chunkBytes, p.slots, n - 1, p.slots - 1) +
                p.chunkBytes;
            EXPECT_LE(last, w);
          }
}

TEST(MoeXnode, PlanRefuses) {
  EXPECT_FALSE(mf::mxPlan(1 << 20, 1, 1024, 2, 512, true).ok);     // one rank
  EXPECT_FALSE(mf::mxPlan(1 << 20, 2, 1000, 2, 500, true).ok);     // row not a 16-byte multiple
  EXPECT_FALSE(mf::mxPlan(1 << 20, 2, 1024, 0, 512, true).ok);     // no slot
  EXPECT_FALSE(mf::mxPlan(1 << 20, 2, 1024, 2, 510, true).ok);     // H not a float4 multiple
  EXPECT_FALSE(mf::mxPlan(64 << 10, 4, 14336, 8, 7168, true).ok);  // a return row > half an area
  EXPECT_TRUE(mf::mxPlan(64 << 10, 4, 4096, 8, 2048, false).ok);
  EXPECT_FALSE(mf::mxPlan(1 << 20, mf::kGxMaxRanks + 1, 1024, 2, 512, true).ok);
}

TEST(MoeXnode, Chunking) {
  for (int32_t per : {1, 3, 7, 128})
    for (int64_t rows : {0, 1, 2, 6, 7, 8, 127, 128, 129, 1000}) {
      const int64_t chunks = mf::mxChunks(rows, per);
      int64_t sum = 0;
      for (int64_t j = 0; j < chunks; ++j) {
        const int64_t r = mf::mxChunkRows(rows, per, j);
        ASSERT_GE(r, 1);
        ASSERT_LE(r, per);
        // Each row of chunk j maps back to chunk j.
        for (int64_t pr = sum; pr < sum + r; ++pr) ASSERT_EQ(mf::mxRetChunkOf(pr, per), j);
        sum += r;
      }
      ASSERT_EQ(sum, rows) << "rows " << rows << " per " << per;
    }
}

TEST(MoeXnode, CommCtas) {
  for (int budget = 0; budget < 80; ++budget)
    for (int n : {2, 3, 4, 8, 64})
      for (int commSms : {-1, 0, 1, 2, 5, 40, 1000}) {
        const int c = mf::mxCommCtas(budget, n, commSms);
        if (budget < 3) {
          ASSERT_EQ(c, 0);
          continue;
        }
        ASSERT_GE(c, 2);
        ASSERT_LE(c, budget - 1);  // a GEMM CTA at least
        ASSERT_LE(c, std::max(2, 2 * (n - 1)));
        if (commSms >= 2 && commSms <= 2 * (n - 1) && commSms <= budget - 1) ASSERT_EQ(c, commSms);
      }
}

// Random routings of n ranks: each rank's count message (moeSourceCounts, every pair direct,
// as the fused kernel runs) delivered to its destinations; both ends of every stream count the
// same chunks, and every routed slot's pair row lies in a return chunk of the stream from its
// owner back to it.
TEST(MoeXnode, StreamsAgree) {
  std::mt19937_64 rng(mktest::testSeed());
  for (int trial = 0; trial < 60; ++trial) {
    const int n = 2 + (int)(rng() % 7), epr = 1 + (int)(rng() % 4), k = 1 + (int)(rng() % 6);
    const int E = n * epr, T = (int)(rng() % 300);
    const int64_t P = 1 + (int64_t)(rng() % (T * k + 2));  // some pairs overflow
    const int64_t H = 64 * (1 + (int64_t)(rng() % 4));
    const mf::MxPlan pl = mf::mxPlan(1 << 20, n, H * 2, k, H, true);
    ASSERT_TRUE(pl.ok);
    std::vector<int32_t> nodeOf(n);
    for (int r = 0; r < n; ++r) nodeOf[r] = r * 2 / n;  // two nodes
    std::vector<mf::MoeNodeMap> maps(n);
    std::vector<std::vector<int32_t>> msg(n), idx(n);
    int stride = 0;
    for (int s = 0; s < n; ++s) {
      ASSERT_TRUE(mf::moeNodeMapInit(n, nodeOf.data(), s, /*enable=*/false, &maps[s]));
      stride = mf::moeCntStride(maps[s], epr);
      idx[s].resize((size_t)T * k);
      for (auto& e : idx[s]) e = rng() % 5 == 0 ? -1 : (int32_t)(rng() % E);
      msg[s].assign((size_t)n * stride, 0);
      std::vector<int32_t> railToks(maps[s].nNodes);
      int64_t bad = -1;
      ASSERT_TRUE(mf::moeSourceCounts(maps[s], T, k, E, epr, idx[s].data(), P, msg[s].data(),
                                      railToks.data(), &bad));
    }
    // What the counts' AllToAll leaves: rank r's sendCnt is msg[r]; its recvCnt entry s is
    // msg[s]'s entry r.
    std::vector<std::vector<int32_t>> recvCnt(n, std::vector<int32_t>((size_t)n * stride));
    for (int r = 0; r < n; ++r)
      for (int s = 0; s < n; ++s)
        for (int x = 0; x < stride; ++x) recvCnt[r][s * stride + x] = msg[s][r * stride + x];
    for (int s = 0; s < n; ++s)
      for (int d = 0; d < n; ++d) {
        if (s == d) continue;
        int64_t dispS, rowsS, dispD, rowsD;
        const int64_t atSender = mf::mxSenderChunks(pl, msg[s].data(), recvCnt[s].data(), stride,
                                                    epr, d, &dispS, &rowsS);
        const int64_t atReceiver = mf::mxReceiverChunks(pl, msg[d].data(), recvCnt[d].data(),
                                                        stride, epr, s, &dispD, &rowsD);
        ASSERT_EQ(atSender, atReceiver) << "stream " << s << " -> " << d;
        ASSERT_EQ(dispS, dispD);
        ASSERT_EQ(rowsS, rowsD);
        // The dispatch part carries s's token rows for d; the return part d's slots' rows.
        ASSERT_EQ(dispS, mf::mxChunks(msg[s][d * stride + mf::moeCntBlk(epr)], pl.dispRows));
        ASSERT_EQ(rowsS, msg[d][s * stride + mf::moeCntRows(epr)]);
        ASSERT_LT(atSender, (int64_t)mf::kGxDone);
      }
    // Each routed slot of source s (its pair row: rank among s's slots for that owner, expert
    // major, as the pack kernel numbers them) falls in a return chunk of owner -> s.
    for (int s = 0; s < n; ++s) {
      std::vector<int64_t> base(E, 0), seen(E, 0);
      for (int d = 0; d < n; ++d)
        for (int le = 1; le < epr; ++le)
          base[d * epr + le] = base[d * epr + le - 1] + msg[s][d * stride + le - 1];
      for (int64_t i = 0; i < (int64_t)T * k; ++i) {
        const int32_t e = idx[s][i];
        if (e < 0) continue;
        const int d = e / epr;
        if (msg[s][d * stride + mf::moeCntOvf(epr)] != 0) continue;  // not sent
        const int64_t pr = base[e] + seen[e]++;
        const int64_t rows = msg[s][d * stride + mf::moeCntRows(epr)];
        ASSERT_LT(pr, rows);
        ASSERT_LT(mf::mxRetChunkOf(pr, pl.retRows), mf::mxChunks(rows, pl.retRows));
      }
    }
  }
}

}  // namespace
