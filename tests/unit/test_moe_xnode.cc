// MoeXnode.*: the arithmetic of the fused MoE kernel across nodes (fused/ops/moe/moe_xnode.h):
// the plan's bounds for many window sizes and shapes, the chunking of a part, and on random
// routings (the count messages moe_node.h's moeSourceCounts builds, as the pack kernel does)
// that both ends of every stream count the same chunks, that the slots of a stream stay inside
// the sender's area of the receiver's window, and that every routed slot's return row sits in
// a chunk of its owner's return part; and one stream's credits, acks and done simulated over
// random interleavings (no overwritten slot, no stuck side).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common/test_util.h"
#include "fused/core/xnode_proto.h"
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
            const bool fits = rowBytes + 16 * k <= cap;  // a return row is rowBytes
            SCOPED_TRACE("window " + std::to_string(w) + " n " + std::to_string(n) + " H " +
                         std::to_string(h) + " k " + std::to_string(k));
            ASSERT_EQ(p.ok, fits);
            if (!p.ok) continue;
            EXPECT_EQ(p.areaBytes, area);
            EXPECT_EQ(p.recBytes, rowBytes + 16 * k);
            EXPECT_EQ(p.retBytes, ret ? rowBytes : 0);
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
  EXPECT_FALSE(mf::mxPlan(64 << 10, 4, 14336, 8, 7168, true).ok);  // a record > half an area
  EXPECT_TRUE(mf::mxPlan(64 << 10, 4, 4096, 8, 2048, false).ok);
  EXPECT_FALSE(mf::mxPlan(1 << 20, mf::kGxMaxRanks + 1, 1024, 2, 512, true).ok);
  // Chunk numbers past kGxDone: 1 record and 2 return rows a chunk (32 KB chunks of 16 KB rows),
  // with a fan part (the dedup) the worst case of a stream is 2 (2^31 - 1) + 2^30 chunks;
  // without it, or without the return part, it fits.
  EXPECT_TRUE(mf::mxPlan(1 << 20, 16, 16384, 8, 8192, true, false).ok);
  EXPECT_FALSE(mf::mxPlan(1 << 20, 16, 16384, 8, 8192, true, true).ok);
  EXPECT_TRUE(mf::mxPlan(1 << 20, 16, 16384, 8, 8192, false, true).ok);
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
        ASSERT_LE(c, std::max(2, 2 * (n - 1) * mf::kMxMaxGroup));
        if (commSms >= 2 && commSms <= 2 * (n - 1) * mf::kMxMaxGroup && commSms <= budget - 1)
          ASSERT_EQ(c, commSms);
        // Both roles get a CTA.
        ASSERT_GE(mf::mxSendCtas(c), 1);
        ASSERT_GE(c - mf::mxSendCtas(c), 1);
      }
}

// A role's m CTAs as groups: every round t in 1..n-1 has exactly one group, every group G
// lanes (lanes past G idle, fewer than Q of them), and the lanes' slices of any chunk cover its
// rows once, in order.
TEST(MoeXnode, GroupsCoverRoundsAndRows) {
  std::mt19937_64 rng(mktest::testSeed());
  for (int n = 2; n <= 12; ++n)
    for (int m = 1; m <= 40; ++m) {
      std::vector<int> lanesOf(n, 0), groupOfRound(n, -1);
      int idle = 0, G = -1;
      for (int i = 0; i < m; ++i) {
        const mf::MxGroup g = mf::mxGroup(i, m, n);
        ASSERT_GE(g.q, 0);
        ASSERT_LT(g.q, g.Q);
        ASSERT_LE(g.Q, n - 1);
        ASSERT_GE(g.G, 1);
        G = g.G;
        if (g.g >= g.G) {
          ++idle;
          continue;
        }
        ++lanesOf[g.q];
        for (int t = 1 + g.q; t < n; t += g.Q) {
          ASSERT_TRUE(groupOfRound[t] == -1 || groupOfRound[t] == g.q);
          groupOfRound[t] = g.q;
        }
      }
      for (int t = 1; t < n; ++t) ASSERT_GE(groupOfRound[t], 0) << "round " << t;
      for (int q = 0; q < std::min(m, n - 1); ++q) ASSERT_EQ(lanesOf[q], G);
      ASSERT_LT(idle, std::min(m, n - 1));
      const int64_t rows = (int64_t)(rng() % 500);
      int64_t next = 0;
      for (int l = 0; l < G; ++l) {
        int64_t r0, r1;
        mf::mxSlice(rows, l, G, &r0, &r1);
        ASSERT_EQ(r0, next);
        ASSERT_GE(r1, r0);
        next = r1;
      }
      ASSERT_EQ(next, rows);
    }
}

TEST(MoeXnode, UnpackCtas) {
  for (int budget = 3; budget < 200; ++budget)
    for (int n : {2, 3, 8})
      for (int commSms : {-1, 2, 7}) {
        const int c = mf::mxCommCtas(budget, n, commSms), u = mf::mxUnpackCtas(budget, c);
        ASSERT_GE(u, 1);           // someone unpacks
        ASSERT_LE(c + u, budget);  // inside the grid
        ASSERT_LE(u, std::max(1, (budget - c) / 4));
      }
  ASSERT_EQ(mf::mxUnpackCtas(5, 5), 0);
}

// Every unit (source, chunk) is taken by exactly one unpack CTA, each CTA's units in the
// chunk-major order (a chunk j of any source before any chunk j + 1), for random counts.
TEST(MoeXnode, UnitsOnceChunkMajor) {
  std::mt19937_64 rng(mktest::testSeed());
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + (int)(rng() % 9), nUnpack = 1 + (int)(rng() % 20);
    std::vector<int32_t> cnt(n);
    for (auto& c : cnt) c = (int32_t)(rng() % 4 == 0 ? 0 : rng() % 30);
    std::vector<std::vector<int>> seen(n);
    for (int s = 0; s < n; ++s) seen[s].assign(cnt[s], 0);
    for (int idx = 0; idx < nUnpack; ++idx) {
      int64_t lastJ = -1;
      mf::mxUnits(cnt.data(), n, nUnpack, idx, [&](int s, int64_t j) {
        ASSERT_GE(s, 0);
        ASSERT_LT(s, n);
        ASSERT_GE(j, 0);
        ASSERT_LT(j, cnt[s]);
        ASSERT_GE(j, lastJ);
        lastJ = j;
        ++seen[s][j];
      });
    }
    for (int s = 0; s < n; ++s)
      for (int32_t j = 0; j < cnt[s]; ++j)
        ASSERT_EQ(seen[s][j], 1) << "source " << s << " chunk " << j;
  }
}

// The records of a part that land in an area of `cap` records: the chunk's own rows while they
// fit, then what is left of the area, then none; summed over the chunks, min(rows, cap).
TEST(MoeXnode, LandRows) {
  std::mt19937_64 rng(mktest::testSeed());
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t rows = (int64_t)(rng() % 1000), cap = (int64_t)(rng() % 1000);
    const int32_t per = 1 + (int32_t)(rng() % 70);
    int64_t sum = 0;
    for (int64_t j = 0; j < mf::mxChunks(rows, per); ++j) {
      const int64_t r = mf::mxLandRows(rows, per, j, cap);
      ASSERT_GE(r, 0);
      ASSERT_LE(r, mf::mxChunkRows(rows, per, j));
      ASSERT_LE(j * per + r, std::max<int64_t>(cap, j * per));
      sum += r;
    }
    ASSERT_EQ(sum, std::min(rows, cap)) << rows << " " << cap << " " << per;
  }
}

// Random routings of nodes x local ranks: each rank's count message (moeSourceCounts, as the
// pack kernel builds it, with the node dedup on in every other trial) delivered to its
// destinations; both ends of every stream count the same records, fan records and return rows
// (the fan sums by different functions at each end: moeFanOut at the gateway, moeFanIn at the
// owner), fan parts only between two ranks of one node with the dedup on, and every routed
// slot's pair row lies in a return chunk of the stream from its owner back to it.
TEST(MoeXnode, StreamsAgree) {
  std::mt19937_64 rng(mktest::testSeed());
  int fanStreams = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const int nodes = 2 + (int)(rng() % 2), local = 2 + (int)(rng() % 2), n = nodes * local;
    const bool dedup = trial % 2 == 1;
    const int epr = 1 + (int)(rng() % 4), k = 1 + (int)(rng() % 6);
    const int E = n * epr, T = (int)(rng() % 300);
    const int64_t P = 1 + (int64_t)(rng() % (T * k + 2));  // some pairs overflow
    const int64_t H = 64 * (1 + (int64_t)(rng() % 4));
    const mf::MxPlan pl = mf::mxPlan(1 << 20, n, H * 2, k, H, true);
    ASSERT_TRUE(pl.ok);
    std::vector<int32_t> nodeOf(n);
    for (int r = 0; r < n; ++r) nodeOf[r] = r / local;
    std::vector<mf::MoeNodeMap> maps(n);
    std::vector<std::vector<int32_t>> msg(n), idx(n);
    int stride = 0;
    for (int s = 0; s < n; ++s) {
      ASSERT_TRUE(mf::moeNodeMapInit(n, nodeOf.data(), s, dedup, &maps[s]));
      ASSERT_EQ(maps[s].rail, dedup ? 1 : 0);
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
        const mf::MxStream a =
            mf::mxSenderStream(pl, maps[s], msg[s].data(), recvCnt[s].data(), epr, d, P);
        const mf::MxStream b =
            mf::mxReceiverStream(pl, maps[d], msg[d].data(), recvCnt[d].data(), epr, s, P);
        ASSERT_EQ(a.blk, b.blk) << "stream " << s << " -> " << d;
        ASSERT_EQ(a.fan, b.fan) << "stream " << s << " -> " << d;
        ASSERT_EQ(a.ret, b.ret) << "stream " << s << " -> " << d;
        ASSERT_EQ(a.total, b.total);
        ASSERT_EQ(a.dispEnd, b.dispEnd);
        ASSERT_EQ(a.fanEnd, b.fanEnd);
        ASSERT_LT(a.total, (int64_t)mf::kGxDone);
        // The dispatch part carries s's token rows for d; the return part d's slots' rows.
        ASSERT_EQ(a.blk, msg[s][d * stride + mf::moeCntBlk(epr)]);
        ASSERT_EQ(a.ret, msg[d][s * stride + mf::moeCntRows(epr)]);
        if (!dedup || nodeOf[s] != nodeOf[d]) ASSERT_EQ(a.fan, 0);
        fanStreams += a.fan > 0 ? 1 : 0;
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
  EXPECT_GT(fanStreams, 0) << "no trial forwarded through a gateway";
}

// One ordered pair's stream as the kernel runs it, simulated with random interleavings: the
// sender puts chunk j (the dispatch part's chunks, then the fan part's and the return part's
// numbered after them)
// into slot j % slots once the receiver's ack reaches gxAckNeed; the receiver credits the call,
// consumes chunk j once it landed, acks it per gxAckSent and ends with kGxDone, which the
// sender waits for. No chunk overwrites one its receiver has not consumed, every chunk lands
// in order, and at every step one side can move until both are done.
TEST(MoeXnode, StreamProtocolNeverBlocksOrOverwrites) {
  std::mt19937_64 rng(mktest::testSeed() ^ 0x5eed);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t slots = 2 + (int64_t)(rng() % 6);
    mf::MxPlan pl;
    pl.dispRows = 1 + (int32_t)(rng() % 5);
    pl.retRows = 1 + (int32_t)(rng() % 5);
    pl.retBytes = rng() % 4 == 0 ? 0 : 64;  // a dispatch call has no return part
    const int64_t blk = (int64_t)(rng() % 30), fan = (int64_t)(rng() % 3 == 0 ? rng() % 30 : 0);
    const int64_t rows = (int64_t)(rng() % 30);
    const mf::MxStream st = mf::mxStream(pl, blk, fan, rows);
    const int64_t total = st.total;
    ASSERT_EQ(st.dispEnd, mf::mxChunks(blk, pl.dispRows));
    ASSERT_EQ(st.fanEnd, st.dispEnd + mf::mxChunks(fan, pl.dispRows));
    ASSERT_EQ(total, st.fanEnd + (pl.retBytes > 0 ? mf::mxChunks(rows, pl.retRows) : 0));
    const uint64_t seq = 1 + rng() % 5;
    uint64_t ack = mf::gxValue(seq - 1, mf::kGxDone);  // the previous call's end
    int64_t put = 0, landed = 0, consumed = 0;
    bool credited = false, doneSent = false;
    std::vector<int64_t> slot(slots, -1);  // chunk held, -1: free
    for (int step = 0;; ++step) {
      ASSERT_LT(step, 10000);
      const bool senderDone = put == total && ack >= mf::gxValue(seq, mf::kGxDone);
      if (senderDone && doneSent) break;
      std::vector<int> moves;
      if (!credited) moves.push_back(0);
      if (put < total && ack >= mf::gxAckNeed(seq, put, (int32_t)slots)) moves.push_back(1);
      if (credited && consumed < landed) moves.push_back(2);
      if (credited && consumed == total && !doneSent) moves.push_back(3);
      ASSERT_FALSE(moves.empty()) << "stuck: put " << put << " consumed " << consumed << " of "
                                  << total << ", slots " << slots;
      switch (moves[rng() % moves.size()]) {
        case 0:
          credited = true;
          ack = std::max(ack, mf::gxValue(seq, 0));
          break;
        case 1:
          ASSERT_EQ(slot[put % slots], -1)
              << "chunk " << put << " overwrites " << slot[put % slots];
          ASSERT_EQ(mf::gxSlotOff(1024, 64, (int32_t)slots, 0, put), (uint64_t)(put % slots) * 64);
          slot[put % slots] = put;
          landed = ++put;
          break;
        case 2:
          ASSERT_EQ(slot[consumed % slots], consumed);
          slot[consumed % slots] = -1;
          if (mf::gxAckSent(consumed, slots, total))
            ack = std::max(ack, mf::gxValue(seq, (uint32_t)consumed + 1));
          ++consumed;
          break;
        default:
          doneSent = true;
          ack = std::max(ack, mf::gxValue(seq, mf::kGxDone));
          break;
      }
    }
  }
}

}  // namespace
