// The "xnode" layout of the fused MoE kernels: a comm spanning (virtual) nodes (issue 13;
// docs/moe.md, Plan item 6). Token rows and, for the whole layer, the experts' outputs move
// through the device communication API (P2P stores inside a node, the proxy across nodes) with
// the protocol of the fused kernels across nodes (fused/core/xnode_proto.h: per ordered pair a
// stream of chunks into slot rings of the receiver's window, credits, acks, kGxDone). This
// header holds the arithmetic the host planner, the kernel (xnode_kernel.cuh) and the CPU unit
// test (tests/unit/test_moe_xnode.cc) share.
//
// Before the kernel, in stream order, the AllToAll path's first steps run unchanged (a2a.cu):
// pack (counts, each slot's pair row, one token row per (token, destination)), rows (token
// rows with their slots' metadata, here as one record per token row) and the counts'
// AllToAll. So both ends of every pair know, on the device, what the pair carries:
//   dispatch part of the stream s -> d: blk(s -> d) records (count message entry moeCntBlk),
//     each a token row followed by its k metadata entries (int4: pair row, token, slot,
//     weight bits; pair row -1 ends the list): recBytes = rowBytes + 16 k;
//   fan part (the node dedup, MKERNEL_MOE_NODE_DEDUP=1, moe_node.h; only between two ranks of
//     one node): gateway s forwards to d the rows of d's slots from the rail blocks s received
//     (one record per token row and owner, with that owner's entries, whose slot field is
//     moeFanZ(slot, owner's local index, source)): fanOut / fanIn records (mxFanOut, mxFanIn);
//   return part (the layer only), numbered after them on the same stream: the rows of the
//     opposite pair d -> s that s computed, rows(d -> s) rows of H elements of the input type
//     (the experts' outputs rounded as the combine takes them, combine_dev.cuh: a return row
//     is rowBytes; moeCntRows), in pair row order (the return AllToAll's positions).
// The sender knows blk(s -> d) from its own message, rows(d -> s) and its fan sums from the
// ones it received; the receiver knows the same numbers the other way round (the fan sums by
// moe_node.h's rule): no further exchange.
#pragma once
#include <cstdint>

#include "fused/core/xnode_proto.h"
#include "fused/ops/moe/moe_node.h"  // the count message entries

namespace mk {
namespace fused {

struct MxPlan {
  bool ok = false;         // false: the AllToAll path runs (every rank alike)
  int64_t areaBytes = 0;   // window bytes per source rank
  int64_t recBytes = 0;    // a dispatch record: token row + k metadata entries
  int64_t retBytes = 0;    // a return row: rowBytes (0: the dispatch call, no return part)
  int32_t dispRows = 0;    // records per dispatch chunk
  int32_t retRows = 0;     // rows per return chunk
  int64_t chunkBytes = 0;  // the slot size: the larger chunk of both parts, 16-byte multiple
  int32_t slots = 0;       // chunk slots per source area (>= 2)
};

// A pure function of values every rank shares (the comm's agreed window size, n, the call's
// shape; not maxRows, which a rank may pass wrong: the call then reports it, RecvLayout::
// otherMax, on the same path), so every rank takes the same path. A chunk is at most
// min(areaBytes / 2, kGxChunkTarget) bytes of whole records (or rows).
MK_HD inline MxPlan mxPlan(uint64_t windowBytes, int n, int64_t rowBytes, int topk, int64_t hidden,
                           bool ret, bool fan = false) {
  MxPlan p;
  if (n < 2 || n > kGxMaxRanks || rowBytes <= 0 || rowBytes % 16 != 0 || topk < 1 || hidden <= 0 ||
      (ret && hidden % 4 != 0))
    return p;
  p.areaBytes = (int64_t)(windowBytes / (uint64_t)n) / 256 * 256;
  const int64_t cap = p.areaBytes / 2 < kGxChunkTarget ? p.areaBytes / 2 : kGxChunkTarget;
  p.recBytes = rowBytes + 16 * (int64_t)topk;
  p.retBytes = ret ? rowBytes : 0;
  if (p.recBytes > cap || p.retBytes > cap) return p;
  const int64_t d = cap / p.recBytes, r = ret ? cap / p.retBytes : 1;
  // Chunk counts ride in the low 32 bits of the signal values (kGxDone reserved); a pair
  // carries at most maxRows < 2^31 records, as many fan records (`fan`: the node dedup) and as
  // many return rows.
  const int64_t most =
      (fan ? 2 : 1) * ((INT32_MAX + d - 1) / d) + (ret ? (INT32_MAX + r - 1) / r : 0);
  if (most >= (int64_t)kGxDone) return p;
  p.dispRows = (int32_t)d;
  p.retRows = (int32_t)r;
  const int64_t a = d * p.recBytes, b = ret ? r * p.retBytes : 0;
  p.chunkBytes = ((a > b ? a : b) + 15) / 16 * 16;
  const int64_t slots = p.areaBytes / p.chunkBytes;
  p.slots = (int32_t)(slots < kGxMaxSlots ? slots : kGxMaxSlots);
  p.ok = p.slots >= 2;
  return p;
}

// Chunks of a part carrying `rows` records (or return rows) of `per` a chunk.
MK_HD inline int64_t mxChunks(int64_t rows, int32_t per) {
  return rows > 0 ? (rows + per - 1) / per : 0;
}
// Rows of chunk j of a part of `rows` rows.
MK_HD inline int64_t mxChunkRows(int64_t rows, int32_t per, int64_t j) {
  const int64_t left = rows - j * per;
  return left < per ? left : per;
}
// The return chunk (0-based, inside the return part) that carries pair row pr.
MK_HD inline int64_t mxRetChunkOf(int64_t pr, int32_t retRows) {
  return pr / retRows;
}

// Fan records of the stream g -> q (gateway g forwards to q, a rank of its node; 0 otherwise
// and without the dedup), at the sender g from the counts it received (moeFanOut) and at the
// receiver q from its own (moeFanIn): the same number at both ends. 0 where the two ranks'
// maxRows differ, at both ends alike (that error is reported; the AllToAll path's forward
// kernel does the same).
MK_HD inline int64_t mxFanOut(const MoeNodeMap& m, const int32_t* recvCnt, int epr, int dst,
                              int64_t pairRows) {
  if (!m.rail || dst == m.me || m.nodeOf[dst] != m.nodeOf[m.me]) return 0;
  if (recvCnt[dst * moeCntStride(m, epr) + moeCntMax(epr)] != (int32_t)pairRows) return 0;
  return moeFanOut(m, recvCnt, epr, m.localOf[dst], pairRows);
}
MK_HD inline int64_t mxFanIn(const MoeNodeMap& m, const int32_t* recvCnt, int epr, int src,
                             int64_t pairRows) {
  if (!m.rail || src == m.me || m.nodeOf[src] != m.nodeOf[m.me]) return 0;
  if (recvCnt[src * moeCntStride(m, epr) + moeCntMax(epr)] != (int32_t)pairRows) return 0;
  return moeFanIn(m, recvCnt, epr, m.localOf[src], pairRows);
}

// One ordered pair's stream: what each part carries and where its chunks end (the fan part's
// first chunk is dispEnd, the return part's fanEnd).
struct MxStream {
  int64_t blk = 0, fan = 0, ret = 0;  // records, fan records, return rows
  int64_t dispEnd = 0, fanEnd = 0, total = 0;
};
MK_HD inline MxStream mxStream(const MxPlan& p, int64_t blk, int64_t fan, int64_t ret) {
  MxStream s;
  s.blk = blk > 0 ? blk : 0;
  s.fan = fan > 0 ? fan : 0;
  s.ret = p.retBytes > 0 && ret > 0 ? ret : 0;
  s.dispEnd = mxChunks(s.blk, p.dispRows);
  s.fanEnd = s.dispEnd + mxChunks(s.fan, p.dispRows);
  s.total = s.fanEnd + mxChunks(s.ret, p.retRows);
  return s;
}
// Both ends of the stream s -> d from their own count messages (the pack kernel's sendCnt
// [n][stride] and the AllToAll's recvCnt [n][stride], moe_node.h's entries): the sender s sends
// its records for d (sendCnt[d].blk), its fan records for d and returns the rows d sent it
// (recvCnt[d].rows); the receiver d expects the records s announced (recvCnt[s].blk), the fan
// records of gateway s and the rows it sent s (sendCnt[s].rows).
MK_HD inline MxStream mxSenderStream(const MxPlan& p, const MoeNodeMap& m, const int32_t* sendCnt,
                                     const int32_t* recvCnt, int epr, int dst, int64_t pairRows) {
  const int st = moeCntStride(m, epr);
  return mxStream(p, sendCnt[dst * st + moeCntBlk(epr)], mxFanOut(m, recvCnt, epr, dst, pairRows),
                  recvCnt[dst * st + moeCntRows(epr)]);
}
MK_HD inline MxStream mxReceiverStream(const MxPlan& p, const MoeNodeMap& m, const int32_t* sendCnt,
                                       const int32_t* recvCnt, int epr, int src, int64_t pairRows) {
  const int st = moeCntStride(m, epr);
  return mxStream(p, recvCnt[src * st + moeCntBlk(epr)], mxFanIn(m, recvCnt, epr, src, pairRows),
                  sendCnt[src * st + moeCntRows(epr)]);
}

// Comm CTAs of a rank's kernel of `budget` CTAs: config commSms when >= 2, else groups of 2
// send and 2 land CTAs per peer (4 (n - 1)) where that is at most a quarter of the budget, one
// of each (2 (n - 1)) otherwise; at least 2 and at most 2 (n - 1) kMxMaxGroup, leaving the
// unpack CTAs one. 0 when the budget is below 3. Measured on the H200 (2 processes as 2
// virtual nodes; the layer, H 7168 T 2048 / H 2048 T 4096, ms): groups of 8 41.8 / 19.5, one
// of each 33.6 / 15.4 (session 36 call B), groups of 2 28.1 / 13.1 against one of each 33.0 /
// 14.5 (call C): a land CTA copies ~11 GB/s out of the window, and more CTAs cost the GEMMs.
constexpr int kMxMaxGroup = 8;
MK_HD inline int mxCommCtas(int budget, int n, int commSms) {
  if (budget < 3) return 0;
  int c = commSms >= 2 ? commSms : 4 * (n - 1) <= budget / 4 ? 4 * (n - 1) : 2 * (n - 1);
  if (c > 2 * (n - 1) * kMxMaxGroup) c = 2 * (n - 1) * kMxMaxGroup;
  if (c < 2) c = 2;
  if (c > budget - 1) c = budget - 1;
  return c;
}
// Send CTAs of nComm (the others land).
MK_HD inline int mxSendCtas(int nComm) {
  return nComm / 2 > 1 ? nComm / 2 : 1;
}

// The groups of a role's m CTAs: Q = min(n - 1, m) groups, group q taking the rounds t = 1 + q,
// 1 + q + Q, ... (gxSendPeer / gxRecvPeer), each of G = m / Q lanes that split every chunk of
// those streams by rows; lane 0 signals, acks and releases for the group. CTA i is lane i / Q of
// group i % Q; lanes past G idle. One CTA copying a stream's chunks out of (or into) host memory
// moved 1-4 GB/s on the H200, well below the socket backend.
struct MxGroup {
  int q, Q, g, G;
};
MK_HD inline MxGroup mxGroup(int i, int m, int n) {
  MxGroup r;
  r.Q = m < n - 1 ? m : n - 1;
  if (r.Q < 1) r.Q = 1;
  r.G = m / r.Q;
  r.q = i % r.Q;
  r.g = i / r.Q;
  return r;
}
// Rows [*r0, *r1) of a chunk of `rows` that lane g of G takes.
MK_HD inline void mxSlice(int64_t rows, int g, int G, int64_t* r0, int64_t* r1) {
  *r0 = rows * g / G;
  *r1 = rows * (g + 1) / G;
}

// Unpack CTAs beside nComm send and land CTAs: a quarter of the rest, at least one. They move
// every landed record (and this rank's own) into the packed layout, many CTAs wide as the
// AllToAll path's unpack kernel is (one CTA reading a 14 KB row per entry, one load in flight
// per lane, held the whole dispatch to ~1 GB/s on the H200), then join the GEMMs.
MK_HD inline int mxUnpackCtas(int budget, int nComm) {
  const int left = budget - nComm;
  if (left < 1) return 0;
  return left / 4 > 1 ? left / 4 : 1;
}

// The unpack units (source s, chunk j < cnt[s]) in the order every unpack CTA walks them:
// chunk-major, so that the first chunks of every source are unpacked first; unpack CTA idx of
// nUnpack takes every nUnpack-th unit. f(s, j) is called for its units, in that order.
#ifdef __CUDACC__
#pragma nv_exec_check_disable  // f is a device lambda in the kernel, a host one in the unit test
#endif
template <class F>
MK_HD inline void mxUnits(const int32_t* cnt, int n, int nUnpack, int idx, F&& f) {
  int32_t most = 0;
  for (int s = 0; s < n; ++s) most = cnt[s] > most ? cnt[s] : most;
  int64_t u = 0;
  for (int32_t j = 0; j < most; ++j)
    for (int s = 0; s < n; ++s) {
      if (j >= cnt[s]) continue;
      if (u % nUnpack == idx) f(s, (int64_t)j);
      ++u;
    }
}

// Records of chunk j of a part of `rows` records that fit an area of `cap` records (a source
// announcing more than the receiver's bound: the call reports it; nothing lands past the area).
MK_HD inline int64_t mxLandRows(int64_t rows, int32_t per, int64_t j, int64_t cap) {
  const int64_t r = mxChunkRows(rows, per, j), room = cap - j * per;
  return r < room ? (r > 0 ? r : 0) : (room > 0 ? room : 0);
}

}  // namespace fused
}  // namespace mk
