// The xnode layout of the fused AllGather + GEMM (fused/ops/gemm_coll/xnode.h): the planner's
// invariants, the window slot arithmetic, the signal values, and a CPU model of the protocol
// that xnode_role.cuh runs (send / receive CTAs of every rank, messages delivered in FIFO
// order per ordered pair of ranks after random delays, several calls back to back with a
// different CTA split per rank and call). The model checks that every chunk read is the one
// expected, no chunk is overwritten before it was consumed, signal values only grow, nothing
// deadlocks, and a rank leaves a call only once every other rank has consumed all of the
// call's data (its window is then free for the comm's other operations).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "fused/gemm/gemm.h"             // kTileM, kTileN
#include "fused/ops/gemm_coll/clique.h"  // gcAutoFuses
#include "fused/ops/gemm_coll/xnode.h"

namespace {

using namespace mk::fused;

TEST(GemmCollXnode, PlanOfTheBenchmarkShape) {
  // 32 MiB windows, 2 ranks, M = 8192, K = 4096: 2 MiB chunks of 256 rows, 8 slots.
  const GxPlan p = gxPlan(32u << 20, 2, 4096, 4096);
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(p.areaBytes, 16 << 20);
  EXPECT_EQ(p.chunkRows, 256);
  EXPECT_EQ(p.chunkBytes, 2 << 20);
  EXPECT_EQ(p.slots, 8);
  EXPECT_EQ(p.chunks, 16);
}

TEST(GemmCollXnode, PlanInvariants) {
  int ok = 0;
  for (uint64_t w : {64ull << 10, 1ull << 20, 4ull << 20, 32ull << 20})
    for (int n : {2, 3, 4, 5, 8, 16, 256})
      for (int64_t rows : {1, 2, 24, 37, 64, 131, 384, 4096, 4099})
        for (int64_t K : {8, 40, 72, 1024, 4096, 65536}) {
          const GxPlan p = gxPlan(w, n, rows, K);
          if (!p.ok) {
            // Refused only when a row does not fit half an area.
            EXPECT_GT(K * 2, (int64_t)(w / n) / 256 * 256 / 2) << w << " " << n << " " << rows;
            continue;
          }
          ++ok;
          EXPECT_EQ(p.areaBytes % 256, 0);
          EXPECT_LE((uint64_t)p.areaBytes * n, w);
          EXPECT_EQ(rows % p.chunkRows, 0);
          EXPECT_EQ(p.chunks * (int64_t)p.chunkRows, rows);
          EXPECT_EQ(p.chunkBytes, p.chunkRows * K * 2);
          EXPECT_EQ(p.chunkBytes % 16, 0);  // K % 8 == 0: 16-byte copies
          EXPECT_LE(p.chunkBytes, kGxChunkTarget);
          EXPECT_LE(p.chunkBytes * 2, p.areaBytes);
          EXPECT_GE(p.slots, 2);
          EXPECT_LE(p.slots, kGxMaxSlots);
          EXPECT_LE(p.slots * p.chunkBytes, p.areaBytes);
          // The largest divisor that fits: the next divisor up would not.
          for (int64_t d = p.chunkRows + 1; d <= rows; ++d)
            if (rows % d == 0) {
              EXPECT_GT(d * K * 2, std::min<int64_t>(p.areaBytes / 2, kGxChunkTarget));
              break;
            }
          // Slots of every source inside its area, disjoint from every other source's.
          for (int src : {0, n - 1})
            for (int64_t j = 0; j < 2 * p.slots; ++j) {
              const uint64_t off = gxSlotOff(p.areaBytes, p.chunkBytes, p.slots, src, j);
              EXPECT_GE(off, (uint64_t)src * p.areaBytes);
              EXPECT_LE(off + p.chunkBytes, (uint64_t)(src + 1) * p.areaBytes);
              EXPECT_LE(off + p.chunkBytes, w);
              EXPECT_EQ(off, gxSlotOff(p.areaBytes, p.chunkBytes, p.slots, src, j + p.slots));
            }
        }
  EXPECT_GT(ok, 100);
  EXPECT_FALSE(gxPlan(1 << 20, 1, 64, 64).ok);
  EXPECT_FALSE(gxPlan(1 << 20, kGxMaxRanks + 1, 64, 64).ok);
  EXPECT_FALSE(gxPlan(1 << 20, 8, 64, 65536).ok);  // a row is 128 KiB, half an area 64 KiB
}

TEST(GemmCollXnode, SignalSlotsAndValues) {
  // After the channel engine's slots, inside the comm's signal words.
  EXPECT_GE(kGxSigSeq, mk::kXSigEnd);
  EXPECT_LE(kGxSigEnd, mk::kNetSignals);
  EXPECT_GT(kGxSigData, kGxSigCta);
  // Values only grow: within a call, and from a call's done to the next call's credit.
  EXPECT_LT(gxValue(7, kGxDone), gxValue(8, 0));
  EXPECT_LT(gxValue(7, 3), gxValue(7, 4));
  EXPECT_EQ(gxAckNeed(5, 0, 4), gxValue(5, 0));
  EXPECT_EQ(gxAckNeed(5, 3, 4), gxValue(5, 0));
  EXPECT_EQ(gxAckNeed(5, 4, 4), gxValue(5, 1));
  EXPECT_EQ(gxAckNeed(5, 9, 4), gxValue(5, 6));
  for (int n = 2; n < 9; ++n)
    for (int me = 0; me < n; ++me)
      for (int t = 1; t < n; ++t) EXPECT_EQ(gxRecvPeer(gxSendPeer(me, t, n), t, n), me);
  EXPECT_EQ(gxSendCtas(2, 2), 1);
  EXPECT_EQ(gxSendCtas(3, 2), 1);
  EXPECT_EQ(gxSendCtas(10, 2), 1);
  EXPECT_EQ(gxSendCtas(7, 4), 3);
  EXPECT_EQ(gxSendCtas(5, 8), 2);
  // Every own chunk has exactly one copier; with spare receive CTAs only they copy.
  for (int n = 2; n < 6; ++n)
    for (int nRecv = 1; nRecv < 9; ++nRecv)
      for (int64_t j = 0; j < 20; ++j) {
        int copiers = 0;
        for (int k = 0; k < nRecv; ++k)
          if (gxOwnCopier(k, nRecv, n, j)) {
            ++copiers;
            if (nRecv > n - 1) EXPECT_GE(k, n - 1);
          }
        EXPECT_EQ(copiers, 1) << n << " " << nRecv << " " << j;
      }
}

// ---- protocol model -------------------------------------------------------------------------
struct Msg {
  bool data;
  uint64_t off, value;
  uint64_t tag;  // data: (src, seq, chunk)
};
uint64_t tagOf(int src, uint64_t seq, int64_t j) {
  return ((uint64_t)src << 48) | (seq << 24) | (uint64_t)j;
}

struct Model {
  int n, J, S, calls;
  // Chunks every source sends to `owner` in call `seq` (the AllGather: J for every rank; the
  // ReduceScatter: grsChunks of the owner, test_gemm_coll_xnode_rs.cc).
  std::function<int(uint64_t seq, int owner)> chunksOf;
  std::function<bool(uint64_t seq)> isRs = [](uint64_t) { return false; };  // grsCtas split
  // The first part of each stream to `owner` (the AllReduce's partial chunks; its second part,
  // the source's reduced rows, may be sent only once the source consumed every first-part
  // chunk sent to it). Default: the whole stream.
  std::function<int(uint64_t seq, int owner)> firstOf = [this](uint64_t s, int o) {
    return chunksOf(s, o);
  };
  std::mt19937_64 rng;
  std::vector<std::vector<uint64_t>> data, ack;  // data[r][s] at r from s; ack[s][r] at s
  std::vector<std::map<uint64_t, std::pair<uint64_t, bool>>> win;  // off -> (tag, consumed)
  std::vector<std::vector<std::deque<Msg>>> q;                     // q[from][to]
  struct Cta {
    bool send;
    int idx, of;
    size_t t = 0;  // position in its rounds
    int64_t j = 0;
    int phase = 0;  // recv: 0 credits, 1 rounds, 2 finished; send: 0 rounds, 1 done waits
    int pass = 0;   // rounds walked twice: 0 every stream's first part, 1 its second part
    bool finished = false;
  };
  struct Rank {
    uint64_t seq = 1;  // current call
    std::vector<Cta> ctas;
    int recvDone = 0, nRecv = 0;
    int64_t firstRecv = 0;  // first-part chunks consumed (all of them: the reduce is done)
    bool recvFinished = false, gone = false;
  };
  std::vector<Rank> ranks;
  std::string err;

  Model(int n_, int J_, int S_, int calls_, uint64_t seed)
      : n(n_),
        J(J_),
        S(S_),
        calls(calls_),
        rng(seed),
        data(n, std::vector<uint64_t>(n, 0)),
        ack(n, std::vector<uint64_t>(n, 0)),
        win(n),
        q(n, std::vector<std::deque<Msg>>(n)),
        ranks(n) {
    chunksOf = [this](uint64_t, int) { return J; };
    begin();
  }
  // (Re)starts every rank's first call: after chunksOf / isRs changed, before any step.
  void begin() {
    for (int r = 0; r < n; ++r) startCall(r);
  }
  uint64_t off(int src, int64_t j) const { return gxSlotOff(1 << 20, 4096, S, src, j); }
  void startCall(int r) {
    Rank& k = ranks[r];
    int nComm = 2 + (int)(rng() % 8);
    int nSend = gxSendCtas(nComm, n), nRecv = nComm - nSend;
    if (isRs(k.seq)) {
      // Reduce CTAs only read what the receive CTAs staged (no message): left out.
      nComm = 3 + (int)(rng() % 8);
      grsCtas(nComm, n, &nSend, &nRecv);
      nComm = nSend + nRecv;
    }
    k.ctas.clear();
    for (int i = 0; i < nComm; ++i) {
      Cta c;
      c.send = i < nSend;
      c.idx = c.send ? i : i - nSend;
      c.of = c.send ? nSend : nComm - nSend;
      k.ctas.push_back(c);
    }
    k.nRecv = nComm - nSend;
    k.recvDone = 0;
    k.firstRecv = 0;
    k.recvFinished = false;
  }
  void sendMsg(int from, int to, const Msg& m) { q[from][to].push_back(m); }
  void fail(const std::string& e) {
    if (err.empty()) err = e;
  }
  // One step of CTA c of rank r; false when it cannot move.
  bool step(int r, Cta& c) {
    Rank& k = ranks[r];
    const uint64_t seq = k.seq;
    if (c.finished) return false;
    if (c.send) {
      const int t = 1 + c.idx + (int)c.t * c.of;
      if (c.phase == 0) {
        if (t >= n) {
          if (c.pass == 0) {
            c.pass = 1;
          } else {
            c.phase = 1;
          }
          c.t = 0;
          c.j = 0;
          return true;
        }
        const int dst = gxSendPeer(r, t, n);
        const int64_t lo = c.pass ? firstOf(seq, dst) : 0;
        const int64_t hi = c.pass ? chunksOf(seq, dst) : firstOf(seq, dst);
        if (lo + c.j >= hi) {
          c.j = 0;
          ++c.t;
          return true;
        }
        const int64_t j = lo + c.j;
        if (c.pass && k.firstRecv < (int64_t)(n - 1) * firstOf(seq, r)) return false;
        if (ack[r][dst] < gxAckNeed(seq, j, S)) return false;
        sendMsg(r, dst, {true, off(r, j), gxValue(seq, (uint32_t)j + 1), tagOf(r, seq, j)});
        ++c.j;
        return true;
      }
      if (t >= n) {
        c.finished = true;
        return true;
      }
      if (ack[r][gxSendPeer(r, t, n)] < gxValue(seq, kGxDone)) return false;
      ++c.t;
      return true;
    }
    const int t = 1 + c.idx + (int)c.t * c.of;
    if (c.phase == 0) {
      for (int u = 1 + c.idx; u < n; u += c.of)
        sendMsg(r, gxRecvPeer(r, u, n), {false, 0, gxValue(seq, 0), 0});
      c.phase = 1;
      return true;
    }
    if (t >= n) {
      if (c.pass == 0) {
        c.pass = 1;
        c.t = 0;
        c.j = 0;
        return true;
      }
      c.finished = true;
      if (++k.recvDone == k.nRecv) {
        k.recvFinished = true;
        for (int u = 1; u < n; ++u)
          sendMsg(r, gxRecvPeer(r, u, n), {false, 0, gxValue(seq, kGxDone), 0});
      }
      return true;
    }
    const int src = gxRecvPeer(r, t, n);
    const int64_t total = chunksOf(seq, r);
    const int64_t lo = c.pass ? firstOf(seq, r) : 0, hi = c.pass ? total : firstOf(seq, r);
    if (lo + c.j >= hi) {
      c.j = 0;
      ++c.t;
      return true;
    }
    const int64_t j = lo + c.j;
    if (data[r][src] < gxValue(seq, (uint32_t)j + 1)) return false;
    auto it = win[r].find(off(src, j));
    if (it == win[r].end() || it->second.first != tagOf(src, seq, j) || it->second.second)
      fail("rank " + std::to_string(r) + " read a wrong chunk");
    else
      it->second.second = true;
    if (!c.pass) ++k.firstRecv;
    if (j + S < total) sendMsg(r, src, {false, 0, gxValue(seq, (uint32_t)j + 1), 0});
    ++c.j;
    return true;
  }
  void deliver(int from, int to) {
    const Msg m = q[from][to].front();
    q[from][to].pop_front();
    if (m.data) {
      auto it = win[to].find(m.off);
      if (it != win[to].end() && !it->second.second)
        fail("a chunk overwrote an unconsumed one at rank " + std::to_string(to));
      if (ranks[to].gone || ranks[to].recvFinished || ((m.tag >> 24) & 0xffffff) != ranks[to].seq)
        fail("data landed at rank " + std::to_string(to) + " outside its call");
      win[to][m.off] = {m.tag, false};
      if (m.value <= data[to][from]) fail("a data signal did not grow");
      data[to][from] = m.value;
    } else {
      if (m.value < ack[to][from]) fail("an ack went backwards");
      ack[to][from] = m.value;
    }
  }
  // Runs until every rank finished every call; false on deadlock or error.
  bool run() {
    for (long steps = 0; steps < 50000000 && err.empty(); ++steps) {
      std::vector<std::pair<int, int>> moves;  // (rank, cta) or (-1 - from, to) for messages
      bool all = true;
      for (int r = 0; r < n; ++r) {
        if (ranks[r].gone) continue;
        all = false;
        for (int i = 0; i < (int)ranks[r].ctas.size(); ++i) moves.push_back({r, i});
      }
      for (int a = 0; a < n; ++a)
        for (int b = 0; b < n; ++b)
          if (!q[a][b].empty()) moves.push_back({-1 - a, b});
      if (all && moves.empty()) return true;
      std::shuffle(moves.begin(), moves.end(), rng);
      bool moved = false;
      for (auto& mv : moves) {
        if (mv.first < 0) {
          deliver(-1 - mv.first, mv.second);
          moved = true;
          break;
        }
        Rank& k = ranks[mv.first];
        if (step(mv.first, k.ctas[mv.second])) {
          moved = true;
          bool done = true;
          for (auto& c : k.ctas) done &= c.finished;
          if (done) leave(mv.first);
          break;
        }
      }
      if (!moved) {
        fail("deadlock");
        return false;
      }
    }
    return err.empty();
  }
  void leave(int r) {
    // The window of every other rank is free: it consumed all of this call.
    for (int o = 0; o < n; ++o)
      if (o != r && !(ranks[o].seq > ranks[r].seq || ranks[o].recvFinished))
        fail("rank " + std::to_string(r) + " left call " + std::to_string(ranks[r].seq) +
             " before rank " + std::to_string(o) + " consumed it");
    if (++ranks[r].seq > (uint64_t)calls) {
      ranks[r].gone = true;
      return;
    }
    startCall(r);
  }
};

TEST(GemmCollXnode, ProtocolModelRandomSchedules) {
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    std::mt19937_64 g(seed);
    const int n = 2 + (int)(g() % 5), J = 1 + (int)(g() % 9), S = 2 + (int)(g() % 3);
    Model m(n, J, S, 3, seed);
    const bool ok = m.run();
    ASSERT_TRUE(ok) << "seed " << seed << " n " << n << " chunks " << J << " slots " << S << ": "
                    << m.err;
  }
}

// ---- GEMM + ReduceScatter across nodes (xnode.h GrsPlan, xnode_rs_role.cuh) ------------------
constexpr int32_t kTM = mk::gemm::kTileM, kTN = mk::gemm::kTileN;

TEST(GemmCollXnodeRs, PlanOfTheBenchmarkShape) {
  // 32 MiB windows, 2 ranks, M = N = 8192, bf16 out: 16 MiB areas, 64 KiB tiles, chunks of 32
  // tiles (one tile row, 2 MiB), 8 slots; 32 tile rows per owner.
  const GrsPlan p = grsPlan(32u << 20, 2, 8192, 8192, 2, kTM, kTN);
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(p.areaBytes, 16 << 20);
  EXPECT_EQ(p.tileBytes, 64 << 10);
  EXPECT_EQ(p.chunkTiles, 32);
  EXPECT_EQ(p.rowChunks, 1);
  EXPECT_EQ(p.chunkBytes, 2 << 20);
  EXPECT_EQ(p.slots, 8);
  EXPECT_EQ(grsChunks(0, p.rowsPerRank, kTM, p.rowChunks), 32);
  EXPECT_EQ(grsChunks(1, p.rowsPerRank, kTM, p.rowChunks), 32);
  // fp32 out: 128 KiB tiles, 16 per chunk, two chunks per tile row.
  const GrsPlan f = grsPlan(32u << 20, 2, 8192, 8192, 4, kTM, kTN);
  ASSERT_TRUE(f.ok);
  EXPECT_EQ(f.chunkTiles, 16);
  EXPECT_EQ(f.rowChunks, 2);
  EXPECT_EQ(grsChunks(1, f.rowsPerRank, kTM, f.rowChunks), 64);
}

// Every owner's chunks cover exactly the tiles of the tile rows holding its rows, once each;
// every slot lies inside its source's area; refusals only for tiles larger than half an area.
TEST(GemmCollXnodeRs, PlanInvariantsAndCoverage) {
  int ok = 0;
  for (uint64_t w : {256ull << 10, 1ull << 20, 4ull << 20, 32ull << 20})
    for (int n : {2, 3, 4, 5, 8, 256})
      for (int64_t rpr : {1, 8, 100, 128, 129, 384, 1000})
        for (int64_t N : {8, 200, 256, 264, 4096, 8200})
          for (int32_t ob : {2, 4}) {
            const GrsPlan p = grsPlan(w, n, rpr * n, N, ob, kTM, kTN);
            if (!p.ok) {
              EXPECT_GT((int64_t)kTM * kTN * ob * 2, (int64_t)(w / n) / 256 * 256)
                  << w << " " << n << " " << rpr << " " << N << " " << ob;
              continue;
            }
            ++ok;
            EXPECT_EQ(p.rowsPerRank, rpr);
            EXPECT_EQ(p.tilesN, (N + kTN - 1) / kTN);
            EXPECT_EQ(p.tilesM, (rpr * n + kTM - 1) / kTM);
            EXPECT_GE(p.chunkTiles, 1);
            EXPECT_LE(p.chunkTiles, p.tilesN);
            EXPECT_EQ(p.chunkBytes, p.chunkTiles * p.tileBytes);
            EXPECT_LE(p.chunkBytes, kGxChunkTarget);
            EXPECT_LE(p.chunkBytes * 2, p.areaBytes);
            EXPECT_GE(p.slots, 2);
            EXPECT_LE(p.slots, kGxMaxSlots);
            EXPECT_LE(p.slots * p.chunkBytes, p.areaBytes);
            EXPECT_LE((uint64_t)p.areaBytes * n, w);
            if (n > 8) continue;  // coverage: small n is enough
            for (int d = 0; d < n; ++d) {
              const int32_t first = grsFirstRow(d, rpr, kTM), last = grsLastRow(d, rpr, kTM);
              // The tile rows hold exactly the owner's rows.
              EXPECT_LE((int64_t)first * kTM, d * rpr);
              EXPECT_GT((int64_t)(first + 1) * kTM, d * rpr);
              EXPECT_LE((int64_t)last * kTM, (d + 1) * rpr - 1);
              EXPECT_GT((int64_t)(last + 1) * kTM, (d + 1) * rpr - 1);
              EXPECT_LT(last, p.tilesM);
              std::vector<int> seen((size_t)p.tilesM * p.tilesN, 0);
              const int64_t chunks = grsChunks(d, rpr, kTM, p.rowChunks);
              for (int64_t k = 0; k < chunks; ++k) {
                int32_t mBlk, nBlk0, tiles;
                grsChunk(d, k, rpr, kTM, p.rowChunks, p.chunkTiles, p.tilesN, &mBlk, &nBlk0,
                         &tiles);
                ASSERT_GE(tiles, 1);
                ASSERT_LE(tiles, p.chunkTiles);
                ASSERT_LE(nBlk0 + tiles, p.tilesN);
                for (int32_t t = 0; t < tiles; ++t) ++seen[(size_t)mBlk * p.tilesN + nBlk0 + t];
                const uint64_t off = gxSlotOff(p.areaBytes, p.chunkBytes, p.slots, n - 1, k);
                EXPECT_GE(off, (uint64_t)(n - 1) * p.areaBytes);
                EXPECT_LE(off + p.chunkBytes, (uint64_t)n * p.areaBytes);
              }
              for (int32_t m = 0; m < p.tilesM; ++m)
                for (int32_t t = 0; t < p.tilesN; ++t)
                  EXPECT_EQ(seen[(size_t)m * p.tilesN + t], m >= first && m <= last ? 1 : 0)
                      << "owner " << d << " tile " << m << "," << t;
            }
          }
  EXPECT_GT(ok, 200);
  EXPECT_FALSE(grsPlan(1 << 20, 1, 64, 64, 2, kTM, kTN).ok);
  EXPECT_FALSE(grsPlan(1 << 20, 3, 64, 64, 2, kTM, kTN).ok);      // M % n != 0
  EXPECT_FALSE(grsPlan(512 << 10, 4, 512, 512, 4, kTM, kTN).ok);  // 128 KiB tile, 64 KiB
  EXPECT_FALSE(grsPlan(1 << 20, kGxMaxRanks + 1, 64 * 257, 64, 2, kTM, kTN).ok);
}

TEST(GemmCollXnodeRs, CtaSplit) {
  for (int n = 2; n < 10; ++n)
    for (int nComm = 3; nComm < 40; ++nComm) {
      int s = 0, r = 0;
      grsCtas(nComm, n, &s, &r);
      EXPECT_GE(s, 1);
      EXPECT_GE(r, 1);
      EXPECT_LE(s, n - 1);
      EXPECT_LE(r, n - 1);
      EXPECT_GE(nComm - s - r, 1) << n << " " << nComm;  // at least one reduce CTA
    }
}

// The reduce of xnode_rs_role.cuh on the host, with its addressing: every rank's partial
// tile by tile, chunks staged per source as the receive CTAs do, the owner's rows summed in
// rank order. Every element of every shard is written once and equals the reference sum in
// the same order (the same bits); tails in M and N, several n, both element sizes' tiles.
TEST(GemmCollXnodeRs, HostReduceMatchesReference) {
  std::mt19937_64 g(12);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 2 + (int)(g() % 4);
    const int64_t rpr = 1 + (int64_t)(g() % 300), M = rpr * n;
    const int64_t N = 8 * (1 + (int64_t)(g() % 80));
    const uint64_t w = (g() % 2) ? (32ull << 20) : (2ull << 20);  // small: several slots wrap
    const GrsPlan p = grsPlan(w, n, M, N, 4, kTM, kTN);
    ASSERT_TRUE(p.ok);
    const int64_t tileElems = (int64_t)kTM * kTN;
    // part[q] tile by tile; rows past M and columns past N hold garbage (NaN) on purpose.
    std::vector<std::vector<float>> part(n);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int q = 0; q < n; ++q) {
      part[q].assign((size_t)p.tilesM * p.tilesN * tileElems, std::nanf(""));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t c = 0; c < N; ++c)
          part[q][((m / kTM) * p.tilesN + c / kTN) * tileElems + (m % kTM) * kTN + c % kTN] = u(g);
    }
    for (int me = 0; me < n; ++me) {
      const int64_t chunks = grsChunks(me, rpr, kTM, p.rowChunks);
      const int64_t chunkElems = p.chunkBytes / 4;
      std::vector<float> stage((size_t)(n * chunks * chunkElems), 0.f);
      for (int src = 0; src < n; ++src) {
        if (src == me) continue;
        for (int64_t j = 0; j < chunks; ++j) {  // the send (from P) and the receive copy
          int32_t mBlk, nBlk0, tiles;
          grsChunk(me, j, rpr, kTM, p.rowChunks, p.chunkTiles, p.tilesN, &mBlk, &nBlk0, &tiles);
          const int64_t id0 = (int64_t)mBlk * p.tilesN + nBlk0;
          std::copy(part[src].begin() + id0 * tileElems,
                    part[src].begin() + (id0 + tiles) * tileElems,
                    stage.begin() + (src * chunks + j) * chunkElems);
        }
      }
      std::vector<float> C((size_t)(rpr * N), std::nanf(""));
      std::vector<int> writes((size_t)(rpr * N), 0);
      const int64_t lo = me * rpr, hi = lo + rpr;
      for (int64_t j = 0; j < chunks; ++j) {
        int32_t mBlk, nBlk0, tiles;
        grsChunk(me, j, rpr, kTM, p.rowChunks, p.chunkTiles, p.tilesN, &mBlk, &nBlk0, &tiles);
        const int64_t id0 = (int64_t)mBlk * p.tilesN + nBlk0, m0 = (int64_t)mBlk * kTM;
        const int64_t r0 = std::max(lo, m0) - m0, r1 = std::min(hi, std::min(m0 + kTM, M)) - m0;
        for (int32_t tt = 0; tt < tiles; ++tt) {
          const int64_t n0 = (int64_t)(nBlk0 + tt) * kTN, cols = std::min<int64_t>(kTN, N - n0);
          for (int64_t row = r0; row < r1; ++row)
            for (int64_t c = 0; c < cols; ++c) {
              const int64_t at = tt * tileElems + row * kTN + c;
              float acc = 0.f;
              for (int q = 0; q < n; ++q)
                acc += q == me ? part[q][id0 * tileElems + at]
                               : stage[(q * chunks + j) * chunkElems + at];
              C[(m0 + row - lo) * N + n0 + c] = acc;
              ++writes[(m0 + row - lo) * N + n0 + c];
            }
        }
      }
      for (int64_t r = 0; r < rpr; ++r)
        for (int64_t c = 0; c < N; ++c) {
          const int64_t m = lo + r;
          float ref = 0.f;
          for (int q = 0; q < n; ++q)
            ref +=
                part[q][((m / kTM) * p.tilesN + c / kTN) * tileElems + (m % kTM) * kTN + c % kTN];
          ASSERT_EQ(writes[r * N + c], 1)
              << "trial " << trial << " rank " << me << " " << r << "," << c;
          ASSERT_EQ(C[r * N + c], ref) << "trial " << trial << " rank " << me;
        }
    }
  }
}

// The transfer protocol with the ReduceScatter's chunk counts (a different count per owner)
// and split, and ReduceScatter calls mixed with AllGather calls on one comm (they share the
// signal slots and the call counter).
TEST(GemmCollXnodeRs, ProtocolModelRandomSchedules) {
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    std::mt19937_64 g(seed);
    const int n = 2 + (int)(g() % 5), S = 2 + (int)(g() % 3), J = 1 + (int)(g() % 5);
    const int64_t rpr = 1 + (int64_t)(g() % 400);
    const int rowChunks = 1 + (int)(g() % 3);
    const uint64_t rsMask = g();  // call seq is a ReduceScatter when bit seq is set
    Model m(n, J, S, 4, seed);
    m.isRs = [rsMask](uint64_t seq) { return ((rsMask >> seq) & 1) != 0; };
    m.chunksOf = [=](uint64_t seq, int owner) {
      return ((rsMask >> seq) & 1) ? (int)grsChunks(owner, rpr, kTM, rowChunks) : J;
    };
    m.begin();
    const bool ok = m.run();
    ASSERT_TRUE(ok) << "seed " << seed << " n " << n << " rows/rank " << rpr << " slots " << S
                    << ": " << m.err;
  }
}

// GEMM + AllReduce: the second part of every stream (the source's reduced rows) fits a slot,
// covers the source's rows once, and waits only for reduce chunks the source has.
TEST(GemmCollXnodeRs, AllReducePlan) {
  const GrsPlan b = grsPlan(32u << 20, 2, 8192, 8192, 2, kTM, kTN, true);
  ASSERT_TRUE(b.ok);
  EXPECT_EQ(b.arRows, 128);  // 2 MiB slots, 16 KiB rows
  EXPECT_EQ(b.arChunks, 32);
  EXPECT_EQ(grsPlan(32u << 20, 2, 8192, 8192, 2, kTM, kTN).arChunks, 0);  // ReduceScatter
  EXPECT_FALSE(grsPlan(1 << 20, 2, 64, 131072, 4, kTM, kTN, true).ok);    // 512 KiB rows
  int ok = 0;
  for (uint64_t w : {256ull << 10, 1ull << 20, 32ull << 20})
    for (int n : {2, 3, 4, 8})
      for (int64_t rpr : {1, 8, 100, 128, 129, 1000})
        for (int64_t N : {8, 264, 4096, 20000})
          for (int32_t ob : {2, 4}) {
            const GrsPlan p = grsPlan(w, n, rpr * n, N, ob, kTM, kTN, true);
            if (!p.ok) continue;
            ++ok;
            ASSERT_GE(p.arRows, 1);
            EXPECT_LE(p.arRows * N * ob, p.chunkBytes);
            EXPECT_EQ(p.arChunks, (rpr + p.arRows - 1) / p.arRows);
            for (int d = 0; d < n; ++d) {
              const int64_t lo = d * rpr, chunks = grsChunks(d, rpr, kTM, p.rowChunks);
              const int32_t first = grsFirstRow(d, rpr, kTM);
              int64_t rows = 0;
              for (int32_t a = 0, x = 0; x < p.arChunks; ++x, a += p.arRows) {
                const int64_t r = std::min<int64_t>(p.arRows, rpr - a);
                ASSERT_GE(r, 1);
                rows += r;
                // The reduce chunks the send waits for (xnode_rs_role.cuh grsSend).
                const int64_t tr0 = (lo + a) / kTM, tr1 = (lo + a + r - 1) / kTM;
                const int64_t k0 = (tr0 - first) * p.rowChunks;
                EXPECT_GE(k0, 0);
                EXPECT_LE(k0 + (tr1 - tr0 + 1) * p.rowChunks, chunks);
              }
              EXPECT_EQ(rows, rpr);
            }
          }
  EXPECT_GT(ok, 100);
}

// The AllReduce's streams (partial chunks, then the reduced rows that wait for the source's
// own reduce), mixed with ReduceScatter and AllGather calls on one comm.
TEST(GemmCollXnodeRs, ProtocolModelAllReduce) {
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    std::mt19937_64 g(seed);
    const int n = 2 + (int)(g() % 5), S = 2 + (int)(g() % 3), J = 1 + (int)(g() % 5);
    const int64_t rpr = 1 + (int64_t)(g() % 400);
    const int rowChunks = 1 + (int)(g() % 3), arChunks = 1 + (int)(g() % 6);
    const uint64_t kindBits = g();  // call seq: 0 AllGather, 1 ReduceScatter, 2-3 AllReduce
    auto kind = [kindBits](uint64_t seq) { return (int)((kindBits >> (2 * seq)) & 3); };
    Model m(n, J, S, 4, seed);
    m.isRs = [kind](uint64_t seq) { return kind(seq) != 0; };
    m.chunksOf = [=](uint64_t seq, int owner) {
      const int c = (int)grsChunks(owner, rpr, kTM, rowChunks);
      return kind(seq) == 0 ? J : kind(seq) == 1 ? c : c + arChunks;
    };
    m.firstOf = [=](uint64_t seq, int owner) {
      return kind(seq) == 0 ? J : (int)grsChunks(owner, rpr, kTM, rowChunks);
    };
    m.begin();
    const bool ok = m.run();
    ASSERT_TRUE(ok) << "seed " << seed << " n " << n << " rows/rank " << rpr << " slots " << S
                    << ": " << m.err;
  }
}

// ncclFusedAuto across nodes: a function of the operation and N only (no per-process state),
// so every rank of a comm takes the same path.
TEST(GemmCollXnodeAuto, RuleOfTheCallsArguments) {
  for (int64_t N : {1, 8, 128, 136, 255, 256, 512, 8192}) {
    EXPECT_TRUE(gxAutoFuses(false, N)) << "ReduceScatter / AllReduce N=" << N;
    EXPECT_EQ(gxAutoFuses(true, N), N >= kGxAutoMinN) << "AllGather N=" << N;
  }
}

// ncclFusedAuto with ranks of one process sharing a GPU: a function of the call's arguments and
// the helpers setting (the same in every rank of the process).
TEST(GemmCollCliqueAuto, RuleOfTheCallsArguments) {
  const GemmColl ar = GemmColl::kAllReduce, rs = GemmColl::kReduceScatter;
  EXPECT_TRUE(gcAutoFuses(ar, true, 2, 8192, 8192, 8192));
  EXPECT_TRUE(gcAutoFuses(ar, true, 2, 4096, 8192, 8192));         // 1024 tiles
  EXPECT_TRUE(gcAutoFuses(ar, true, 2, 4096, 8192, 16384));        // more K
  EXPECT_TRUE(gcAutoFuses(ar, true, 2, 8192, 8192, 4096));         // AllReduce's least K
  EXPECT_FALSE(gcAutoFuses(ar, true, 2, 8192, 8192, 4095));        // K below
  EXPECT_FALSE(gcAutoFuses(ar, true, 2, 8192, 8192, 2048));        // measured slower fused
  EXPECT_TRUE(gcAutoFuses(rs, true, 2, 8192, 8192, 8192));         // ReduceScatter's least K
  EXPECT_FALSE(gcAutoFuses(rs, true, 2, 8192, 8192, 4096));        // K below
  EXPECT_FALSE(gcAutoFuses(ar, true, 2, 4096, 8192 - 256, 8192));  // 992 tiles
  EXPECT_FALSE(gcAutoFuses(rs, true, 2, 4096, 8192 - 256, 8192));  // 992 tiles
  EXPECT_TRUE(gcAutoFuses(ar, true, 2, 4096 - 127, 8192, 8192));   // a partial row of tiles
  EXPECT_FALSE(gcAutoFuses(ar, true, 4, 8192, 8192, 8192));        // fp32 out: unmeasured
  EXPECT_FALSE(gcAutoFuses(rs, true, 2, 8192, 8192, 8191));        // K below
  EXPECT_FALSE(gcAutoFuses(rs, true, 4, 8192, 8192, 8192));        // fp32 out
  EXPECT_FALSE(gcAutoFuses(rs, false, 2, 8192, 8192, 8192));       // helpers off
  EXPECT_FALSE(gcAutoFuses(ar, false, 2, 8192, 8192, 8192));
  EXPECT_FALSE(gcAutoFuses(GemmColl::kAllGather, true, 2, 8192, 8192, 8192));
}

}  // namespace
