// Per-node dedup of the MoE AllToAll path across (virtual) nodes (issue 13; the plan in
// notes/helper-moe-dedup): the routing and size arithmetic every rank must agree on, shared
// by host code, the CPU protocol model (tests/unit/test_moe_node.cc) and, later, the device
// kernels (MK_HD, no CUDA calls, no allocation).
//
// Roles. Source s (node a, local index l) sends each token once to its gateway on every
// remote node b: the rank of local index l on node b (the rail peer). The gateway forwards it
// to the token's owners on node b (itself included) inside the node. Own-node owners are
// served direct. Spill rule: when s has more tokens with a sent slot on node b than a pair
// buffer holds (railToks > pairRows), node b is served direct from s for this call (one block
// per owner, as without dedup), so a routing that fits the bound never fails because of dedup.
//
// Count message of the pair s -> p (stride moeCntStride): per local expert rows, then ovf,
// maxRows, rows (slots), toks (distinct tokens of s for p, whatever the route), blk (token
// rows the block s -> p carries in the rows AllToAll), mode (kMoeDirect, kMoeViaGateway,
// kMoeRailBlock: p is s's gateway for p's node), and in rail blocks fan[m] = toks(s -> rank
// m of p's node). The packed layout still depends on the per-expert rows alone, so every slot
// lands on the same row as without dedup.
//
// Fan sizes need no second exchange: the gateway sends fanOut[m] = sum over its rail blocks of
// fan[m]; the receiver expects fanIn[q] = sum of toks(s -> me) over the sources s whose
// gateway for my node is q and which did not spill: both sums are over the same sources and
// the same numbers (s wrote both). A sum over pairRows becomes 0 at both ends: it implies the
// receiver's span exceeds maxRows (fan rows <= its tokens <= its rows), so it receives
// nothing anyway.
#pragma once
#include <cstdint>

#include "comm/workspace.h"  // MK_HD

namespace mk {
namespace fused {

constexpr int kMoeNodeMaxRanks = 256;  // the rail meta's src field is 8 bits
constexpr int kMoeNodeMaxLocal = 32;
constexpr int kMoeNodeMaxNodes = 128;

// cntMode values.
constexpr int32_t kMoeDirect = 0;      // the block carries the pair's own tokens
constexpr int32_t kMoeViaGateway = 1;  // empty block: the pair's tokens go through the gateway
constexpr int32_t kMoeRailBlock = 2;   // p is s's gateway: one row per token of s on p's node

// Node tables of a comm, by value in kernel arguments (~0.8 KB). rankAt is filled only when
// rail is set (even nodes).
struct MoeNodeMap {
  int32_t rail;  // 1: remote nodes through rail gateways; 0: every pair direct
  int32_t nRanks, nNodes, nLocal, me;
  uint8_t nodeOf[kMoeNodeMaxRanks];
  uint8_t localOf[kMoeNodeMaxRanks];  // index among the node's ranks, in rank order
  uint8_t rankAt[kMoeNodeMaxRanks];   // [node * nLocal + local] -> rank
};

// Host: the tables from each rank's node id (dense ids 0..nNodes-1). False on a bad input (n
// outside [1, 256], a node id outside [0, 256), an unused node id). Dedup is on when asked and
// the comm spans 2..128 nodes of equal size 2..32; otherwise every pair stays direct.
inline bool moeNodeMapInit(int32_t nRanks, const int32_t* nodeOfRank, int32_t me, bool enable,
                           MoeNodeMap* m) {
  if (nRanks < 1 || nRanks > kMoeNodeMaxRanks || me < 0 || me >= nRanks) return false;
  int32_t size[kMoeNodeMaxRanks] = {};
  int32_t nNodes = 0;
  for (int32_t r = 0; r < nRanks; ++r) {
    const int32_t b = nodeOfRank[r];
    if (b < 0 || b >= kMoeNodeMaxRanks) return false;
    m->nodeOf[r] = (uint8_t)b;
    m->localOf[r] = (uint8_t)size[b]++;
    if (b + 1 > nNodes) nNodes = b + 1;
  }
  bool even = true;
  for (int32_t b = 0; b < nNodes; ++b) {
    if (size[b] == 0) return false;
    even = even && size[b] == size[0];
  }
  m->nRanks = nRanks;
  m->nNodes = nNodes;
  m->nLocal = even ? size[0] : 0;
  m->me = me;
  m->rail = enable && even && nNodes >= 2 && nNodes <= kMoeNodeMaxNodes && size[0] >= 2 &&
                    size[0] <= kMoeNodeMaxLocal
                ? 1
                : 0;
  if (m->rail)
    for (int32_t r = 0; r < nRanks; ++r) m->rankAt[m->nodeOf[r] * m->nLocal + m->localOf[r]] = r;
  return true;
}

// Count message layout.
MK_HD constexpr int moeCntOvf(int epr) {
  return epr;
}
MK_HD constexpr int moeCntMax(int epr) {
  return epr + 1;
}
MK_HD constexpr int moeCntRows(int epr) {
  return epr + 2;
}
MK_HD constexpr int moeCntToks(int epr) {
  return epr + 3;
}
MK_HD constexpr int moeCntBlk(int epr) {
  return epr + 4;
}
MK_HD constexpr int moeCntMode(int epr) {
  return epr + 5;
}
MK_HD constexpr int moeCntFan(int epr, int local) {
  return epr + 6 + local;
}
MK_HD inline int moeFanLen(const MoeNodeMap& m) {
  return m.rail ? m.nLocal : 0;
}
MK_HD inline int moeCntStride(const MoeNodeMap& m, int epr) {
  return epr + 6 + moeFanLen(m);
}

// My gateway on node b (the rank of my local index there), and the rank of my node that
// forwards src's tokens to me (src's local index on my node). Rail maps only.
MK_HD inline int moeRailPeer(const MoeNodeMap& m, int node) {
  return m.rankAt[node * m.nLocal + m.localOf[m.me]];
}
MK_HD inline int moeFanGateway(const MoeNodeMap& m, int src) {
  return m.rankAt[m.nodeOf[m.me] * m.nLocal + m.localOf[src]];
}

// Spill rule: node b goes through my gateway iff dedup is on, b is remote and my tokens with a
// sent slot on b fit one pair buffer.
MK_HD inline bool moeNodeRail(const MoeNodeMap& m, int node, int64_t railToks, int64_t pairRows) {
  return m.rail != 0 && node != m.nodeOf[m.me] && railToks <= pairRows;
}

// The mode of my pair to dst, given whether dst's node goes through my gateway.
MK_HD inline int32_t moeNodeMode(const MoeNodeMap& m, int dst, bool nodeRail) {
  if (!nodeRail) return kMoeDirect;
  return moeRailPeer(m, m.nodeOf[dst]) == dst ? kMoeRailBlock : kMoeViaGateway;
}

// Slot i's routed expert, -1 when it is not sent (-1 id, bad id, or its pair overflowed:
// msg[dst * stride + ovf] != 0).
MK_HD inline int32_t moeSentExpert(int32_t e, int32_t experts, const int32_t* msg, int stride,
                                   int epr) {
  if (e < 0 || e >= experts) return -1;
  return msg[(e / epr) * stride + moeCntOvf(epr)] == 0 ? e : -1;
}

// The block (rank of the rows AllToAll) that carries slot i's token, -1 if not sent; needs the
// modes in msg.
MK_HD inline int32_t moeSlotBlock(const MoeNodeMap& m, int32_t e, int32_t experts,
                                  const int32_t* msg, int stride, int epr) {
  if (moeSentExpert(e, experts, msg, stride, epr) < 0) return -1;
  const int dst = e / epr;
  return msg[dst * stride + moeCntMode(epr)] == kMoeDirect ? dst : moeRailPeer(m, m.nodeOf[dst]);
}

// Host or one thread: the count message of every pair of this source (msg [n][stride]) from
// its routing. railToks [nNodes] receives the tokens with a sent slot per node. pairRows is
// the bound (maxRows) every pair buffer holds. False on a bad expert id (*badSlot = the first
// one; it counts as unused).
MK_HD inline bool moeSourceCounts(const MoeNodeMap& m, int32_t tokens, int32_t topk,
                                  int32_t experts, int32_t epr, const int32_t* topkIdx,
                                  int64_t pairRows, int32_t* msg, int32_t* railToks,
                                  int64_t* badSlot) {
  const int n = m.nRanks, stride = moeCntStride(m, epr);
  bool ok = true;
  for (int i = 0; i < n * stride; ++i) msg[i] = 0;
  for (int b = 0; b < m.nNodes; ++b) railToks[b] = 0;
  for (int64_t i = 0; i < (int64_t)tokens * topk; ++i) {
    const int32_t e = topkIdx[i];
    if (e == -1) continue;
    if (e < 0 || e >= experts) {
      if (ok) *badSlot = i;
      ok = false;
      continue;
    }
    ++msg[(e / epr) * stride + e % epr];
  }
  for (int d = 0; d < n; ++d) {
    int64_t rows = 0;
    for (int le = 0; le < epr; ++le) rows += msg[d * stride + le];
    const bool ovf = rows > pairRows;
    msg[d * stride + moeCntOvf(epr)] = ovf ? 1 : 0;
    msg[d * stride + moeCntMax(epr)] = (int32_t)pairRows;
    msg[d * stride + moeCntRows(epr)] = ovf ? 0 : (int32_t)rows;
  }
  // Distinct tokens per destination and per node (a token's first sent slot there).
  for (int64_t t = 0; t < tokens; ++t) {
    for (int j = 0; j < topk; ++j) {
      const int32_t e = moeSentExpert(topkIdx[t * topk + j], experts, msg, stride, epr);
      if (e < 0) continue;
      bool firstDst = true, firstNode = true;
      for (int jj = 0; jj < j; ++jj) {
        const int32_t ee = moeSentExpert(topkIdx[t * topk + jj], experts, msg, stride, epr);
        if (ee < 0) continue;
        firstDst = firstDst && ee / epr != e / epr;
        firstNode = firstNode && m.nodeOf[ee / epr] != m.nodeOf[e / epr];
      }
      if (firstDst) ++msg[(e / epr) * stride + moeCntToks(epr)];
      if (firstNode) ++railToks[m.nodeOf[e / epr]];
    }
  }
  for (int d = 0; d < n; ++d) {
    int32_t* c = msg + d * stride;
    const int b = m.nodeOf[d];
    const int32_t mode = moeNodeMode(m, d, moeNodeRail(m, b, railToks[b], pairRows));
    c[moeCntMode(epr)] = mode;
    c[moeCntBlk(epr)] =
        mode == kMoeDirect ? c[moeCntToks(epr)] : (mode == kMoeRailBlock ? railToks[b] : 0);
    if (mode == kMoeRailBlock)
      for (int l = 0; l < m.nLocal; ++l)
        c[moeCntFan(epr, l)] = msg[m.rankAt[b * m.nLocal + l] * stride + moeCntToks(epr)];
  }
  return ok;
}

// Gateway: token rows it forwards to local index l of its node (recvCnt [n][stride], the
// received count messages); 0 when the sum exceeds pairRows.
MK_HD inline int64_t moeFanOut(const MoeNodeMap& m, const int32_t* recvCnt, int epr, int local,
                               int64_t pairRows) {
  if (!m.rail) return 0;
  const int stride = moeCntStride(m, epr);
  int64_t sum = 0;
  for (int src = 0; src < m.nRanks; ++src) {
    const int32_t* c = recvCnt + src * stride;
    if (c[moeCntMode(epr)] == kMoeRailBlock) sum += c[moeCntFan(epr, local)];
  }
  return sum > pairRows ? 0 : sum;
}

// Receiver: token rows it expects from local index l of its node (the gateway of the remote
// sources of local index l that did not spill); 0 when the sum exceeds pairRows.
MK_HD inline int64_t moeFanIn(const MoeNodeMap& m, const int32_t* recvCnt, int epr, int local,
                              int64_t pairRows) {
  if (!m.rail) return 0;
  const int stride = moeCntStride(m, epr);
  int64_t sum = 0;
  for (int src = 0; src < m.nRanks; ++src) {
    const int32_t* c = recvCnt + src * stride;
    if (m.nodeOf[src] != m.nodeOf[m.me] && m.localOf[src] == local &&
        c[moeCntMode(epr)] != kMoeDirect)
      sum += c[moeCntToks(epr)];
  }
  return sum > pairRows ? 0 : sum;
}

// Receiver: whether the route entries of src's message to me are consistent with the map and
// with each other (a failed exchange leaves -1s; the caller then receives nothing).
MK_HD inline bool moeCntRouteValid(const MoeNodeMap& m, const int32_t* c, int src, int epr,
                                   int64_t pairRows) {
  const int32_t mode = c[moeCntMode(epr)], blk = c[moeCntBlk(epr)], toks = c[moeCntToks(epr)];
  if (blk < 0 || blk > pairRows || toks < 0) return false;
  if (mode == kMoeDirect) return blk == toks;
  if (mode != kMoeViaGateway && mode != kMoeRailBlock) return false;
  if (!m.rail || m.nodeOf[src] == m.nodeOf[m.me]) return false;
  const bool gw = moeFanGateway(m, src) == m.me;
  if (mode == kMoeViaGateway) return !gw && blk == 0;
  if (!gw || c[moeCntFan(epr, m.localOf[m.me])] != toks) return false;
  int64_t sum = 0;
  for (int l = 0; l < m.nLocal; ++l) {
    const int32_t f = c[moeCntFan(epr, l)];
    if (f < 0 || f > blk) return false;
    sum += f;
  }
  return sum >= blk && (blk > 0 || sum == 0);  // every rail row goes to >= 1 local owner
}

// Token rows this source sends across nodes (the bytes model: times rowBytes).
MK_HD inline int64_t moeCrossNodeRows(const MoeNodeMap& m, const int32_t* msg, int epr) {
  const int stride = moeCntStride(m, epr);
  int64_t rows = 0;
  for (int d = 0; d < m.nRanks; ++d)
    if (m.nodeOf[d] != m.nodeOf[m.me]) rows += msg[d * stride + moeCntBlk(epr)];
  return rows;
}

// The z field of a rail or fan metadata entry: slot (8 bits), the owner's local index on the
// gateway's node (8 bits) and the source rank (16 bits), so a fan block names its sources.
MK_HD inline int32_t moeFanZ(int slot, int dstLocal, int src) {
  return slot | dstLocal << 8 | src << 16;
}
MK_HD inline int moeFanZSlot(int32_t z) {
  return z & 0xff;
}
MK_HD inline int moeFanZLocal(int32_t z) {
  return (z >> 8) & 0xff;
}
MK_HD inline int moeFanZSrc(int32_t z) {
  return (z >> 16) & 0xffff;
}

}  // namespace fused
}  // namespace mk
