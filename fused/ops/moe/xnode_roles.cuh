// The communication roles of the fused MoE kernel across (virtual) nodes: the kernel's
// parameters, the land, unpack and send CTAs and the helpers they share. The roles, how they
// split a chunk and why they cannot wait in a cycle: xnode_kernel.cuh, at the top.
#pragma once
#include <cstdint>

#include "device/net/devcomm.cuh"
#include "device/rt/wait.cuh"
#include "fused/core/fused_dev.cuh"
#include "fused/core/trace.h"
#include "fused/core/xnode_dev.cuh"
#include "fused/gemm/gemm.h"
#include "fused/gemm/primitives.cuh"
#include "fused/ops/moe/a2a.h"
#include "fused/ops/moe/combine_dev.cuh"
#include "fused/ops/moe/moe_xnode.h"

namespace mk {
namespace fused {

// What the layout kernel leaves for the fused kernel (and its error report).
struct MxLayout {
  int64_t span;      // rows the packed layout spans
  int32_t ovf;       // nothing is received (RecvLayout::ovf)
  int32_t otherMax;  // the first source whose maxRows differs (-1: none)
};

struct MoeXnParams {
  gemm::GemmParams g1;  // first: the tensor maps' 64-byte alignment
  gemm::GemmParams g2;  // the layer's GEMM2 (unused by the dispatch call)
  A2aParams a;          // shape, routing, counts; a.sendRows: the records [n][P][recBytes]
  NetDev net;           // the device API's view, with the operator's wait context
  MxPlan plan;
  const int32_t* srcRow;   // [n * epr] first packed row of each (source, local expert)
  const int32_t* recvTab;  // [n * epr] rows of each (source, local expert)
  const MxLayout* lay;
  uint64_t* tileReady;  // [tiles] rows in place per 128-row tile (padding counted before)
  uint64_t* rowDone2;   // [tiles] GEMM2 tiles stored per row block (the layer)
  // The layer's return rows, [n][P][H] in the input type (plan.retBytes a row: the experts'
  // outputs rounded as the combine takes them, combine_dev.cuh): staged per destination,
  // received per owner.
  uint8_t* retSend;
  uint8_t* retRecv;
  uint64_t* retReady;      // [n] return chunks in place per owner (the layer)
  const uint8_t* zeroRow;  // [retRows][retBytes] zeros: what an overflowed layout returns
  // The node dedup (a.node.rail): fan records this rank forwards as a gateway, per local
  // index of the destination ([nLocal][P][recBytes], filled by the receive CTAs), and per fan
  // chunk the records written ([nLocal][fanChunks], zeroed before the kernel), which the send
  // CTAs wait for; dispDone counts the unpack CTAs through every dispatch unit (no fan record
  // comes after that).
  uint8_t* fanSend;
  uint64_t* fanChunk;
  uint64_t* dispDone;
  int32_t fanChunks;   // chunks of the largest fan part: ceil(P / dispRows)
  uint64_t* xcalls;    // this rank's xnode call counter (kGxSigSeq)
  uint32_t* recvDone;  // land CTAs finished (gxReceiveEnd)
  int32_t* combClaim;  // tokens claimed by combine warps
  // Records landed per source ([n][landRows][recBytes]: the dispatch part's, then from
  // pairRows on the fan part's) and per source the chunks landed in stream order (zeroed per
  // call; the land CTAs release, the unpack CTAs acquire).
  uint8_t* landRec;
  uint64_t* landed;
  int32_t landRows;
  // Per peer and chunk slot ([n][slots], zeroed per call): the lanes of a send group through
  // their slice of a chunk (pushCnt) and of a land group (copyCnt), cumulative over the
  // chunks using the slot (mxGroup).
  uint64_t* pushCnt;
  uint64_t* copyCnt;
  int32_t nComm;    // CTAs [0, nComm) communicate
  int32_t nUnpack;  // CTAs [nComm, nComm + nUnpack) unpack, then compute
  // MKERNEL_FUSED_TRACE: [CTA][kTraceMaxWords] (mxdev::TraceWord), mapped host memory; null: off.
  uint64_t* trace;
  int32_t tilesN2;  // GEMM2's column tiles: a row block of out is complete at this count
  int32_t outType;  // gemm::DType of y (the layer)
};

// Kernel parameters beyond 4 KB need CUDA 12.1+; 32764 bytes is the limit there.
static_assert(sizeof(MoeXnParams) <= 32764, "MoeXnParams exceeds the kernel parameter limit");

namespace mxdev {

__device__ __forceinline__ rt::ErrSite site(const MoeXnParams& p, int peer, int32_t id, int kind) {
  return rt::ErrSite{p.a.f.c.w.op, peer, (int32_t)blockIdx.x, id, kind, 0};
}

// Record `rec` of this rank's block for dst (the rows kernel's output).
__device__ __forceinline__ const uint8_t* record(const MoeXnParams& p, int dst, int64_t rec) {
  return p.a.sendRows + ((int64_t)dst * p.a.pairRows + rec) * p.plan.recBytes;
}

// The comm CTAs' shared state: the layout tables (every unpacked row and return row looks its
// packed row up there) and, with the dedup, the fan records this rank may forward to each
// local index (moeFanOut's caps; mine included: the gateway's own slots count there too).
struct CommSh {
  const int32_t* srcRow;
  const int32_t* recvTab;
  const int32_t* fanLim;  // [nLocal]
  // The unpack CTAs' units per source: dispatch chunks (this rank's own block's for itself) and
  // fan chunks.
  const int32_t* dCnt;  // [n]
  const int32_t* fCnt;  // [n]
};

// MKERNEL_FUSED_TRACE words of a CTA (xnode.cu prints them per role): start; the dispatch
// parts done (send, land), every unit unpacked (unpack) or the GEMMs done (compute); the fan
// parts done (send, land) or the GEMMs done (unpack); the return parts done (send, land) or
// the combine done (unpack, compute); end; ns inside puts (send), waiting for data (land) or
// for landing (unpack); ns waiting for GEMM2's rows (send) or copying (land); bytes put
// (send), landed (land) or records unpacked (unpack).
enum TraceWord : int {
  kTwStart,
  kTwPart1,
  kTwPart2,
  kTwPart3,
  kTwEnd,
  kTwWait,
  kTwWait2,
  kTwBytes
};
static_assert(kTwBytes < kTraceMaxWords, "MoE trace words exceed a trace buffer");

__device__ __forceinline__ uint64_t traceNow(const MoeXnParams& p) {
  return p.trace != nullptr ? ptx::globalTimerNs() : 0;
}
// Thread 0 only: a stamp, or a sum.
__device__ __forceinline__ void traceSet(const MoeXnParams& p, int w, uint64_t v) {
  if (p.trace != nullptr && threadIdx.x == 0) p.trace[kTraceMaxWords * blockIdx.x + w] = v;
}
__device__ __forceinline__ void traceStamp(const MoeXnParams& p, int w) {
  traceSet(p, w, traceNow(p));
}
__device__ __forceinline__ void traceAdd(const MoeXnParams& p, int w, uint64_t v) {
  if (p.trace != nullptr && threadIdx.x == 0) p.trace[kTraceMaxWords * blockIdx.x + w] += v;
}

// The whole CTA: `bytes` (a multiple of 16, both ends 16-byte aligned) from a window slot into
// device memory with 8 loads in flight per thread. The socket backend's windows are host
// memory, ~1-2 us away: in-flight loads set the rate.
__device__ __forceinline__ void landCopy(void* dst, const void* src, uint64_t bytes) {
  constexpr int kDepth = 8;
  const int4* s4 = static_cast<const int4*>(src);
  int4* d4 = static_cast<int4*>(dst);
  const int64_t nv = (int64_t)(bytes / 16), nt = blockDim.x;
  int64_t i = threadIdx.x;
  for (; i + (kDepth - 1) * nt < nv; i += kDepth * nt) {
    int4 r[kDepth];
#pragma unroll
    for (int u = 0; u < kDepth; ++u) r[u] = s4[i + u * nt];
#pragma unroll
    for (int u = 0; u < kDepth; ++u) d4[i + u * nt] = r[u];
  }
  for (; i < nv; i += nt) d4[i] = s4[i];
}

// The whole warp: token row `row` of source src into the packed row of the entry (pair row
// pr at this rank, token, slot, weight bits), rowSource and rowWeight (the dispatch call),
// then +1 on that row's tile counter once the row is stored (the GEMM producer acquires the
// counter and reads the row with TMA).
__device__ __forceinline__ void unpackEntry(const MoeXnParams& p, const CommSh& sh, int src,
                                            int32_t pr, int32_t token, int32_t slot, int32_t wBits,
                                            const int4* row) {
  const A2aParams& a = p.a;
  const int lane = threadIdx.x & 31;
  const int64_t packed = pairRowTarget(a, sh.srcRow, sh.recvTab, src, pr);
  if (packed < 0) return;  // past src's rows (never for a consistent sender)
  // Four loads in flight per lane: the row is read once per entry (up to k times).
  dev::net::detail::copy<dev::net::Warp>(static_cast<char*>(a.recv.xRecv) + packed * a.rowBytes,
                                         reinterpret_cast<const char*>(row), (uint64_t)a.rowBytes);
  if (lane == 0) {
    if (a.recv.rowSource != nullptr) {
      a.recv.rowSource[packed * 3 + 0] = src;
      a.recv.rowSource[packed * 3 + 1] = token;
      a.recv.rowSource[packed * 3 + 2] = slot;
    }
    if (a.recv.rowWeight != nullptr) a.recv.rowWeight[packed] = __int_as_float(wBits);
  }
  __syncwarp();
  if (lane == 0) {
    __threadfence();
    atomicAdd(reinterpret_cast<unsigned long long*>(p.tileReady + packed / gemm::kTileM), 1ull);
  }
}

// A direct record of source src (its entries' slot fields are slots): one warp.
__device__ __forceinline__ void unpackDirect(const MoeXnParams& p, const CommSh& sh, int src,
                                             const uint8_t* rec) {
  const int4* meta = reinterpret_cast<const int4*>(rec + p.a.rowBytes);
  for (int m = 0; m < p.a.s.topk; ++m) {
    const int4 e = meta[m];
    if (e.x < 0) break;
    unpackEntry(p, sh, src, e.x, e.y, e.z, e.w, reinterpret_cast<const int4*>(rec));
  }
}

// A fan record from a gateway of this node (slot fields moeFanZ): the entries of the sources
// this rank is served through a gateway for, as the AllToAll path's unpack checks them.
__device__ __forceinline__ void unpackFan(const MoeXnParams& p, const CommSh& sh,
                                          const uint8_t* rec) {
  const A2aParams& a = p.a;
  const int4* meta = reinterpret_cast<const int4*>(rec + a.rowBytes);
  for (int m = 0; m < a.s.topk; ++m) {
    const int4 e = meta[m];
    if (e.x < 0) break;
    const int src = moeFanZSrc(e.z);
    if (src >= a.s.nRanks || moeFanZLocal(e.z) != a.node.localOf[a.node.me] ||
        a.recvCnt[src * a.stride + moeCntMode(a.s.expertsPerRank)] == kMoeDirect)
      continue;
    unpackEntry(p, sh, src, e.x, e.y, moeFanZSlot(e.z), e.w, reinterpret_cast<const int4*>(rec));
  }
}

// A rail record this rank received as the gateway of source src's tokens for its node (one
// warp, as the AllToAll path's forward kernel): one fan record per distinct owner with that
// owner's entries, in first-entry order, placed by an atomic per local index (a.fanCnt, whose
// totals the call's report compares with the announced sums); the owner's record lands in
// fanSend (its fan part) or, for this rank's own slots, straight in the packed layout (not
// when this rank's layout overflowed). Each stored fan record counts in its chunk's counter.
__device__ __forceinline__ void forwardRail(const MoeXnParams& p, const CommSh& sh, int src,
                                            const uint8_t* rec, bool ovf) {
  const A2aParams& a = p.a;
  const MoeNodeMap& m = a.node;
  const int lane = threadIdx.x & 31, k = a.s.topk, nl = m.nLocal;
  const uint32_t below = (1u << lane) - 1;
  const int4* row = reinterpret_cast<const int4*>(rec);
  const RailLanes rl = railLanes(reinterpret_cast<const int4*>(rec + a.rowBytes), k, nl);
  const int4 e = rl.e;
  const int loc = rl.loc;
  uint32_t leaders = rl.leaders;
  const int myNode = m.nodeOf[m.me];
  while (leaders != 0) {
    const int leader = __ffs(leaders) - 1;
    leaders &= leaders - 1;
    const int l = __shfl_sync(0xffffffffu, loc, leader);
    int32_t pos = 0;
    if (lane == leader) pos = atomicAdd(&a.fanCnt[l], 1);
    pos = __shfl_sync(0xffffffffu, pos, leader);
    if (pos >= sh.fanLim[l]) continue;  // the owner overflowed (sum over maxRows), or a bad count
    const int q = m.rankAt[myNode * nl + l];
    const bool mine = loc == l;
    uint32_t all = __ballot_sync(0xffffffffu, mine);
    if (q == m.me) {
      // This rank's own slots: each entry into the packed layout, one after another.
      while (all != 0 && !ovf) {
        const int j = __ffs(all) - 1;
        all &= all - 1;
        const int4 ej =
            make_int4(__shfl_sync(0xffffffffu, e.x, j), __shfl_sync(0xffffffffu, e.y, j),
                      __shfl_sync(0xffffffffu, e.z, j), __shfl_sync(0xffffffffu, e.w, j));
        unpackEntry(p, sh, src, ej.x, ej.y, moeFanZSlot(ej.z), ej.w, row);
      }
      continue;
    }
    uint8_t* out = p.fanSend + ((int64_t)l * a.pairRows + pos) * p.plan.recBytes;
    dev::net::detail::copy<dev::net::Warp>(
        reinterpret_cast<char*>(out), reinterpret_cast<const char*>(row), (uint64_t)a.rowBytes);
    int4* meta = reinterpret_cast<int4*>(out + a.rowBytes);
    if (mine) meta[__popc(all & below)] = e;
    if (lane >= __popc(all) && lane < k) meta[lane] = make_int4(-1, 0, 0, 0);
    __syncwarp();
    if (lane == 0) {
      __threadfence();  // the record before its count: the send CTA puts the chunk once full
      atomicAdd(reinterpret_cast<unsigned long long*>(p.fanChunk + (int64_t)l * p.fanChunks +
                                                      pos / p.plan.dispRows),
                1ull);
    }
  }
}

// The whole CTA, lane gr.g of a group, through its slice of chunk j (stores fenced at system
// scope: a local peer reads them once lane 0 signals): counted in ctr (the chunk slot's
// counter); lane 0 then waits until every lane of the group is through it (a lane can be at
// most `slots` chunks ahead: the next chunk in this slot needs lane 0's ack or signal). False
// once the wait failed.
__device__ __forceinline__ bool groupJoin(const MoeXnParams& p, uint64_t* ctr, int64_t j,
                                          const MxGroup& gr, int peer) {
  __threadfence_system();
  __syncthreads();
  int ok = 1;
  if (threadIdx.x == 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(ctr), 1ull);
    if (gr.g == 0)
      ok = rt::waitGe(p.a.f.c.w, ctr, (uint64_t)gr.G * (uint64_t)(j / p.plan.slots + 1),
                      site(p, peer, (int32_t)j, rt::kWaitFlag), rt::kScopeGpu, 64)
               ? 1
               : 0;
  }
  return __syncthreads_and(threadIdx.x == 0 ? ok : 1) != 0;
}

// Land CTA k of nLand (see the top of this file): lane g of group q (mxGroup).
__device__ __forceinline__ void landCta(const MoeXnParams& p, int32_t k, int32_t nLand,
                                        uint64_t seq) {
  namespace dn = dev::net;
  const NetDev& d = p.net;
  const A2aParams& a = p.a;
  const MxPlan& pl = p.plan;
  const int n = a.s.nRanks, me = a.f.rank, epr = a.s.expertsPerRank;
  const MxGroup gr = mxGroup(k, nLand, n);
  auto stream = [&](int src) {
    return mxReceiverStream(pl, a.node, a.sendCnt, a.recvCnt, epr, src, a.pairRows);
  };
  // Chunk j of src's stream (`rows` rows of rowBytes to land at `to`): wait, copy this lane's
  // slice; lane 0, once every lane copied, releases *flag = value and acks.
  auto land = [&](int src, const MxStream& s, int64_t j, uint8_t* to, int64_t rows,
                  int64_t rowBytes, uint64_t* flag, uint64_t value) -> bool {
    const uint64_t t0 = traceNow(p);
    if (!dn::wait_signal_from(d, kGxSigData + src, gxValue(seq, (uint32_t)j + 1), src))
      return false;
    const uint64_t t1 = traceNow(p);
    int64_t r0, r1;
    mxSlice(rows, gr.g, gr.G, &r0, &r1);
    const uint8_t* slot = reinterpret_cast<const uint8_t*>(
        dn::recv_ptr(d, src, gxSlotOff(pl.areaBytes, pl.chunkBytes, pl.slots, src, j)));
    landCopy(to + r0 * rowBytes, slot + r0 * rowBytes, (uint64_t)((r1 - r0) * rowBytes));
    __threadfence();
    __syncthreads();  // copied by every thread: its slice of the slot is read and in place
    if (gr.G > 1 && !groupJoin(p, p.copyCnt + (int64_t)src * pl.slots + j % pl.slots, j, gr, src))
      return false;
    traceAdd(p, kTwWait, t1 - t0);
    traceAdd(p, kTwWait2, traceNow(p) - t1);
    traceAdd(p, kTwBytes, (uint64_t)((r1 - r0) * rowBytes));
    if (gr.g != 0) return true;
    if (threadIdx.x == 0 && flag != nullptr) rt::releaseFlag(flag, value, false);
    return gxAckChunk(d, src, me, seq, j, pl.slots, s.total);
  };
  auto landRec = [&](int src, int64_t rec) {
    return p.landRec + ((int64_t)src * p.landRows + rec) * pl.recBytes;
  };
  if (gr.g < gr.G) {
    if (gr.g == 0 && !gxCredit(d, me, n, gr.q, gr.Q, seq)) return;
    // Every round's dispatch part, then every round's fan part (the dedup): records into
    // landRec, at most a.pairRows of each part.
    for (int part = 0; part < 2; ++part) {
      for (int t = 1 + gr.q; t < n && (part == 0 || a.node.rail); t += gr.Q) {
        const int src = gxRecvPeer(me, t, n);
        const MxStream s = stream(src);
        const int64_t first = part == 0 ? 0 : s.dispEnd, end = part == 0 ? s.dispEnd : s.fanEnd;
        const int64_t rows = part == 0 ? s.blk : s.fan;
        for (int64_t j = first; j < end; ++j) {
          const int64_t c = j - first;
          if (!land(src, s, j, landRec(src, (part == 0 ? 0 : a.pairRows) + c * pl.dispRows),
                    mxLandRows(rows, pl.dispRows, c, a.pairRows), pl.recBytes, p.landed + src,
                    (uint64_t)j + 1))
            return;
        }
      }
      traceStamp(p, part == 0 ? kTwPart1 : kTwPart2);
    }
    // Every round's return part (the layer): each owner's rows for this rank's slots.
    for (int t = 1 + gr.q; t < n && pl.retBytes > 0; t += gr.Q) {
      const int src = gxRecvPeer(me, t, n);
      const MxStream s = stream(src);
      for (int64_t c = 0; c < mxChunks(s.ret, pl.retRows); ++c) {
        uint8_t* to = p.retRecv + ((int64_t)src * a.pairRows + c * pl.retRows) * pl.retBytes;
        if (!land(src, s, s.fanEnd + c, to, mxChunkRows(s.ret, pl.retRows, c), pl.retBytes,
                  p.retReady + src, (uint64_t)c + 1))
          return;
      }
    }
    traceStamp(p, kTwPart3);
  }
  gxReceiveEnd(d, p.recvDone, nLand, me, n, seq);
}

// Unpack CTA idx of p.nUnpack (see the top of this file). False once a wait failed (the CTA
// then computes nothing).
__device__ __forceinline__ bool unpackCta(const MoeXnParams& p, int32_t idx, const CommSh& sh) {
  const A2aParams& a = p.a;
  const MxPlan& pl = p.plan;
  const int n = a.s.nRanks, me = a.f.rank, epr = a.s.expertsPerRank, st = a.stride;
  const int warps = blockDim.x >> 5;
  // This rank's layout overflowed: nothing is unpacked (rail records are still forwarded: the
  // owners' layouts are theirs).
  const bool ovf = p.lay->ovf != 0;
  bool ok = true;
  uint64_t records = 0;
  // Thread 0 waits until chunk `need` - 1 of src landed; the whole CTA learns the outcome.
  auto waitLanded = [&](int src, uint64_t need) -> bool {
    int good = 1;
    if (threadIdx.x == 0) {
      const uint64_t t0 = traceNow(p);
      good = rt::waitGe(a.f.c.w, p.landed + src, need, site(p, src, (int32_t)need, rt::kWaitData),
                        rt::kScopeGpu, 32)
                 ? 1
                 : 0;
      traceAdd(p, kTwWait, traceNow(p) - t0);
    }
    return __syncthreads_and(threadIdx.x == 0 ? good : 1) != 0;
  };
  mxUnits(sh.dCnt, n, p.nUnpack, idx, [&](int src, int64_t j) {
    if (!ok) return;
    const uint8_t* base;
    int64_t rows;
    bool rail = false, direct = true;
    if (src == me) {
      rows = mxChunkRows(a.sendCnt[me * st + moeCntBlk(epr)], pl.dispRows, j);
      base = record(p, me, j * pl.dispRows);
    } else {
      const int32_t* c = a.recvCnt + src * st;
      const int32_t mode = c[moeCntMode(epr)];
      rail = mode == kMoeRailBlock && moeCntRouteValid(a.node, c, src, epr, a.pairRows);
      direct = mode == kMoeDirect;
      rows = mxLandRows(c[moeCntBlk(epr)], pl.dispRows, j, a.pairRows);
      base = p.landRec + ((int64_t)src * p.landRows + j * pl.dispRows) * pl.recBytes;
      if (!waitLanded(src, (uint64_t)j + 1)) {
        ok = false;
        return;
      }
    }
    for (int64_t r = threadIdx.x >> 5; r < rows; r += warps) {
      const uint8_t* rec = base + r * pl.recBytes;
      if (rail) {
        forwardRail(p, sh, src, rec, ovf);
      } else if (direct && !ovf) {
        unpackDirect(p, sh, src, rec);
      }
    }
    records += (uint64_t)rows;
  });
  if (!ok) return false;
  // No fan record of this CTA comes after this point (the send CTAs' fallback, waitFanChunk).
  __syncthreads();
  if (threadIdx.x == 0 && a.node.rail) {
    __threadfence();
    atomicAdd(reinterpret_cast<unsigned long long*>(p.dispDone), 1ull);
  }
  // The fan parts' units (the dedup: records a gateway of this node forwards).
  if (a.node.rail)
    mxUnits(sh.fCnt, n, p.nUnpack, idx, [&](int src, int64_t c) {
      if (!ok) return;
      const MxStream s = mxReceiverStream(pl, a.node, a.sendCnt, a.recvCnt, epr, src, a.pairRows);
      if (!waitLanded(src, (uint64_t)(s.dispEnd + c) + 1)) {
        ok = false;
        return;
      }
      const int64_t rows = mxLandRows(s.fan, pl.dispRows, c, a.pairRows);
      const uint8_t* base =
          p.landRec + ((int64_t)src * p.landRows + a.pairRows + c * pl.dispRows) * pl.recBytes;
      for (int64_t r = threadIdx.x >> 5; r < rows && !ovf; r += warps)
        unpackFan(p, sh, base + r * pl.recBytes);
      records += (uint64_t)rows;
    });
  traceAdd(p, kTwBytes, records);
  traceStamp(p, kTwPart1);
  return ok;
}

// The whole CTA: GEMM2 has stored every column tile of the row blocks holding the packed rows
// of pair rows [pr0, pr0 + rows) of source src. Pair rows are expert-major as packed rows are,
// so a destination's return chunks become ready in order as GEMM2 runs. Each thread takes a
// contiguous run of the pair rows (consecutive pair rows of one expert are consecutive packed
// rows: a block is waited for once per run): one thread walking them all, a layout lookup
// and an acquire per row, held the send CTA for ~25 ms a call on the H200. False once a wait
// failed.
__device__ __forceinline__ bool waitOutRows(const MoeXnParams& p, int src, int64_t pr0,
                                            int64_t rows, const int32_t* srcRow,
                                            const int32_t* recvTab) {
  const int64_t per = (rows + blockDim.x - 1) / blockDim.x, first = pr0 + threadIdx.x * per;
  int64_t last = -1;
  bool ok = true;
  for (int64_t pr = first; ok && pr < first + per && pr < pr0 + rows; ++pr) {
    const int64_t packed = pairRowTarget(p.a, srcRow, recvTab, src, pr);
    if (packed < 0 || packed / gemm::kTileM == last) continue;
    last = packed / gemm::kTileM;
    ok = rt::waitGe(p.a.f.c.w, p.rowDone2 + last, (uint64_t)p.tilesN2,
                    site(p, p.a.f.rank, (int32_t)last, rt::kWaitFlag), rt::kScopeGpu, 256);
  }
  return __syncthreads_and(ok ? 1 : 0) != 0;
}

// Thread 0: fan chunk `ctr` holds its `rows` records, or every unpack CTA (nUnpack) is through
// its dispatch units, after which no record comes: the counts were inconsistent (e.g. the
// ranks' maxRows differ, which the call reports; the owner then has overflowed and unpacks
// nothing), and the chunk is put as it is rather than left waiting until the timeout.
__device__ __forceinline__ bool waitFanChunk(const MoeXnParams& p, const uint64_t* ctr,
                                             uint64_t rows, int32_t nUnpack,
                                             const rt::ErrSite& where) {
  rt::Spin spin(32);
  while (rt::ldAcquire(ctr, rt::kScopeGpu) < rows &&
         rt::ldAcquire(p.dispDone, rt::kScopeGpu) < (uint64_t)nUnpack) {
    const uint32_t kind = spin.check(p.a.f.c.w);
    if (kind == rt::kErrNone) continue;
    spin.fail(p.a.f.c.w, kind, where, rows);
    return false;
  }
  return true;
}

// Send CTA i of nSend: lane g of group q (mxGroup). In: the layer's input type (its return
// rows).
template <typename In>
__device__ __forceinline__ void sendCta(const MoeXnParams& p, int32_t i, int32_t nSend,
                                        uint64_t seq, const CommSh& sh) {
  namespace dn = dev::net;
  const NetDev& d = p.net;
  const A2aParams& a = p.a;
  const MxPlan& pl = p.plan;
  const int n = a.s.nRanks, me = a.f.rank, epr = a.s.expertsPerRank;
  const MxGroup gr = mxGroup(i, nSend, n);
  if (gr.g >= gr.G) return;
  auto stream = [&](int dst) {
    return mxSenderStream(pl, a.node, a.sendCnt, a.recvCnt, epr, dst, a.pairRows);
  };
  // Chunk j of the stream to dst, `rows` rows of rowBytes from `from`, once dst's ack frees
  // its slot (*acked: the highest ack this lane waited for from dst): this lane's slice, then
  // lane 0, once every lane's slice is on its way, signals (after every earlier put of this
  // rank to dst: the proxy's ring order, or the lanes' fences for a local peer).
  auto put = [&](const uint8_t* from, int dst, int64_t j, int64_t rows, int64_t rowBytes,
                 uint64_t* acked) -> bool {
    const uint64_t t0 = traceNow(p);
    if (!gxSlotFree(d, dst, seq, j, pl.slots, acked)) return false;
    const uint64_t off = gxSlotOff(pl.areaBytes, pl.chunkBytes, pl.slots, me, j);
    const uint64_t value = gxValue(seq, (uint32_t)j + 1);
    int64_t r0, r1;
    mxSlice(rows, gr.g, gr.G, &r0, &r1);
    bool ok;
    if (gr.G == 1) {
      ok = dn::put_signal(d, from, dst, off, (uint64_t)(rows * rowBytes), kGxSigData + me, value);
    } else {
      ok = r1 <= r0 || dn::put(d, from + r0 * rowBytes, dst, off + r0 * rowBytes,
                               (uint64_t)((r1 - r0) * rowBytes));
      ok = ok && groupJoin(p, p.pushCnt + (int64_t)dst * pl.slots + j % pl.slots, j, gr, dst);
      if (ok && gr.g == 0) ok = dn::signal(d, dst, kGxSigData + me, value);
    }
    traceAdd(p, kTwWait, traceNow(p) - t0);
    traceAdd(p, kTwBytes, (uint64_t)((r1 - r0) * rowBytes));
    return ok;
  };
  // Every round's dispatch part: this rank's records for dst.
  for (int t = 1 + gr.q; t < n; t += gr.Q) {
    const int dst = gxSendPeer(me, t, n);
    const MxStream s = stream(dst);
    uint64_t acked = 0;
    for (int64_t j = 0; j < s.dispEnd; ++j)
      if (!put(record(p, dst, j * pl.dispRows), dst, j, mxChunkRows(s.blk, pl.dispRows, j),
               pl.recBytes, &acked))
        return;
  }
  traceStamp(p, kTwPart1);
  // Every round's fan part (the dedup): the records this rank's unpack CTAs forward to dst,
  // chunk by chunk once every record of the chunk is stored (they wait for no compute).
  for (int t = 1 + gr.q; t < n && a.node.rail; t += gr.Q) {
    const int dst = gxSendPeer(me, t, n);
    const MxStream s = stream(dst);
    const int l = a.node.localOf[dst];
    uint64_t acked = 0;
    for (int64_t c = 0; c < s.fanEnd - s.dispEnd; ++c) {
      const int64_t rows = mxChunkRows(s.fan, pl.dispRows, c);
      int ok = 1;
      if (threadIdx.x == 0)
        ok = waitFanChunk(p, p.fanChunk + (int64_t)l * p.fanChunks + c, (uint64_t)rows, p.nUnpack,
                          site(p, dst, (int32_t)c, rt::kWaitFlag))
                 ? 1
                 : 0;
      if (__syncthreads_and(threadIdx.x == 0 ? ok : 1) == 0) return;
      const uint8_t* from = p.fanSend + ((int64_t)l * a.pairRows + c * pl.dispRows) * pl.recBytes;
      if (!put(from, dst, s.dispEnd + c, rows, pl.recBytes, &acked)) return;
    }
  }
  traceStamp(p, kTwPart2);
  const bool ovf = p.lay->ovf != 0;
  const int warps = blockDim.x >> 5;
  // Every round's return part (the layer): the rows dst sent here, once GEMM2 stored them.
  for (int t = 1 + gr.q; t < n && pl.retBytes > 0; t += gr.Q) {
    const int dst = gxSendPeer(me, t, n);
    const MxStream s = stream(dst);
    uint64_t acked = 0;
    for (int64_t c = 0; c < mxChunks(s.ret, pl.retRows); ++c) {
      const int64_t pr0 = c * pl.retRows, cnt = mxChunkRows(s.ret, pl.retRows, c);
      // Overflowed: zeros for every row, as the AllToAll path returns (straight from the zero
      // chunk: dst's rows may exceed this rank's pair buffer when the ranks' maxRows differ).
      const uint8_t* from = p.zeroRow;
      if (!ovf) {
        // This lane's slice of the chunk's rows, once GEMM2 stored them, staged from `out`
        // rounded to In.
        uint8_t* stage = p.retSend + ((int64_t)dst * a.pairRows + pr0) * pl.retBytes;
        int64_t r0, r1;
        mxSlice(cnt, gr.g, gr.G, &r0, &r1);
        const uint64_t t0 = traceNow(p);
        if (!waitOutRows(p, dst, pr0 + r0, r1 - r0, sh.srcRow, sh.recvTab)) return;
        traceAdd(p, kTwWait2, traceNow(p) - t0);
        for (int64_t r = r0 + (threadIdx.x >> 5); r < r1; r += warps) {
          const int64_t packed = pairRowTarget(a, sh.srcRow, sh.recvTab, dst, pr0 + r);
          if (packed < 0)
            dn::detail::copy<dn::Warp>(reinterpret_cast<char*>(stage + r * pl.retBytes),
                                       reinterpret_cast<const char*>(p.zeroRow),
                                       (uint64_t)pl.retBytes);
          else
            moedev::roundRow<In>(stage + r * pl.retBytes, a.out + packed * a.hidden, a.hidden);
        }
        __threadfence();
        __syncthreads();  // the slice staged by every thread before it is put
        from = stage;
      }
      if (!put(from, dst, s.fanEnd + c, cnt, pl.retBytes, &acked)) return;
    }
  }
  traceStamp(p, kTwPart3);
  gxSendEnd(d, me, n, gr.q, gr.Q, seq);
}

}  // namespace mxdev
}  // namespace fused
}  // namespace mk
