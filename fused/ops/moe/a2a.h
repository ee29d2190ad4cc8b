// Shared by the MoE AllToAll path's kernels (a2a.cu, a2a_node.cu): their parameters, the
// count message's entries and the receiving layout every kernel derives from the received
// counts. Device code and kernel parameters only; moeA2aRun (a2a.cu) fills and launches.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "device/rt/wait.cuh"
#include "fused/core/fused_comm.h"
#include "fused/gemm/gemm.h"
#include "fused/ops/moe/moe.h"
#include "fused/ops/moe/moe_layout.h"
#include "fused/ops/moe/moe_node.h"

namespace mk {
namespace fused {

constexpr int kA2aThreads = 256;
constexpr int kA2aWarps = kA2aThreads / 32;
constexpr int kA2aMaxLocalExperts = gemm::kMaxGroups;
static_assert(NCCL_MOE_MAX_TOPK <= 32, "the rows kernel gives each slot of a token a lane");
// ErrRecord::slot of the "maxRows differs" record (err_host.cc names the peer and both bounds).
constexpr int32_t kSlotMaxRows = -2;

// ErrRecord::slot of the "fan-out rows differ" record (an internal error of the node dedup).
constexpr int32_t kSlotFanRows = -3;

struct A2aParams {
  FusedComm f;  // error record (rt::recordError) of the comm
  const uint8_t* x;
  const int32_t* topkIdx;
  const float* topkWeights;
  ncclMoeRecv_t recv;
  int32_t* slotPos;  // [T*k] row of the slot in its destination's pair layout, -1: not sent
  // [T*k] the token row of the slot's token in its destination's pair buffer, set on the
  // token's first slot for that destination only (-1 elsewhere)
  int32_t* slotTok;
  // [n][stride] count messages (moe_node.h's entries): rows per local expert, ovf (1 = the
  // pair overflowed), the sender's maxRows (pair buffers are maxRows rows: every rank must pass
  // the same), rows (slots the pair carries, 0 on overflow: sizes the return AllToAll on the
  // device), toks (distinct tokens of the pair), blk (token rows the block carries: sizes the
  // row and metadata AllToAlls), mode, and in rail blocks the fan-out per local index
  int32_t* sendCnt;
  const int32_t* recvCnt;
  unsigned long long* badSlot;  // first bad slot + 1 (~0: none)
  uint8_t* sendRows;            // [n][P][rowBytes] token rows, per block
  // recBytes > 0 (the fused kernel across nodes, moe_xnode.h): sendRows holds records
  // [n][P][recBytes], each a token row followed by its k metadata entries (sendMeta unused)
  int64_t recBytes;
  const uint8_t* recvRows;
  // [n][P][k] per token row: (pair row, token, slot, weight bits) of each of its slots on that
  // block in slot order, then pair row -1; the slot field is moeFanZ(slot, owner's local index,
  // source) for a pair served through a gateway
  int4* sendMeta;
  const int4* recvMeta;
  // [n][P][H] in the input type (ffn): the experts' outputs rounded as the combine takes them
  // (combine_dev.cuh), half the bytes of fp32 on the way back
  void* retSend;
  const void* retRecv;
  const float* out;  // [maxRows, H] fp32: the experts' outputs (ffn)
  void* y;           // [T, H] outType (ffn)
  int64_t rowBytes, pairRows, hidden;
  int32_t report;  // this kernel records the call's errors (the last one of the call)
  int32_t stride;  // ints per pair of the count messages (moeCntStride)
  MoeShape s;
  // Node dedup (node.rail != 0, MKERNEL_MOE_NODE_DEDUP=1; a2a_node.cu): the gateway forwards
  // the rail blocks it received to their owners on its node through the fan AllToAll.
  int32_t* fanCnt;       // [kMoeNodeMaxLocal] rows forwarded per local index (atomics; 0 by pack)
  int32_t* fanUnits;     // [3][n]: rows sent to / received from each rank, forward sums unclamped
  uint8_t* fanSendRows;  // [n][P][rowBytes]
  const uint8_t* fanRecvRows;
  int4* fanSendMeta;  // [n][P][k], entries as sendMeta's (z = moeFanZ)
  const int4* fanRecvMeta;
  MoeNodeMap node;
};

// The block (rank of the rows AllToAll) carrying this rank's tokens for dst, from the modes of
// the count message (pack has written them).
__device__ __forceinline__ int a2aBlockOf(const A2aParams& p, int dst) {
  const int32_t mode = p.sendCnt[dst * p.stride + moeCntMode(p.s.expertsPerRank)];
  return mode == kMoeDirect ? dst : moeRailPeer(p.node, p.node.nodeOf[dst]);
}

__device__ __forceinline__ rt::ErrSite a2aSite(const A2aParams& p) {
  return rt::ErrSite{p.f.c.w.op, -1, (int32_t)blockIdx.x, -1, rt::kWaitNone, 0};
}

// The receiving layout from the received counts (every CTA derives it): start/count per local
// expert, the first packed row of each source's rows of each expert, and the overflow verdict.
struct RecvLayout {
  int32_t start[kA2aMaxLocalExperts + 1];
  int32_t count[kA2aMaxLocalExperts];
  int64_t span;
  int ovf;       // nothing is received: an overflow, or a sender's maxRows differs
  int otherMax;  // the first source whose maxRows differs from this rank's (-1: none)
};

// recvCnt is set to -1 before the counts' AllToAll: a message that never arrived (the comm
// failed on the way) reads as invalid, and the rank then receives nothing rather than laying
// out leftover memory.
__device__ inline void recvLayout(const A2aParams& p, RecvLayout& L, int32_t* srcRow,
                                  int32_t* recv) {
  const MoeShape& s = p.s;
  const int n = s.nRanks, epr = s.expertsPerRank;
  if (threadIdx.x == 0) {
    int ovf = 0, invalid = 0;
    L.otherMax = -1;
    for (int src = 0; src < n; ++src) {
      const int32_t* m = p.recvCnt + src * p.stride;
      invalid |= m[epr] != 0 && m[epr] != 1;
      ovf |= m[epr] == 1;
      if (L.otherMax < 0 && !invalid && m[moeCntMax(epr)] != (int32_t)p.pairRows) L.otherMax = src;
      int64_t rows = 0;
      for (int le = 0; le < epr; ++le) {
        invalid |= m[le] < 0;
        recv[src * epr + le] = m[le] < 0 ? 0 : m[le];
        rows += m[le];
      }
      // The sized AllToAlls moved m[blk] token rows here (or the gateway forwards m[toks]) and
      // move m[rows] rows back: a layout of more would read what never came.
      const int32_t toks = m[moeCntToks(epr)];
      invalid |= m[epr] == 0 && m[moeCntRows(epr)] != rows;
      invalid |= m[epr] == 0 && (toks < (rows > 0 ? 1 : 0) || toks > rows);
      // Bounded by the larger of both bounds: a sender with a larger maxRows is reported as
      // that (otherMax), not as a broken message.
      const int64_t bound = max((int64_t)m[moeCntMax(epr)], (int64_t)p.pairRows);
      invalid |= !moeCntRouteValid(p.node, m, src, epr, bound);
    }
    L.span = moeRecvLayout(s, recv, NCCL_MOE_ROW_ALIGN, L.start, L.count, srcRow);
    L.start[epr] = (int32_t)L.span;
    if (invalid) L.otherMax = -1;  // the comm has failed already: that error stands
    L.ovf = invalid || ovf || L.span > (int64_t)p.recv.maxRows || L.otherMax >= 0;
  }
  __syncthreads();
}

// The local expert of row pr of source src's pair buffer (its rows are laid out expert after
// expert, by the received counts, `recv` in shared memory) and the packed row it maps to; -1
// past src's rows.
__device__ __forceinline__ int64_t pairRowTarget(const A2aParams& p, const int32_t* srcRow,
                                                 const int32_t* recv, int src, int64_t pr) {
  const int epr = p.s.expertsPerRank;
  int64_t off = 0;
  for (int le = 0; le < epr; ++le) {
    const int32_t c = recv[src * epr + le];
    if (pr < off + c) return srcRow[src * epr + le] + (pr - off);
    off += c;
  }
  return -1;
}

// One warp's view of a rail row's metadata (the node dedup; lane j holds entry j, k <= 32,
// the entries end at the first pair row -1): each lane's owner, as a local index of the
// gateway's node (lanes without a valid entry get -1 - lane, which matches nobody), and the
// lanes that lead a distinct owner, in first-entry order. Called by the whole warp.
struct RailLanes {
  int4 e;
  int loc;
  uint32_t leaders;
};
__device__ __forceinline__ RailLanes railLanes(const int4* meta, int k, int nLocal) {
  const int lane = threadIdx.x & 31;
  RailLanes r;
  r.e = lane < k ? meta[lane] : make_int4(-1, 0, 0, 0);
  const uint32_t ends = __ballot_sync(0xffffffffu, r.e.x < 0);
  const int entries = ends ? __ffs(ends) - 1 : 32;
  const bool valid = lane < entries && moeFanZLocal(r.e.z) < nLocal;
  r.loc = valid ? moeFanZLocal(r.e.z) : -1 - lane;
  const uint32_t same = __match_any_sync(0xffffffffu, r.loc);
  r.leaders = __ballot_sync(0xffffffffu, valid && (same & ((1u << lane) - 1)) == 0);
  return r;
}

// The call's errors, first recorded first (what the comm reports): a bad expert id of this
// rank's routing, a peer's maxRows that differs from this rank's (otherMax >= 0), this rank's
// overflow (ovf: its layout spans `span` rows), and (node dedup) rows this rank forwarded as a
// gateway that differ from its fan-out sums. One thread of the call's last kernel (or CTA).
__device__ inline void a2aReportErrors(const A2aParams& p, int ovf, int otherMax, int64_t span) {
  const unsigned long long bad = *(volatile unsigned long long*)p.badSlot;
  if (bad != ~0ull)
    rt::recordError(p.f.c.w, rt::kErrArgs, a2aSite(p), bad - 1,
                    (uint64_t)(uint32_t)p.topkIdx[bad - 1]);
  const int epr = p.s.expertsPerRank;
  if (otherMax >= 0) {
    const int32_t theirs = p.recvCnt[otherMax * p.stride + moeCntMax(epr)];
    rt::recordError(
        p.f.c.w, rt::kErrArgs,
        rt::ErrSite{p.f.c.w.op, otherMax, (int32_t)blockIdx.x, kSlotMaxRows, rt::kWaitNone, 0},
        (uint64_t)(uint32_t)theirs, (uint64_t)p.recv.maxRows);
  } else if (ovf) {
    rt::recordError(p.f.c.w, rt::kErrOverflow, a2aSite(p), (uint64_t)span,
                    (uint64_t)p.recv.maxRows);
  }
  if (p.node.rail) {
    const MoeNodeMap& m = p.node;
    for (int l = 0; l < m.nLocal; ++l) {
      const int q = m.rankAt[m.nodeOf[m.me] * m.nLocal + l];
      const int32_t sent = p.fanCnt[l], announced = p.fanUnits[2 * m.nRanks + q];
      if (sent != announced) {
        rt::recordError(
            p.f.c.w, rt::kErrProtocol,
            rt::ErrSite{p.f.c.w.op, q, (int32_t)blockIdx.x, kSlotFanRows, rt::kWaitNone, 0},
            (uint64_t)(uint32_t)sent, (uint64_t)(uint32_t)announced);
        break;
      }
    }
  }
}

// Host: the parameters every kernel of the path shares (comm view, routing, shape, counts'
// stride; the node tables, with the dedup where MKERNEL_MOE_NODE_DEDUP and the comm's nodes
// allow it, else every pair direct). Buffers are the caller's.
ncclResult_t moeA2aParams(const MoeCall& c, A2aParams* p);
// Host: the path's first steps on c.stream: badSlot reset, pack, rows (records when
// p.recBytes > 0), then the counts' AllToAll into p.recvCnt (set to -1 first). `grid`: the
// rows kernel's CTAs. moeA2aFrontPreload loads their kernels.
ncclResult_t moeA2aFront(const MoeCall& c, const A2aParams& p, int grid);
ncclResult_t moeA2aFrontPreload();
// Host: dynamic shared memory of the pack kernel, and of the kernels that derive the layout
// (recvLayout's srcRow and recv tables).
size_t moeA2aPackSmem(const MoeCall& c, const A2aParams& p);
size_t moeA2aLayoutSmem(const A2aParams& p);

// The node dedup's forward kernel (a2a_node.cu), launched after the rows and metadata
// AllToAlls, before the fan AllToAlls; its preload (cudaFuncGetAttributes).
ncclResult_t moeA2aForward(const A2aParams& p, int grid, cudaStream_t stream);
ncclResult_t moeA2aNodePreload();

}  // namespace fused
}  // namespace mk
