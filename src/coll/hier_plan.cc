// Pure planning of the channel engine (scheme and rules: hier_xfer.h). Addresses are plain
// integers here, so every plan can be built and checked on the CPU.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include <algorithm>
#include <map>
#include <set>

#include "coll/hier.h"
#include "coll/hier_xfer.h"

namespace mk {

std::vector<int> hierRoundOrder(int g, int i) {
  std::vector<int> o(g);
  for (int t = 0; t < g; t++) o[t] = ((t - i) % g + g) % g;
  return o;
}

bool hierChanGeom(uint64_t windowBytes, int nRanks, uint64_t* areaBase, uint64_t* areaBytes,
                  uint64_t* slotBytes) {
  if (nRanks < 1) return false;
  const uint64_t half = windowBytes / 2;
  *areaBase = half;
  *areaBytes = (half / (uint64_t)nRanks) & ~(uint64_t)255;
  *slotBytes = (*areaBytes / 2) & ~(uint64_t)255;
  return *slotBytes >= 256;
}

namespace {

XStep mk(uint8_t kind, uint64_t p0, uint64_t p1, uint64_t n, int peer) {
  XStep s{};
  s.p0 = p0;
  s.p1 = p1;
  s.n = n;
  s.peer = (int16_t)peer;
  s.kind = kind;
  return s;
}
XStep send(uint64_t src, uint64_t bytes, int peer) {
  return mk(kXSend, src, 0, bytes, peer);
}
// Send of raw input to a list-0 reducer (PreMulSum: scaled by my scalar on the way).
XStep sendRaw(uint64_t src, uint64_t bytes, int peer) {
  XStep s = send(src, bytes, peer);
  s.flags |= kXRawInput;
  return s;
}
XStep recv(uint64_t dst, uint64_t bytes, int peer) {
  return mk(kXRecv, dst, 0, bytes, peer);
}
XStep copy(uint64_t src, uint64_t dst, uint64_t bytes) {
  return mk(kXCopy, src, dst, bytes, -1);
}
// Reduce of n elements, my input at `mine`, output to memory `dst` or to `peer` (>= 0).
XStep reduce(uint64_t mine, uint64_t n, uint64_t dst, int peer, bool l2) {
  XStep s = mk(kXReduce, dst, mine, n, peer);
  if (l2) s.flags |= kXHasL2;
  return s;
}

// The partials of list 1 (my own entry: the partial at `acc`) combined into `acc`.
XStep combineRail(uint64_t acc, uint64_t n) {
  XStep s = mk(kXReduce, acc, acc, n, -1);
  s.flags |= kXListOne;
  return s;
}

// Builder of one launch: lanes by role; empty steps, lanes and launches are dropped.
struct Launch {
  XPlanLane s, r, red;  // sends, receives (and copies), reduction
  std::vector<int> list[2];
  void add(std::vector<XPlanLaunch>* out) {
    XPlanLaunch l;
    for (XPlanLane* ln : {&s, &r, &red}) {
      std::vector<XStep> keep;
      for (const XStep& st : ln->steps)
        if (st.n > 0 && !(st.kind == kXCopy && st.p0 == st.p1)) keep.push_back(st);
      if (keep.empty()) continue;
      l.lanes.push_back(XPlanLane{ln->interleave, keep});
    }
    if (l.lanes.empty()) return;
    l.list[0] = list[0];
    l.list[1] = list[1];
    out->push_back(l);
  }
};

int rk(const XTopo& t, int b, int j) {
  return t.nodeRanks[b][j];
}
std::vector<int> locals(const XTopo& t) {
  return t.nodeRanks[t.node];
}
std::vector<int> rail(const XTopo& t) {
  std::vector<int> v;
  for (auto& nr : t.nodeRanks) v.push_back(nr[t.local]);
  return v;
}
std::vector<int> everyone(const XTopo& t) {
  std::vector<int> v(t.nRanks);
  for (int r = 0; r < t.nRanks; r++) v[r] = r;
  return v;
}

// Every member of `grp` (my index i) gets its block: block(p) is what I send to p, slot(p)
// where p's block lands; my own block is copied.
template <class SrcF, class DstF>
void exchange(Launch& L, const std::vector<int>& grp, int i, uint64_t bytes, SrcF src, DstF dst) {
  for (int k : hierRoundOrder((int)grp.size(), i)) {
    const int p = grp[k];
    if (k == i) {
      L.r.steps.push_back(copy(src(p), dst(p), bytes));
      continue;
    }
    L.s.steps.push_back(send(src(p), bytes, p));
    L.r.steps.push_back(recv(dst(p), bytes, p));
  }
}

void planAllGather(const XTopo& t, const XOp& o, std::vector<XPlanLaunch>* out) {
  const uint64_t B = o.count * o.es;
  const int me = t.me;
  if (!t.even) {
    Launch L;
    exchange(
        L, everyone(t), me, B, [&](int) { return o.send; },
        [&](int p) { return o.recv + (uint64_t)p * B; });
    L.add(out);
    return;
  }
  // 1. Rail: my block to the ranks of my local index on the other nodes.
  Launch L1;
  exchange(
      L1, rail(t), t.node, B, [&](int) { return o.send; },
      [&](int p) { return o.recv + (uint64_t)p * B; });
  L1.add(out);
  // 2. Node: the nNodes blocks of my rail to every local peer, theirs from them.
  Launch L2;
  const int nN = (int)t.nodeRanks.size(), nL = (int)t.nodeRanks[t.node].size();
  for (int j : hierRoundOrder(nL, t.local)) {
    if (j == t.local) continue;
    for (int b = 0; b < nN; b++) {
      L2.s.steps.push_back(send(o.recv + (uint64_t)rk(t, b, t.local) * B, B, rk(t, t.node, j)));
      L2.r.steps.push_back(recv(o.recv + (uint64_t)rk(t, b, j) * B, B, rk(t, t.node, j)));
    }
  }
  L2.add(out);
}

void planBroadcast(const XTopo& t, const XOp& o, std::vector<XPlanLaunch>* out) {
  const uint64_t B = o.count * o.es;
  const int me = t.me, root = o.root;
  if (!t.even) {
    Launch L;
    if (me == root) {
      for (int p = 0; p < t.nRanks; p++)
        if (p != me) L.s.steps.push_back(send(o.send, B, p));
      L.r.steps.push_back(copy(o.send, o.recv, B));
    } else {
      L.r.steps.push_back(recv(o.recv, B, root));
    }
    L.add(out);
    return;
  }
  int bR = 0, lR = 0;
  for (int b = 0; b < (int)t.nodeRanks.size(); b++)
    for (int j = 0; j < (int)t.nodeRanks[b].size(); j++)
      if (rk(t, b, j) == root) bR = b, lR = j;
  // 1. Root -> its rail; 2. every rail member -> its node.
  Launch L1, L2;
  if (me == root) {
    for (int b = 0; b < (int)t.nodeRanks.size(); b++)
      if (b != bR) L1.s.steps.push_back(send(o.send, B, rk(t, b, lR)));
    L1.r.steps.push_back(copy(o.send, o.recv, B));
  } else if (t.local == lR) {
    L1.r.steps.push_back(recv(o.recv, B, root));
  }
  if (t.local == lR) {
    for (int j = 0; j < (int)t.nodeRanks[t.node].size(); j++)
      if (j != lR) L2.s.steps.push_back(send(me == root ? o.send : o.recv, B, rk(t, t.node, j)));
  } else {
    L2.r.steps.push_back(recv(o.recv, B, rk(t, t.node, lR)));
  }
  L1.add(out);
  L2.add(out);
}

void planReduce(const XTopo& t, const XOp& o, std::vector<XPlanLaunch>* out) {
  const uint64_t B = o.count * o.es;
  const int me = t.me, root = o.root;
  Launch L;
  if (!t.even) {
    L.list[0] = everyone(t);
    if (me == root)
      L.red.steps.push_back(reduce(o.send, o.count, o.recv, -1, false));
    else
      L.s.steps.push_back(sendRaw(o.send, B, root));
    L.add(out);
    return;
  }
  const int lR = [&] {
    for (auto& nr : t.nodeRanks)
      for (int j = 0; j < (int)nr.size(); j++)
        if (nr[j] == root) return j;
    return 0;
  }();
  // Node partials at local index lR (local order), then at the root (node order).
  L.list[0] = locals(t);
  L.list[1] = rail(t);
  if (t.local != lR)
    L.s.steps.push_back(sendRaw(o.send, B, rk(t, t.node, lR)));
  else if (me != root)
    L.red.steps.push_back(reduce(o.send, o.count, 0, root, false));
  else
    L.red.steps.push_back(reduce(o.send, o.count, o.recv, -1, true));
  L.add(out);
}

void planReduceScatter(const XTopo& t, const XOp& o, std::vector<XPlanLaunch>* out) {
  const uint64_t B = o.count * o.es;
  Launch L;
  L.s.interleave = true;
  // One rank per node: the direct form. The node form below runs the node blocks one after
  // the other in the reduction lane (node b combines while every other node sends to it),
  // so each node's link carries one direction at a time: on the H200 (2 processes as 2
  // nodes) a GEMM + ReduceScatter took as long as the AllReduce of the same size.
  if (!t.even || t.nodeRanks[t.node].size() == 1) {
    L.list[0] = everyone(t);
    for (int p = 0; p < t.nRanks; p++)
      if (p != t.me) L.s.steps.push_back(sendRaw(o.send + (uint64_t)p * B, B, p));
    L.red.steps.push_back(reduce(o.send + (uint64_t)t.me * B, o.count, o.recv, -1, false));
    L.add(out);
    return;
  }
  const int nN = (int)t.nodeRanks.size(), nL = (int)t.nodeRanks[t.node].size();
  if (nN == 2) {
    // Two nodes: first my block's node partial, reduced into recvbuff (no division yet);
    // then, in three lanes at once, the raw inputs of the other node's blocks to my local
    // peers, my partial of my rail peer's block to it, and the rail peer's partial of mine
    // combined with my node partial (node order, as below: the same bits). Both directions
    // of the rail carry data together.
    Launch L1, L2;
    L1.s.interleave = L2.s.interleave = true;
    L1.list[0] = L2.list[0] = locals(t);
    L2.list[1] = rail(t);
    const int other = 1 - t.node;
    for (int j = 0; j < nL; j++) {
      if (j == t.local) continue;
      L1.s.steps.push_back(sendRaw(o.send + (uint64_t)rk(t, t.node, j) * B, B, rk(t, t.node, j)));
      L2.s.steps.push_back(sendRaw(o.send + (uint64_t)rk(t, other, j) * B, B, rk(t, t.node, j)));
    }
    L1.red.steps.push_back(
        reduce(o.send + (uint64_t)rk(t, t.node, t.local) * B, o.count, o.recv, -1, false));
    L2.red.steps.push_back(reduce(o.send + (uint64_t)rk(t, other, t.local) * B, o.count, 0,
                                  rk(t, other, t.local), false));
    L2.r.steps.push_back(combineRail(o.recv, o.count));
    const size_t before = out->size();
    L1.add(out);
    if (out->size() > before) out->back().noPostDiv = true;
    L2.add(out);
    return;
  }
  // For every node b (in order): the blocks of rail (b, l) reduced inside the node at local
  // index l; the partial goes to (b, l), which combines the nNodes partials in node order.
  L.list[0] = locals(t);
  L.list[1] = rail(t);
  for (int b = 0; b < nN; b++) {
    for (int j = 0; j < nL; j++)
      if (j != t.local)
        L.s.steps.push_back(sendRaw(o.send + (uint64_t)rk(t, b, j) * B, B, rk(t, t.node, j)));
    const uint64_t mine = o.send + (uint64_t)rk(t, b, t.local) * B;
    if (b == t.node)
      L.red.steps.push_back(reduce(mine, o.count, o.recv, -1, true));
    else
      L.red.steps.push_back(reduce(mine, o.count, 0, rk(t, b, t.local), false));
  }
  L.add(out);
}

// Uneven nodes: direct reduce-scatter of rank segments (each reduced by its owner in rank
// order, so every rank gets the same bits), then direct all-gather of the segments.
void planAllReduceFlat(const XTopo& t, const XOp& o, std::vector<XPlanLaunch>* out) {
  const int n = t.nRanks;
  std::vector<uint64_t> off(n), len(n);
  for (int p = 0; p < n; p++) hierSegment(o.count, n, o.es, p, &off[p], &len[p]);
  Launch L1;
  L1.s.interleave = true;
  L1.list[0] = everyone(t);
  for (int p = 0; p < n; p++)
    if (p != t.me) L1.s.steps.push_back(sendRaw(o.send + off[p] * o.es, len[p] * o.es, p));
  L1.red.steps.push_back(
      reduce(o.send + off[t.me] * o.es, len[t.me], o.recv + off[t.me] * o.es, -1, false));
  L1.add(out);
  Launch L2;
  for (int p : hierRoundOrder(n, t.me)) {
    if (p == t.me) continue;
    L2.s.steps.push_back(send(o.recv + off[t.me] * o.es, len[t.me] * o.es, p));
    L2.r.steps.push_back(recv(o.recv + off[p] * o.es, len[p] * o.es, p));
  }
  L2.add(out);
}

void planDirect(const XTopo& t, const XOp& o, std::vector<XPlanLaunch>* out) {
  const uint64_t B = o.count * o.es;
  const int me = t.me, root = o.root;
  Launch L;
  if (o.type == CollType::kAlltoAll) {
    exchange(
        L, everyone(t), me, B, [&](int p) { return o.send + (uint64_t)p * B; },
        [&](int p) { return o.recv + (uint64_t)p * B; });
  } else if (o.type == CollType::kGather) {
    if (me != root) {
      L.s.steps.push_back(send(o.send, B, root));
    } else {
      for (int p : hierRoundOrder(t.nRanks, me))
        L.r.steps.push_back(p == me ? copy(o.send, o.recv + (uint64_t)me * B, B)
                                    : recv(o.recv + (uint64_t)p * B, B, p));
    }
  } else {  // Scatter
    if (me != root) {
      L.r.steps.push_back(recv(o.recv, B, root));
    } else {
      for (int p : hierRoundOrder(t.nRanks, me)) {
        if (p == me)
          L.r.steps.push_back(copy(o.send + (uint64_t)me * B, o.recv, B));
        else
          L.s.steps.push_back(send(o.send + (uint64_t)p * B, B, p));
      }
    }
  }
  L.add(out);
}

}  // namespace

std::string hierPlanColl(const XTopo& t, const XOp& o, std::vector<XPlanLaunch>* out) {
  if (t.nRanks > kXMaxRanks)
    return "more than " + std::to_string(kXMaxRanks) + " ranks across nodes";
  if (o.count == 0) return "";
  switch (o.type) {
    case CollType::kAllGather:
      planAllGather(t, o, out);
      break;
    case CollType::kBroadcast:
      planBroadcast(t, o, out);
      break;
    case CollType::kReduce:
      planReduce(t, o, out);
      break;
    case CollType::kReduceScatter:
      planReduceScatter(t, o, out);
      break;
    case CollType::kAllReduce:
      if (t.even) return "AllReduce on even nodes is the hierarchical kernel's";
      planAllReduceFlat(t, o, out);
      break;
    case CollType::kAlltoAll:
    case CollType::kGather:
    case CollType::kScatter:
      planDirect(t, o, out);
      break;
    default:
      return std::string("no inter-node plan for ") + collName(o.type);
  }
  return "";
}

std::string hierPlanP2p(const XTopo& t, const std::vector<XOp>& ops,
                        std::vector<XPlanLaunch>* out) {
  if (t.nRanks > kXMaxRanks)
    return "more than " + std::to_string(kXMaxRanks) + " ranks across nodes";
  const int n = t.nRanks, me = t.me;
  auto round = [&](int p) { return (me + p) % n; };
  std::vector<std::pair<int, XStep>> s, r;  // (round, step), stable-sorted below
  std::vector<const XOp*> selfSend, selfRecv;
  for (const XOp& o : ops) {
    const uint64_t B = o.count * o.es;
    if (o.root == me) {
      (o.type == CollType::kSend ? selfSend : selfRecv).push_back(&o);
    } else if (o.type == CollType::kSend) {
      s.push_back({round(o.root), send(o.send, B, o.root)});
    } else {
      r.push_back({round(o.root), recv(o.recv, B, o.root)});
    }
  }
  if (selfSend.size() != selfRecv.size())
    return "rank " + std::to_string(me) + " sends " + std::to_string(selfSend.size()) +
           " messages to itself but receives " + std::to_string(selfRecv.size());
  for (size_t k = 0; k < selfSend.size(); k++) {
    const uint64_t a = selfSend[k]->count * selfSend[k]->es,
                   b = selfRecv[k]->count * selfRecv[k]->es;
    if (a != b)
      return "rank " + std::to_string(me) + " sends " + std::to_string(a) +
             " bytes to itself but receives " + std::to_string(b);
    r.push_back({round(me), copy(selfSend[k]->send, selfRecv[k]->recv, a)});
  }
  auto byRound = [](const std::pair<int, XStep>& x, const std::pair<int, XStep>& y) {
    return x.first < y.first;
  };
  std::stable_sort(s.begin(), s.end(), byRound);
  std::stable_sort(r.begin(), r.end(), byRound);
  Launch L;
  for (auto& x : s) L.s.steps.push_back(x.second);
  for (auto& x : r) L.r.steps.push_back(x.second);
  L.add(out);
  return "";
}

void hierAssignPositions(XPlanLaunch* l, uint64_t slotBytes) {
  for (XPlanLane& ln : l->lanes) {
    if (!ln.interleave) continue;
    std::map<int, uint32_t> next;  // peer -> next chunk position of its stream
    std::map<int, size_t> last;
    for (size_t i = 0; i < ln.steps.size(); i++) {
      XStep& s = ln.steps[i];
      s.pos0 = next[s.peer];
      next[s.peer] += (uint32_t)hierChunks(s.n, slotBytes);
      last[s.peer] = i;
      s.flags &= (uint8_t)~kXLastOfStream;
    }
    for (auto& kv : last) ln.steps[kv.second].flags |= kXLastOfStream;
  }
}

std::string hierCheckLaunch(const XPlanLaunch& l, int me) {
  if (l.lanes.size() > (size_t)kXMaxLanes) return "too many lanes";
  std::map<int, size_t> sendLane, recvLane;  // channel endpoint -> lane
  auto claim = [&](std::map<int, size_t>& m, int peer, size_t lane) {
    auto it = m.find(peer);
    if (it != m.end() && it->second != lane) return false;
    m[peer] = lane;
    return true;
  };
  int reducersToPeer = 0;
  for (size_t li = 0; li < l.lanes.size(); li++) {
    bool toPeer = false;
    // Every collective across nodes passes here: the message prefix is built only on failure.
    auto at = [li]() { return "lane " + std::to_string(li) + ": "; };
    for (const XStep& s : l.lanes[li].steps) {
      if (l.lanes[li].interleave && s.kind != kXSend)
        return at() + "interleaved lane with a non-send";
      if ((s.flags & kXRawInput) && s.kind != kXSend) return at() + "raw-input flag on a non-send";
      if ((s.kind == kXSend || s.kind == kXRecv) && (s.peer < 0 || s.peer == me))
        return at() + "send/recv with itself";
      bool ok = true;
      if (s.kind == kXSend) ok = claim(sendLane, s.peer, li);
      if (s.kind == kXRecv) ok = claim(recvLane, s.peer, li);
      if (s.kind == kXReduce) {
        if (s.peer >= 0 && (s.flags & kXHasL2)) return at() + "two-level reduce sent to a peer";
        const bool one = s.flags & kXListOne;
        if (one && (s.peer >= 0 || (s.flags & kXHasL2)))
          return at() + "a list-1 reduce goes to memory, alone";
        if (s.peer >= 0) ok = claim(sendLane, s.peer, li), toPeer = true;
        for (int k = one ? 1 : 0; k < 2 && ok; k++) {
          if (k == 1 && !(s.flags & kXHasL2) && !one) break;
          if (l.list[k].empty()) return at() + "reduce with an empty list";
          for (int p : l.list[k])
            if (p != me) ok = ok && claim(recvLane, p, li);
        }
      }
      if (!ok) return at() + "channel with peer " + std::to_string(s.peer) + " used by two lanes";
    }
    reducersToPeer += toPeer;
  }
  if (reducersToPeer > 1) return "two lanes reduce to peers (one scratch area)";
  return "";
}

}  // namespace mk
