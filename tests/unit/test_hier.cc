// Host logic of the inter-node paths: topology checks, window areas, segments, and the
// channel engine's plans, executed by a CPU model of every rank (FIFO channels, int32 sums;
// PreMulSum with a scalar per rank as the kernel does it: kXRawInput sends scaled by the
// sender, the reducer scales only its own list-0 input) and compared with the collectives'
// definitions.
#include <cstdint>
#include <string>
#include <utility>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include "coll/hier.h"

namespace {

TEST(HierTopo, EqualNodesAccepted) {
  std::vector<int> s{4, 4};
  EXPECT_EQ(mk::hierTopoProblem(2, s.data()), "");
  std::vector<int> t{2, 2, 2, 2};
  EXPECT_EQ(mk::hierTopoProblem(4, t.data()), "");
  std::vector<int> u{1, 1, 1};
  EXPECT_EQ(mk::hierTopoProblem(3, u.data()), "");
}

TEST(HierTopo, UnevenNodesAcceptedFlat) {
  std::vector<int> s{3, 2};
  EXPECT_EQ(mk::hierTopoProblem(2, s.data()), "");
  EXPECT_FALSE(mk::hierEvenNodes(2, s.data()));
  std::vector<int> e{4, 4};
  EXPECT_TRUE(mk::hierEvenNodes(2, e.data()));
  // Too many ranks per node for the hierarchical AllReduce: flat forms.
  std::vector<int> big(2, mk::kHierMaxLocal + 1);
  EXPECT_EQ(mk::hierTopoProblem(2, big.data()), "");
  EXPECT_FALSE(mk::hierEvenNodes(2, big.data()));
}

TEST(HierTopo, Refused) {
  std::vector<int> one{4};
  EXPECT_NE(mk::hierTopoProblem(1, one.data()), "");
  EXPECT_FALSE(mk::hierEvenNodes(1, one.data()));
  std::vector<int> empty{2, 0};
  EXPECT_NE(mk::hierTopoProblem(2, empty.data()).find("no ranks"), std::string::npos);
  std::vector<int> huge(2, mk::kXMaxRanks);
  EXPECT_NE(mk::hierTopoProblem(2, huge.data()).find("at most"), std::string::npos);
}

TEST(HierStride, FitsWindow) {
  const uint64_t w = 1 << 20;
  for (int nl : {1, 2, 4, 8}) {
    for (int nn : {2, 3, 4, 16}) {
      for (size_t es : {1, 2, 4, 8}) {
        uint64_t s = mk::hierStride(w, nl, nn, es);
        ASSERT_GT(s, 0u);
        EXPECT_EQ(s % 256, 0u);
        // Banks side by side, the last one inside the window.
        const uint64_t last = mk::hierBankOff(s, nl, nn, mk::kHierBanks - 1);
        EXPECT_EQ(mk::hierBankOff(s, nl, nn, mk::kHierBanks), 0u);
        EXPECT_EQ(mk::hierBankOff(s, nl, nn, 1), mk::hierRailOff(s, nl, nn - 1) + s);
        EXPECT_LE(last + mk::hierRailOff(s, nl, nn - 1) + s, w);
        EXPECT_LE(mk::hierAgOff(s, nl, nl - 1) + s, mk::hierRailOff(s, nl, 0));
        EXPECT_LE(mk::hierRsOff(s, nl, nl - 1) + s, mk::hierAgOff(s, nl, 0));
      }
    }
  }
  EXPECT_EQ(mk::hierStride(100, 2, 2, 4), 0u);
}

TEST(HierSegment, CoversChunkOnceAndFitsStride) {
  const uint64_t w = 64 << 10;
  for (int nl : {1, 2, 3, 4, 8}) {
    for (size_t es : {1, 2, 4, 8}) {
      const uint64_t stride = mk::hierStride(w, nl, 2, es);
      const uint64_t chunk = (uint64_t)nl * (stride / es);
      for (uint64_t n : {uint64_t(1), uint64_t(7), uint64_t(1023), chunk - 1, chunk}) {
        uint64_t next = 0;
        for (int j = 0; j < nl; j++) {
          uint64_t off, len;
          mk::hierSegment(n, nl, es, j, &off, &len);
          EXPECT_EQ(off, next) << "nl " << nl << " es " << es << " n " << n << " j " << j;
          EXPECT_LE(len * es, stride);
          next = off + len;
        }
        EXPECT_EQ(next, n);
      }
    }
  }
}

TEST(HierSignals, SlotsDisjoint) {
  EXPECT_LT(mk::kHierSigSeq, mk::kHierSigRS);
  EXPECT_EQ(mk::kHierSigAG, mk::kHierSigRS + mk::kHierMaxLocal);
  EXPECT_EQ(mk::kHierSigAckL, mk::kHierSigAG + mk::kHierMaxLocal);
  EXPECT_EQ(mk::kHierSigRail, mk::kHierSigAckL + mk::kHierMaxLocal);
  EXPECT_EQ(mk::kHierSigAckN, mk::kHierSigRail + mk::kHierMaxNodes);
  EXPECT_LE(mk::kHierSigEnd, mk::kNetSignals);
}

// ---- channel engine ----------------------------------------------------------------------

TEST(HierChan, RoundOrderIsSymmetric) {
  for (int g : {1, 2, 3, 5, 8}) {
    for (int i = 0; i < g; i++) {
      std::vector<int> o = mk::hierRoundOrder(g, i);
      std::vector<int> sorted = o;
      std::sort(sorted.begin(), sorted.end());
      for (int k = 0; k < g; k++) ASSERT_EQ(sorted[k], k);
      for (int t = 0; t < g; t++) EXPECT_EQ(mk::hierRoundOrder(g, o[t])[t], i) << g << " " << i;
    }
  }
}

TEST(HierChan, Geometry) {
  uint64_t base, area, slot;
  ASSERT_TRUE(mk::hierChanGeom(1 << 20, 8, &base, &area, &slot));
  EXPECT_EQ(base, 512u << 10);
  EXPECT_EQ(area, 64u << 10);
  EXPECT_EQ(slot, 32u << 10);
  ASSERT_TRUE(mk::hierChanGeom(1 << 20, 5, &base, &area, &slot));
  EXPECT_EQ(area % 256, 0u);
  EXPECT_EQ(slot % 256, 0u);
  EXPECT_LE(base + 5 * area, 1u << 20);
  EXPECT_LE(2 * slot, area);
  EXPECT_FALSE(mk::hierChanGeom(64 << 10, 256, &base, &area, &slot));
  EXPECT_EQ(mk::hierChunks(0, 256), 0u);
  EXPECT_EQ(mk::hierChunks(257, 256), 2u);
}

TEST(HierChan, SignalSlotsDisjoint) {
  EXPECT_LE(mk::kHierSigEnd, mk::kXSigData);
  EXPECT_EQ(mk::kXSigAck, mk::kXSigData + mk::kXMaxRanks);
  EXPECT_EQ(mk::kXSigEnd, mk::kXSigRcvd + mk::kXMaxRanks);
  EXPECT_LE(mk::kXSigEnd, mk::kNetSignals);
}

TEST(HierChan, PositionsAndChecks) {
  mk::XPlanLaunch l;
  l.lanes.resize(2);
  l.lanes[0].interleave = true;
  auto st = [](uint8_t kind, int peer, uint64_t n) {
    mk::XStep s{};
    s.kind = kind, s.peer = (int16_t)peer, s.n = n;
    return s;
  };
  l.lanes[0].steps = {st(mk::kXSend, 1, 600), st(mk::kXSend, 2, 10), st(mk::kXSend, 1, 256)};
  l.lanes[1].steps = {st(mk::kXRecv, 1, 5)};
  mk::hierAssignPositions(&l, 256);
  EXPECT_EQ(l.lanes[0].steps[0].pos0, 0u);
  EXPECT_EQ(l.lanes[0].steps[1].pos0, 0u);
  EXPECT_EQ(l.lanes[0].steps[2].pos0, 3u);
  EXPECT_FALSE(l.lanes[0].steps[0].flags & mk::kXLastOfStream);
  EXPECT_TRUE(l.lanes[0].steps[1].flags & mk::kXLastOfStream);
  EXPECT_TRUE(l.lanes[0].steps[2].flags & mk::kXLastOfStream);
  EXPECT_EQ(mk::hierCheckLaunch(l, 0), "");
  l.lanes[1].steps.push_back(st(mk::kXSend, 2, 5));  // channel 0 -> 2 in two lanes
  EXPECT_NE(mk::hierCheckLaunch(l, 0), "");
  l.lanes[1].steps.back().peer = 0;  // to itself
  EXPECT_NE(mk::hierCheckLaunch(l, 0), "");
  l.lanes[1].steps.pop_back();
  l.lanes[1].steps[0].flags |= mk::kXRawInput;  // raw-input (PreMulSum) flag on a receive
  EXPECT_NE(mk::hierCheckLaunch(l, 0), "");
  l.lanes[1].steps[0].flags = 0;
  l.lanes[0].steps[1].flags |= mk::kXRawInput;  // ... on a send: fine
  EXPECT_EQ(mk::hierCheckLaunch(l, 0), "");
}

// CPU model: every rank's launches in order; a lane step runs once its inputs are queued.
struct Model {
  int n;
  std::vector<std::vector<uint8_t>> mem;
  std::map<std::pair<int, int>, std::deque<std::vector<uint8_t>>> ch;  // (from, to)
  std::vector<std::vector<mk::XPlanLaunch>> plans;
  std::string err;
  std::vector<int32_t> scal;  // PreMulSum scalar per rank (empty: plain sum)

  int32_t* at(int r, uint64_t a) { return reinterpret_cast<int32_t*>(mem[r].data() + a); }
  bool ready(int r, int from, uint64_t bytes) {
    auto& q = ch[{from, r}];
    if (q.empty()) return false;
    if (q.front().size() != bytes)
      err = "message size mismatch on " + std::to_string(from) + "->" + std::to_string(r);
    return true;
  }
  std::vector<uint8_t> pop(int r, int from) {
    auto& q = ch[{from, r}];
    std::vector<uint8_t> m = q.front();
    q.pop_front();
    return m;
  }
  // Runs step s of rank r if it can; returns whether it ran.
  bool step(int r, const mk::XPlanLaunch& l, const mk::XStep& s) {
    switch (s.kind) {
      case mk::kXSend: {
        const uint8_t* p = mem[r].data() + s.p0;
        std::vector<uint8_t> m(p, p + s.n);
        if (!scal.empty() && (s.flags & mk::kXRawInput)) {
          if (s.n % 4) err = "raw-input send of a partial element";
          for (size_t i = 0; i + 4 <= m.size(); i += 4) {
            int32_t v;
            memcpy(&v, m.data() + i, 4);
            v = (int32_t)((uint32_t)v * (uint32_t)scal[r]);
            memcpy(m.data() + i, &v, 4);
          }
        }
        ch[{r, s.peer}].push_back(m);
        return true;
      }
      case mk::kXRecv: {
        if (!ready(r, s.peer, s.n)) return false;
        std::vector<uint8_t> m = pop(r, s.peer);
        memcpy(mem[r].data() + s.p0, m.data(), s.n);
        return true;
      }
      case mk::kXCopy:
        memmove(mem[r].data() + s.p1, mem[r].data() + s.p0, s.n);
        return true;
      default:
        break;
    }
    const bool l2 = s.flags & mk::kXHasL2, one = s.flags & mk::kXListOne;
    const int k0 = one ? 1 : 0, k1 = l2 || one ? 2 : 1;  // lists combined: [k0, k1)
    for (int k = k0; k < k1; k++)
      for (int p : l.list[k])
        if (p != r && !ready(r, p, s.n * 4)) return false;
    std::vector<int32_t> acc(s.n, 0);
    for (int k = k0; k < k1; k++) {
      std::vector<int32_t> part(s.n, 0);
      for (int p : l.list[k]) {
        std::vector<int32_t> v(s.n);
        if (p == r && k == 0) {
          memcpy(v.data(), at(r, s.p1), s.n * 4);
          if (!scal.empty())
            for (auto& x : v) x = (int32_t)((uint32_t)x * (uint32_t)scal[r]);
        } else if (p == r && one) {
          memcpy(v.data(), at(r, s.p1), s.n * 4);  // a partial: never scaled
        } else if (p == r)
          v = acc;
        else
          memcpy(v.data(), pop(r, p).data(), s.n * 4);
        for (size_t i = 0; i < s.n; i++) part[i] = (int32_t)((uint32_t)part[i] + (uint32_t)v[i]);
      }
      acc = part;
    }
    if (s.peer >= 0) {
      const uint8_t* p = reinterpret_cast<const uint8_t*>(acc.data());
      ch[{r, s.peer}].push_back(std::vector<uint8_t>(p, p + s.n * 4));
    } else {
      memcpy(at(r, s.p0), acc.data(), s.n * 4);
    }
    return true;
  }
  bool run() {
    std::vector<size_t> li(n, 0);
    std::vector<std::vector<size_t>> pos(n);
    for (bool progress = true; progress && err.empty();) {
      progress = false;
      for (int r = 0; r < n; r++) {
        if (li[r] >= plans[r].size()) continue;
        const mk::XPlanLaunch& l = plans[r][li[r]];
        if (pos[r].empty()) pos[r].assign(l.lanes.size(), 0);
        bool done = true;
        for (size_t k = 0; k < l.lanes.size(); k++) {
          while (pos[r][k] < l.lanes[k].steps.size() && step(r, l, l.lanes[k].steps[pos[r][k]]))
            pos[r][k]++, progress = true;
          done = done && pos[r][k] == l.lanes[k].steps.size();
        }
        if (done) li[r]++, pos[r].clear(), progress = true;
      }
    }
    for (int r = 0; r < n && err.empty(); r++)
      if (li[r] < plans[r].size()) err = "rank " + std::to_string(r) + " stuck";
    for (auto& kv : ch)
      if (err.empty() && !kv.second.empty()) err = "unconsumed message";
    return err.empty();
  }
};

struct Case {
  std::vector<int> nodes;  // ranks per node
  mk::CollType type;
  uint64_t count;
  int root;
  bool inplace;
  bool premul = false;  // PreMulSum, scalar 3 + 2r on rank r
};

mk::XTopo topoOf(const std::vector<int>& nodes, int me) {
  mk::XTopo t;
  int r = 0;
  for (size_t b = 0; b < nodes.size(); b++) {
    t.nodeRanks.emplace_back();
    for (int j = 0; j < nodes[b]; j++, r++) {
      if (r == me) t.node = (int)b, t.local = j;
      t.nodeRanks.back().push_back(r);
    }
  }
  t.nRanks = r;
  t.me = me;
  t.even = mk::hierEvenNodes((int)nodes.size(), nodes.data());
  return t;
}

int32_t val(int r, uint64_t i) {
  return (int32_t)(r * 1000003 + i * 7 + 1);
}

void runCase(const Case& c) {
  using mk::CollType;
  int n = 0;
  for (int x : c.nodes) n += x;
  const uint64_t cnt = c.count, M = 4 * cnt * n;  // send at [0, M), recv at [M, 2M)
  Model m;
  m.n = n;
  m.mem.assign(n, std::vector<uint8_t>(2 * M, 0));
  if (c.premul)
    for (int r = 0; r < n; r++) m.scal.push_back(3 + 2 * r);
  std::vector<uint64_t> sendA(n, 0), recvA(n, M);
  // In-place layouts as NCCL defines them.
  const bool rsIn = c.type == CollType::kReduceScatter || c.type == CollType::kScatter;
  const bool agIn = c.type == CollType::kAllGather || c.type == CollType::kGather;
  for (int r = 0; r < n; r++) {
    if (c.inplace && rsIn) recvA[r] = 4 * cnt * r;
    if (c.inplace && agIn) sendA[r] = M + 4 * cnt * r;
    if (c.inplace && !rsIn && !agIn) sendA[r] = M;
    const uint64_t inElems =
        rsIn || c.type == CollType::kAlltoAll || (c.type == CollType::kScatter && r == c.root)
            ? cnt * n
            : cnt;
    for (uint64_t i = 0; i < inElems; i++) *m.at(r, sendA[r] + 4 * i) = val(r, i);
  }
  m.plans.resize(n);
  for (int r = 0; r < n; r++) {
    mk::XOp op{c.type, sendA[r], recvA[r], cnt, 4, c.root};
    ASSERT_EQ(mk::hierPlanColl(topoOf(c.nodes, r), op, &m.plans[r]), "");
    for (auto& l : m.plans[r]) {
      mk::hierAssignPositions(&l, 256);
      ASSERT_EQ(mk::hierCheckLaunch(l, r), "") << "rank " << r;
    }
  }
  ASSERT_TRUE(m.run()) << m.err;
  auto sum = [&](uint64_t i) {
    uint32_t s = 0;
    for (int p = 0; p < n; p++) s += (uint32_t)val(p, i) * (c.premul ? (uint32_t)m.scal[p] : 1u);
    return (int32_t)s;
  };
  for (int r = 0; r < n; r++) {
    for (uint64_t i = 0; i < cnt * n; i++) {
      int32_t want = 0;
      uint64_t idx = i;
      switch (c.type) {
        case CollType::kAllGather:
          want = val((int)(i / cnt), i % cnt);
          break;
        case CollType::kAlltoAll:
          want = val((int)(i / cnt), r * cnt + i % cnt);
          break;
        case CollType::kGather:
          if (r != c.root) continue;
          want = val((int)(i / cnt), i % cnt);
          break;
        default:
          if (i >= cnt) continue;
          if (c.type == CollType::kBroadcast) want = val(c.root, i);
          if (c.type == CollType::kScatter) want = val(c.root, r * cnt + i);
          if (c.type == CollType::kAllReduce) want = sum(i);
          if (c.type == CollType::kReduce) {
            if (r != c.root) continue;
            want = sum(i);
          }
          if (c.type == CollType::kReduceScatter) want = sum(r * cnt + i);
      }
      ASSERT_EQ(*m.at(r, recvA[r] + 4 * idx), want) << "rank " << r << " element " << i;
    }
  }
}

TEST(HierChan, PlansComputeEveryCollective) {
  using mk::CollType;
  const std::vector<std::vector<int>> shapes{{2, 2},    {2, 4}, {4, 2}, {1, 1, 1}, {2, 1},   {3, 2},
                                             {1, 3, 2}, {1, 1}, {3, 3}, {4, 4},    {2, 2, 2}};
  const CollType types[] = {CollType::kAllGather,     CollType::kBroadcast, CollType::kReduce,
                            CollType::kReduceScatter, CollType::kAllReduce, CollType::kAlltoAll,
                            CollType::kGather,        CollType::kScatter};
  for (auto& sh : shapes) {
    int n = 0;
    for (int x : sh) n += x;
    const bool even = mk::hierEvenNodes((int)sh.size(), sh.data());
    for (CollType ty : types) {
      if (ty == CollType::kAllReduce && even) continue;  // hierarchical kernel
      for (uint64_t cnt : {uint64_t(1), uint64_t(7), uint64_t(300)}) {
        for (int root : {0, n - 1}) {
          for (bool inplace : {false, true}) {
            for (bool premul : {false, true}) {
              if (inplace && ty == CollType::kAlltoAll) continue;
              if (premul && ty != CollType::kReduce && ty != CollType::kReduceScatter &&
                  ty != CollType::kAllReduce)
                continue;
              SCOPED_TRACE(std::string(mk::collName(ty)) + " shape " + std::to_string(sh.size()) +
                           " nodes, " + std::to_string(n) + " ranks, count " + std::to_string(cnt) +
                           " root " + std::to_string(root) + (inplace ? " in-place" : "") +
                           (premul ? " PreMulSum" : ""));
              runCase(Case{sh, ty, cnt, root, inplace, premul});
            }
          }
        }
      }
    }
  }
}

// One rank per node: ReduceScatter sends every partial from the send lane while the
// reduction lane combines the rank's own block, so both directions of every link carry data
// at once (the node form would run the node blocks one after the other in one lane).
TEST(HierChan, ReduceScatterOneRankPerNodeOverlapsSendAndReduce) {
  for (auto sh : std::vector<std::vector<int>>{{1, 1}, {1, 1, 1}}) {
    const int n = (int)sh.size();
    for (int r = 0; r < n; r++) {
      mk::XOp op{mk::CollType::kReduceScatter, 0, 1 << 20, 4096, 4, 0};
      std::vector<mk::XPlanLaunch> plan;
      ASSERT_EQ(mk::hierPlanColl(topoOf(sh, r), op, &plan), "");
      ASSERT_EQ(plan.size(), 1u);
      int sends = 0, reduces = 0;
      for (const mk::XPlanLane& ln : plan[0].lanes) {
        bool laneSends = false, laneReduces = false;
        for (const mk::XStep& st : ln.steps) {
          laneSends |= st.kind == mk::kXSend;
          laneReduces |= st.kind == mk::kXReduce;
          sends += st.kind == mk::kXSend;
          reduces += st.kind == mk::kXReduce;
          if (st.kind == mk::kXReduce) EXPECT_LT(st.peer, 0) << "a reduction feeds a peer";
        }
        EXPECT_FALSE(laneSends && laneReduces) << "rank " << r << ": sends behind a reduction";
      }
      EXPECT_EQ(sends, n - 1) << "rank " << r;
      EXPECT_EQ(reduces, 1) << "rank " << r;
    }
  }
}

// Two nodes of several ranks: ReduceScatter's second launch sends my partial of the rail
// peer's block and combines the rail peer's partial of mine in different lanes (both
// directions at once); the first launch reduces my own block inside the node, undivided.
TEST(HierChan, ReduceScatterTwoNodesOverlapsRailDirections) {
  for (int nl : {2, 3, 4}) {
    for (int r = 0; r < 2 * nl; r++) {
      mk::XOp op{mk::CollType::kReduceScatter, 0, 1 << 20, 4096, 4, 0};
      std::vector<mk::XPlanLaunch> plan;
      ASSERT_EQ(mk::hierPlanColl(topoOf({nl, nl}, r), op, &plan), "");
      ASSERT_EQ(plan.size(), 2u);
      EXPECT_TRUE(plan[0].noPostDiv);
      EXPECT_FALSE(plan[1].noPostDiv);
      int toRail = -1, combine = -1;
      for (size_t li = 0; li < plan[1].lanes.size(); li++)
        for (const mk::XStep& st : plan[1].lanes[li].steps) {
          if (st.kind == mk::kXReduce && st.peer >= 0) toRail = (int)li;
          if (st.kind == mk::kXReduce && (st.flags & mk::kXListOne)) combine = (int)li;
        }
      ASSERT_GE(toRail, 0) << "rank " << r;
      ASSERT_GE(combine, 0) << "rank " << r;
      EXPECT_NE(toRail, combine) << "rank " << r << ": one lane carries both directions";
    }
  }
}

TEST(HierChan, CountZeroPlansNothing) {
  std::vector<mk::XPlanLaunch> out;
  mk::XOp op{mk::CollType::kAllGather, 0, 64, 0, 4, 0};
  EXPECT_EQ(mk::hierPlanColl(topoOf({2, 2}, 1), op, &out), "");
  EXPECT_TRUE(out.empty());
}

TEST(HierChan, P2pAnyOrderMatches) {
  for (auto sh : std::vector<std::vector<int>>{{2, 2}, {2, 1}, {3, 2}}) {
    int n = 0;
    for (int x : sh) n += x;
    const uint64_t B = 4 * 40;  // per message
    Model m;
    m.n = n;
    m.mem.assign(n, std::vector<uint8_t>(2 * 8 * B, 0));
    m.plans.resize(n);
    for (int r = 0; r < n; r++) {
      // Messages to r+1, r+2 and itself, sends and receives in rank-dependent orders.
      std::vector<mk::XOp> ops;
      const int peers[3] = {(r + 1) % n, (r + 2) % n, r};
      for (int k = 0; k < 3; k++) {
        for (uint64_t i = 0; i < B / 4; i++) *m.at(r, k * B + 4 * i) = val(r * 3 + k, i);
        ops.push_back(mk::XOp{mk::CollType::kSend, k * B, 0, B / 4, 4, peers[k]});
      }
      const int from[3] = {(r - 1 + n) % n, (r - 2 + 2 * n) % n, r};
      for (int k = 0; k < 3; k++)
        ops.push_back(mk::XOp{mk::CollType::kRecv, 0, 8 * B + k * B, B / 4, 4, from[k]});
      if (r % 2) std::reverse(ops.begin(), ops.end());
      ASSERT_EQ(mk::hierPlanP2p(topoOf(sh, r), ops, &m.plans[r]), "");
      for (auto& l : m.plans[r]) ASSERT_EQ(mk::hierCheckLaunch(l, r), "");
    }
    ASSERT_TRUE(m.run()) << m.err;
    for (int r = 0; r < n; r++) {
      const int from[3] = {(r - 1 + n) % n, (r - 2 + 2 * n) % n, r};
      for (int k = 0; k < 3; k++) {
        // The k-th receive of r is the k-th message of rank from[k] (addressed to r).
        const int sender = from[k], idx = k;
        for (uint64_t i = 0; i < B / 4; i++)
          ASSERT_EQ(*m.at(r, 8 * B + k * B + 4 * i), val(sender * 3 + idx, i))
              << "rank " << r << " recv " << k;
      }
    }
  }
}

TEST(HierChan, P2pSelfMismatchRefused) {
  std::vector<mk::XPlanLaunch> out;
  std::vector<mk::XOp> ops{mk::XOp{mk::CollType::kSend, 0, 0, 4, 4, 1}};
  EXPECT_NE(mk::hierPlanP2p(topoOf({1, 1}, 1), ops, &out), "");
}

}  // namespace
