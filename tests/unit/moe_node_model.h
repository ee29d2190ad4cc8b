// Host model of the MoE dispatch across virtual nodes (tests/unit/test_moe_node.cc): pack ->
// rows AllToAll -> gateway forward -> fan AllToAll -> unpack, run with the per-node dedup of
// fused/ops/moe/moe_node.h off (today's direct AllToAll, as fused/ops/moe/a2a.cu does it) or on.
// simulate() checks on the way: every (token, owner) delivery happens once; a token crosses to
// a remote node once, or once per owner there when its source spilled that node; the sizes
// sender, gateway and receiver compute agree; every routed row is written once, padding never.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "common/test_util.h"
#include "fused/ops/moe/moe_layout.h"
#include "fused/ops/moe/moe_node.h"

namespace mf = mk::fused;

namespace moenode {

constexpr int kW = 3;                      // payload words per token row
constexpr uint32_t kPoison = 0xdeadbeefu;  // outputs start poisoned

struct Meta {
  int32_t x, y, z, w;  // pair row at the owner, token, slot (or moeFanZ), weight bits
};
struct Row {
  int src;  // the rank whose token it is
  int32_t t;
  uint32_t v[kW];
  std::vector<Meta> meta;
};

struct World {
  int nNodes, nLocal, n, epr, E, k, tile;
  int64_t P;  // maxRows = pair buffer rows
  std::vector<int32_t> nodeOf, T;
  std::vector<std::vector<int32_t>> idx;
  std::vector<std::vector<float>> w;
  std::vector<std::vector<uint32_t>> x;  // [T * kW]
};

struct Out {  // one receiver's dispatch outputs
  int ovf = 0;
  int64_t span = 0;
  std::vector<int32_t> start, count, rowSource, srcRow;
  std::vector<uint32_t> xRecv, weight;
  bool operator==(const Out& o) const {
    return std::tie(ovf, span, start, count, rowSource, xRecv, weight) ==
           std::tie(o.ovf, o.span, o.start, o.count, o.rowSource, o.xRecv, o.weight);
  }
};

struct Stats {
  int64_t crossRows = 0, modelRows = 0, spills = 0, clamps = 0, ovf = 0, rail = 0;
};

inline uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

// The packed row of pair row pr of src's rows for this receiver (a2a.cu's pairRowTarget).
inline int64_t pairRowTarget(const std::vector<int32_t>& recv, const std::vector<int32_t>& srcRow,
                             int epr, int src, int64_t pr) {
  int64_t off = 0;
  for (int le = 0; le < epr; ++le) {
    const int32_t c = recv[src * epr + le];
    if (pr < off + c) return srcRow[src * epr + le] + (pr - off);
    off += c;
  }
  return -1;
}

inline void simulate(const World& W, bool dedup, Stats* st, std::vector<Out>* out) {
  const int n = W.n, epr = W.epr, k = W.k;
  const mf::MoeShape shape{0, k, W.E, n, epr};
  std::vector<mf::MoeNodeMap> map(n);
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(mf::moeNodeMapInit(n, W.nodeOf.data(), r, dedup, &map[r]));
  const int stride = mf::moeCntStride(map[0], epr);
  // Pack: count messages, each slot's pair row, one token row per (token, block).
  std::vector<std::vector<int32_t>> msg(n, std::vector<int32_t>((size_t)n * stride));
  std::vector<std::vector<std::vector<Row>>> send(n, std::vector<std::vector<Row>>(n));
  std::vector<std::vector<int32_t>> railToks(n, std::vector<int32_t>(W.nNodes));
  for (int s = 0; s < n; ++s) {
    const mf::MoeNodeMap& m = map[s];
    int64_t bad = -1;
    const bool ok = mf::moeSourceCounts(m, W.T[s], k, W.E, epr, W.idx[s].data(), W.P, msg[s].data(),
                                        railToks[s].data(), &bad);
    std::vector<int32_t> ref(W.E);  // moe_layout.h's counts agree on a valid routing
    mf::MoeShape sh = shape;
    sh.tokens = W.T[s];
    int64_t bad2 = -1;
    EXPECT_EQ(ok, mf::moeSendCounts(sh, W.idx[s].data(), ref.data(), &bad2));
    if (ok)
      for (int e = 0; e < W.E; ++e) EXPECT_EQ(msg[s][(e / epr) * stride + e % epr], ref[e]);
    std::vector<int32_t> seen(W.E, 0), slotPos(W.idx[s].size(), -1);
    for (size_t i = 0; i < W.idx[s].size(); ++i) {
      const int32_t e = mf::moeSentExpert(W.idx[s][i], W.E, msg[s].data(), stride, epr);
      if (e < 0) continue;
      int32_t base = 0;
      for (int le = 0; le < e % epr; ++le) base += msg[s][(e / epr) * stride + le];
      slotPos[i] = base + seen[e]++;
    }
    for (int32_t t = 0; t < W.T[s]; ++t) {
      std::vector<int> blkOf(k, -1);
      for (int j = 0; j < k; ++j)
        blkOf[j] = mf::moeSlotBlock(m, W.idx[s][t * k + j], W.E, msg[s].data(), stride, epr);
      for (int j = 0; j < k; ++j) {
        const int blk = blkOf[j];
        if (blk < 0 || std::find(blkOf.begin(), blkOf.begin() + j, blk) != blkOf.begin() + j)
          continue;  // not sent, or not the token's first slot on that block
        Row row{s, t, {}, {}};
        memcpy(row.v, &W.x[s][(size_t)t * kW], sizeof(row.v));
        for (int jj = j; jj < k; ++jj) {
          if (blkOf[jj] != blk) continue;
          const int64_t i = (int64_t)t * k + jj;
          const int dst = W.idx[s][i] / epr;
          const bool viaGw = msg[s][dst * stride + mf::moeCntMode(epr)] != mf::kMoeDirect;
          row.meta.push_back({slotPos[i], t, viaGw ? mf::moeFanZ(jj, m.localOf[dst], s) : jj,
                              (int32_t)bits(W.w[s][i])});
        }
        send[s][blk].push_back(row);
      }
    }
    for (int p = 0; p < n; ++p) {
      const int32_t* c = &msg[s][p * stride];
      EXPECT_EQ((int64_t)send[s][p].size(), c[mf::moeCntBlk(epr)]) << "src " << s << " dst " << p;
      EXPECT_LE(c[mf::moeCntBlk(epr)], W.P) << "a block exceeds its pair buffer";
      if (c[mf::moeCntMode(epr)] == mf::kMoeRailBlock) ++st->rail;
    }
    for (int b = 0; b < W.nNodes; ++b)
      st->spills += m.rail && b != m.nodeOf[s] && railToks[s][b] > W.P;
    st->modelRows += mf::moeCrossNodeRows(m, msg[s].data(), epr);
  }
  // Counts AllToAll, then the rows AllToAll sized by blk (the sender's and the receiver's copy
  // of one entry). Crossings per (source, token, node).
  std::vector<std::vector<int32_t>> recvCnt(n, std::vector<int32_t>((size_t)n * stride));
  std::map<std::tuple<int, int, int>, int> cross;
  for (int r = 0; r < n; ++r)
    for (int s = 0; s < n; ++s) {
      std::copy_n(&msg[s][r * stride], stride, &recvCnt[r][s * stride]);
      if (W.nodeOf[s] == W.nodeOf[r]) continue;
      st->crossRows += (int64_t)send[s][r].size();
      for (const Row& row : send[s][r]) ++cross[{s, row.t, W.nodeOf[r]}];
    }
  // Gateway forward and the fan AllToAll (local pairs only): fan[r][q] = rows r gets from q.
  std::vector<std::vector<std::vector<Row>>> fan(n, std::vector<std::vector<Row>>(n));
  std::vector<int> clamped(n, 0);  // a fan block to r was over maxRows
  for (int g = 0; g < n && dedup; ++g) {
    const mf::MoeNodeMap& m = map[g];
    if (!m.rail) continue;
    std::vector<std::vector<Row>> out(m.nLocal);
    for (int s = 0; s < n; ++s) {
      if (recvCnt[g][s * stride + mf::moeCntMode(epr)] != mf::kMoeRailBlock) continue;
      for (const Row& rail : send[s][g]) {
        std::vector<int> order;  // distinct owner locals, first-entry order
        for (const Meta& e : rail.meta)
          if (std::find(order.begin(), order.end(), mf::moeFanZLocal(e.z)) == order.end())
            order.push_back(mf::moeFanZLocal(e.z));
        for (int l : order) {
          Row f{rail.src, rail.t, {}, {}};
          memcpy(f.v, rail.v, sizeof(f.v));
          for (const Meta& e : rail.meta)
            if (mf::moeFanZLocal(e.z) == l) f.meta.push_back(e);
          out[l].push_back(f);
        }
      }
    }
    for (int l = 0; l < m.nLocal; ++l) {
      const int r = m.rankAt[m.nodeOf[g] * m.nLocal + l];
      const int64_t units = mf::moeFanOut(m, recvCnt[g].data(), epr, l, W.P);
      const int64_t expect = mf::moeFanIn(map[r], recvCnt[r].data(), epr, m.localOf[g], W.P);
      EXPECT_EQ(units, expect) << "fan size gateway " << g << " -> " << r;
      if ((int64_t)out[l].size() > W.P) {
        EXPECT_EQ(units, 0) << "an oversized fan block is dropped at both ends";
        ++st->clamps;
        clamped[r] = 1;
        continue;
      }
      EXPECT_EQ(units, (int64_t)out[l].size()) << "fan-out rows differ, gateway " << g;
      fan[r][g] = out[l];
    }
  }
  // Unpack: the layout from the counts alone; direct blocks and fan blocks.
  std::vector<Out>& res = *out;
  res.assign(n, Out());
  for (int r = 0; r < n; ++r) {
    Out& o = res[r];
    std::vector<int32_t> recv((size_t)n * epr);
    std::vector<int32_t>& srcRow = o.srcRow;
    srcRow.resize((size_t)n * epr);
    o.start.resize(epr);
    o.count.resize(epr);
    for (int s = 0; s < n; ++s) {
      const int32_t* c = &recvCnt[r][s * stride];
      o.ovf |= c[mf::moeCntOvf(epr)];
      EXPECT_TRUE(mf::moeCntRouteValid(map[r], c, s, epr, W.P)) << "src " << s << " dst " << r;
      for (int le = 0; le < epr; ++le) recv[s * epr + le] = c[le];
    }
    o.span = mf::moeRecvLayout(shape, recv.data(), W.tile, o.start.data(), o.count.data(),
                               srcRow.data());
    o.ovf |= o.span > W.P;
    st->ovf += o.ovf;
    EXPECT_TRUE(o.ovf || !clamped[r])
        << "fan rows over maxRows at rank " << r << ", whose layout fits";
    o.xRecv.assign((size_t)W.P * kW, kPoison);
    o.rowSource.assign((size_t)W.P * 3, -7);
    o.weight.assign(W.P, kPoison);
    if (o.ovf) continue;
    std::vector<int> writes(W.P, 0);
    std::map<std::pair<int, int>, int> got;  // (src, token) -> rows that reached r
    auto place = [&](const Row& row, const Meta& e, int slot) {
      const int64_t at = pairRowTarget(recv, srcRow, epr, row.src, e.x);
      ASSERT_GE(at, 0) << "pair row past the source's rows";
      ASSERT_LT(at, W.P);
      ++writes[at];
      memcpy(&o.xRecv[at * kW], row.v, sizeof(row.v));
      o.rowSource[at * 3] = row.src;
      o.rowSource[at * 3 + 1] = e.y;
      o.rowSource[at * 3 + 2] = slot;
      o.weight[at] = (uint32_t)e.w;
    };
    for (int s = 0; s < n; ++s)
      if (recvCnt[r][s * stride + mf::moeCntMode(epr)] == mf::kMoeDirect)
        for (const Row& row : send[s][r]) {
          ++got[{s, row.t}];
          for (const Meta& e : row.meta) place(row, e, e.z);
        }
    for (int q = 0; q < n; ++q)
      for (const Row& row : fan[r][q]) {
        ++got[{row.src, row.t}];
        for (const Meta& e : row.meta) {
          EXPECT_EQ(mf::moeFanZLocal(e.z), map[r].localOf[r]);
          EXPECT_EQ(mf::moeFanZSrc(e.z), row.src);
          place(row, e, mf::moeFanZSlot(e.z));
        }
      }
    std::vector<int> want(W.P, 0);  // routed rows once, padding never
    for (int le = 0; le < epr; ++le) std::fill_n(&want[o.start[le]], o.count[le], 1);
    for (int64_t at = 0; at < W.P; ++at)
      ASSERT_EQ(writes[at], want[at]) << "rank " << r << " row " << at;
    // Every token of every source with a sent slot on r arrived exactly once.
    for (int s = 0; s < n; ++s)
      for (int32_t t = 0; t < W.T[s]; ++t) {
        bool want = false;
        for (int j = 0; j < k; ++j) {
          const int32_t e = mf::moeSentExpert(W.idx[s][t * k + j], W.E, msg[s].data(), stride, epr);
          want = want || (e >= 0 && e / epr == r);
        }
        const auto it = got.find({s, t});
        ASSERT_EQ(it == got.end() ? 0 : it->second, want ? 1 : 0)
            << "token " << t << " of rank " << s << " at rank " << r;
      }
  }
  // Crossings: once per (token, remote node), or once per owner there when its source spilled.
  for (int s = 0; s < n; ++s)
    for (int32_t t = 0; t < W.T[s]; ++t)
      for (int b = 0; b < W.nNodes; ++b) {
        if (b == W.nodeOf[s]) continue;
        std::vector<int> owners;
        for (int j = 0; j < k; ++j) {
          const int32_t e = mf::moeSentExpert(W.idx[s][t * k + j], W.E, msg[s].data(), stride, epr);
          if (e >= 0 && W.nodeOf[e / epr] == b &&
              std::find(owners.begin(), owners.end(), e / epr) == owners.end())
            owners.push_back(e / epr);
        }
        const bool direct = !map[s].rail || railToks[s][b] > W.P;
        const int want = direct ? (int)owners.size() : (owners.empty() ? 0 : 1);
        const auto it = cross.find({s, t, b});
        ASSERT_EQ(it == cross.end() ? 0 : it->second, want)
            << "token " << t << " of rank " << s << " to node " << b;
      }
  EXPECT_EQ(st->crossRows, st->modelRows) << "moeCrossNodeRows";
}

enum Pattern { kUniform, kHot, kOneRank, kOneNode, kEmptyExperts, kSpill, kPatterns };

// A random world on nNodes x nLocal ranks (node ids shuffled over ranks half the time).
inline World makeWorld(std::mt19937_64& rng, int nNodes, int nLocal, int pattern) {
  World W;
  W.nNodes = nNodes;
  W.nLocal = nLocal;
  W.n = nNodes * nLocal;
  for (int b = 0; b < nNodes; ++b) W.nodeOf.insert(W.nodeOf.end(), nLocal, b);
  if (rng() % 2) std::shuffle(W.nodeOf.begin(), W.nodeOf.end(), rng);
  W.epr = 1 + (int)(rng() % 4);
  W.E = W.n * W.epr;
  W.k = pattern == kSpill ? 1 + (int)(rng() % 2) : 1 + (int)(rng() % 8);
  W.tile = std::vector<int>{1, 4, 8}[rng() % 3];
  const int hot = (int)(rng() % W.E), oneRank = (int)(rng() % W.n), oneNode = (int)(rng() % nNodes);
  const int spiller = (int)(rng() % W.n);
  const int spillNode =
      nNodes > 1 ? (W.nodeOf[spiller] + 1 + (int)(rng() % (nNodes - 1))) % nNodes : 0;
  const bool distinct = rng() % 2 && W.E >= W.k;
  W.idx.resize(W.n);
  W.w.resize(W.n);
  W.x.resize(W.n);
  W.T.resize(W.n);
  for (int r = 0; r < W.n; ++r) {
    W.T[r] = rng() % 10 == 0 ? 0 : (int32_t)(rng() % 48);
    if (pattern == kSpill) W.T[r] = r == spiller ? 8 + (int32_t)(rng() % 40) : (int32_t)(rng() % 3);
    W.idx[r].assign((size_t)W.T[r] * W.k, -1);
    for (int32_t t = 0; t < W.T[r]; ++t)
      for (int j = 0; j < W.k; ++j) {
        int32_t e = (int32_t)(rng() % W.E);
        const int64_t u = rng() % 10;
        if (pattern == kHot && u < 6) e = hot;
        if (pattern == kOneRank) e = oneRank * W.epr + e % W.epr;
        if (pattern == kOneNode || (pattern == kSpill && r == spiller)) {
          int ranks[64], c = 0;
          for (int q = 0; q < W.n; ++q)
            if (W.nodeOf[q] == (pattern == kSpill ? spillNode : oneNode)) ranks[c++] = q;
          e = ranks[(t + j) % c] * W.epr + e % W.epr;
        }
        if (pattern == kEmptyExperts) e -= e % 3;
        if (u == 9 || (pattern == kSpill && r == spiller && j > 0)) e = -1;
        bool dup = false;
        for (int jj = 0; jj < j && distinct; ++jj) dup = dup || W.idx[r][t * W.k + jj] == e;
        W.idx[r][t * W.k + j] = dup ? -1 : e;
      }
    if (!W.idx[r].empty() && rng() % 16 == 0)  // a bad id: unused everywhere, reported
      W.idx[r][rng() % W.idx[r].size()] = rng() % 2 ? W.E + (int32_t)(rng() % 3) : -2;
    W.w[r].resize(W.idx[r].size());
    for (auto& v : W.w[r]) v = std::uniform_real_distribution<float>(-1.f, 1.f)(rng);
    W.x[r].resize((size_t)W.T[r] * kW);
    for (auto& v : W.x[r]) v = (uint32_t)rng();
  }
  // The bound: the largest span without any bound, exact (most cases), loose, or too small.
  const mf::MoeShape shape{0, W.k, W.E, W.n, W.epr};
  int64_t spanMax = 1;
  std::vector<std::vector<int32_t>> cnt(W.n, std::vector<int32_t>(W.E));
  for (int r = 0; r < W.n; ++r) {
    mf::MoeShape sh = shape;
    sh.tokens = W.T[r];
    int64_t bad = -1;
    mf::moeSendCounts(sh, W.idx[r].data(), cnt[r].data(), &bad);
  }
  for (int d = 0; d < W.n; ++d) {
    std::vector<int32_t> recv((size_t)W.n * W.epr), st(W.epr), ct(W.epr), sr(recv.size());
    for (int s = 0; s < W.n; ++s)
      for (int le = 0; le < W.epr; ++le) recv[s * W.epr + le] = cnt[s][d * W.epr + le];
    spanMax = std::max(
        spanMax, mf::moeRecvLayout(shape, recv.data(), W.tile, st.data(), ct.data(), sr.data()));
  }
  const int how = (int)(rng() % 6);
  W.P = how < 4    ? spanMax
        : how == 4 ? spanMax + 1 + (int64_t)(rng() % 8)
                   : 1 + (int64_t)(rng() % spanMax);
  return W;
}

}  // namespace moenode
