// The fused MoE kernel on a comm spanning (virtual) nodes (the xnode layout; stream layout and
// chunk arithmetic in moe_xnode.h, window slots, signal slots and values in
// fused/core/xnode_proto.h): ncclMoeDispatchGemm (kFfn false) and ncclMoeDispatchFfnCombine
// (kFfn true) as one persistent cooperative kernel per rank, after the AllToAll path's pack,
// rows and counts' AllToAll and a one-CTA layout kernel (xnode.cu), which leave on the device
// every pair's record and row counts, the packed layout (counts, offsets, the layout tables)
// and the tiles' padding rows counted.
//
// Comm CTAs [0, nComm): gxSendCtas(nComm, n) send, the others receive. Every transfer goes
// through the device communication API, every wait is bounded and abortable.
//  - Receive CTA k of nRecv: credits every source it serves; the own copier (rxOwnCopier)
//    unpacks this rank's own records (its block of the rows buffer, no transfer); then rounds
//    t = 1 + k, ...: source me - t, its dispatch chunks in order: wait for the data signal,
//    unpack each record (the token row into the packed row of every slot its metadata lists,
//    rowSource and rowWeight for the dispatch call, +1 on the row's tile counter), ack. Only
//    then (the layer) every round's return part: copy each return chunk into retRecv at its
//    pair rows, raise retReady[src] to the chunks in place, ack. The last receive CTA sends
//    kGxDone to every source.
//  - Send CTA i: rounds t = 1 + i, ...: destination me + t, its records in chunks (put_signal
//    into the destination's area of this rank once the ack frees the slot). Only then (the
//    layer) every round's return part: for each chunk of the rows the destination sent here,
//    wait (thread 0) for GEMM2's row-block counters of the packed rows they map to, stage the
//    rows of `out` (zeros when this rank's layout overflowed) in retSend and put them. Then
//    waits for each destination's kGxDone.
//  - Compute CTAs: the grouped GEMM (the layer: GEMM1 with the SwiGLU epilogue and GEMM2
//    through one ring, gemm_chain.cuh) on the dynamic schedule, each tile loaded once its
//    rows' counter reached kTileM; the layer's CTAs then combine: warps claim tokens, each
//    slot's row is read once it is in place (own slots: GEMM2's counter of the row block in
//    `out`; others: retReady of the owner), summed in slot order (combine_dev.cuh), so y is
//    bit for bit the AllToAll path's.
// Why it cannot wait in a cycle: receivers never wait for compute (the rows land in xRecv and
// retRecv, which hold everything), so every dispatch part completes whatever the GEMMs wait
// for; send and receive CTAs take every round's dispatch part before any round's return part,
// and the rounds pair sender me with receiver me + t on both sides (xnode_proto.h). Every
// rank's grid is at most its share of the GPU (cooperative launch), so the peers' kernels are
// resident beside this one.
// The last CTA records the call's errors (a bad expert id, another rank's maxRows, this rank's
// overflow: recorded earlier they would fail the waits its peers still need) and counts the
// call and the xnode call.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "device/net/devcomm.cuh"
#include "device/rt/wait.cuh"
#include "fused/core/fused_dev.cuh"
#include "fused/core/xnode_dev.cuh"
#include "fused/gemm/gemm_chain.cuh"
#include "fused/gemm/gemm_kernel.cuh"
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
  uint64_t* tileReady;   // [tiles] rows in place per 128-row tile (padding counted before)
  uint64_t* rowDone2;    // [tiles] GEMM2 tiles stored per row block (the layer)
  float* retSend;        // [n][P][H] return rows staged per destination (the layer)
  float* retRecv;        // [n][P][H] return rows received per owner (the layer)
  uint64_t* retReady;    // [n] return chunks in place per owner (the layer)
  const float* zeroRow;  // [retRows][H] zeros: what an overflowed layout returns
  // The node dedup (a.node.rail): fan records this rank forwards as a gateway, per local
  // index of the destination ([nLocal][P][recBytes], filled by the receive CTAs), and per fan
  // chunk the records written ([nLocal][fanChunks], zeroed before the kernel), which the send
  // CTAs wait for; dispDone counts the receive CTAs through every round's dispatch part (no fan
  // record comes after that).
  uint8_t* fanSend;
  uint64_t* fanChunk;
  uint64_t* dispDone;
  int32_t fanChunks;   // chunks of the largest fan part: ceil(P / dispRows)
  uint64_t* xcalls;    // this rank's xnode call counter (kGxSigSeq)
  uint32_t* recvDone;  // receive CTAs finished (gxReceiveEnd)
  int32_t* combClaim;  // tokens claimed by combine warps
  int32_t nComm;       // CTAs [0, nComm) communicate
  int32_t tilesN2;     // GEMM2's column tiles: a row block of out is complete at this count
  int32_t outType;     // gemm::DType of y (the layer)
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
};

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
  int4* to = reinterpret_cast<int4*>(static_cast<uint8_t*>(a.recv.xRecv) + packed * a.rowBytes);
  for (int64_t v = lane; v < a.rowBytes / 16; v += 32) to[v] = row[v];
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
    int4* to = reinterpret_cast<int4*>(out);
    for (int64_t v = lane; v < a.rowBytes / 16; v += 32) to[v] = row[v];
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

__device__ __forceinline__ void recvCta(const MoeXnParams& p, int32_t k, int32_t nRecv,
                                        uint64_t seq, const CommSh& sh) {
  namespace dn = dev::net;
  const NetDev& d = p.net;
  const A2aParams& a = p.a;
  const MxPlan& pl = p.plan;
  const int n = a.s.nRanks, me = a.f.rank, epr = a.s.expertsPerRank, st = a.stride;
  const int warps = blockDim.x >> 5;
  // This rank's layout overflowed: chunks are consumed, not unpacked (rail records are still
  // forwarded: the owners' layouts are theirs).
  const bool ovf = p.lay->ovf != 0;
  auto stream = [&](int src) {
    return mxReceiverStream(pl, a.node, a.sendCnt, a.recvCnt, epr, src, a.pairRows);
  };
  auto slotAt = [&](int src, int64_t j) {
    return reinterpret_cast<const uint8_t*>(
        dn::recv_ptr(d, src, gxSlotOff(pl.areaBytes, pl.chunkBytes, pl.slots, src, j)));
  };
  if (!gxCredit(d, me, n, k, nRecv, seq)) return;
  if (k == rxOwnCopier(nRecv, n) && !ovf) {
    const int64_t blk = a.sendCnt[me * st + moeCntBlk(epr)];
    for (int64_t r = threadIdx.x >> 5; r < blk; r += warps)
      unpackDirect(p, sh, me, record(p, me, r));
  }
  // Every round's dispatch part: direct records unpacked, rail records forwarded.
  for (int t = 1 + k; t < n; t += nRecv) {
    const int src = gxRecvPeer(me, t, n);
    const MxStream s = stream(src);
    const int32_t* c = a.recvCnt + src * st;
    const int32_t mode = c[moeCntMode(epr)];
    const bool rail = mode == kMoeRailBlock && moeCntRouteValid(a.node, c, src, epr, a.pairRows);
    for (int64_t j = 0; j < s.dispEnd; ++j) {
      if (!dn::wait_signal_from(d, kGxSigData + src, gxValue(seq, (uint32_t)j + 1), src)) return;
      const uint8_t* slot = slotAt(src, j);
      const int64_t rows = mxChunkRows(s.blk, pl.dispRows, j);
      for (int64_t r = threadIdx.x >> 5; r < rows; r += warps) {
        const uint8_t* rec = slot + r * pl.recBytes;
        if (rail) {
          forwardRail(p, sh, src, rec, ovf);
        } else if (mode == kMoeDirect && !ovf) {
          unpackDirect(p, sh, src, rec);
        }
      }
      __syncthreads();  // every warp has read the slot before it is acked
      if (!gxAckChunk(d, src, me, seq, j, pl.slots, s.total)) return;
    }
  }
  // No fan record of this CTA comes after this point (the send CTAs' fallback, waitFanChunk).
  __syncthreads();
  if (threadIdx.x == 0 && a.node.rail) {
    __threadfence();
    atomicAdd(reinterpret_cast<unsigned long long*>(p.dispDone), 1ull);
  }
  // Every round's fan part (the dedup: records a gateway of this node forwards).
  for (int t = 1 + k; t < n && a.node.rail; t += nRecv) {
    const int src = gxRecvPeer(me, t, n);
    const MxStream s = stream(src);
    for (int64_t j = s.dispEnd; j < s.fanEnd; ++j) {
      if (!dn::wait_signal_from(d, kGxSigData + src, gxValue(seq, (uint32_t)j + 1), src)) return;
      const uint8_t* slot = slotAt(src, j);
      const int64_t rows = mxChunkRows(s.fan, pl.dispRows, j - s.dispEnd);
      for (int64_t r = threadIdx.x >> 5; r < rows && !ovf; r += warps)
        unpackFan(p, sh, slot + r * pl.recBytes);
      __syncthreads();
      if (!gxAckChunk(d, src, me, seq, j, pl.slots, s.total)) return;
    }
  }
  // Every round's return part (the layer): each owner's rows for this rank's slots.
  for (int t = 1 + k; t < n && pl.retBytes > 0; t += nRecv) {
    const int src = gxRecvPeer(me, t, n);
    const MxStream s = stream(src);
    for (int64_t c = 0; c < mxChunks(s.ret, pl.retRows); ++c) {
      const int64_t j = s.fanEnd + c;
      if (!dn::wait_signal_from(d, kGxSigData + src, gxValue(seq, (uint32_t)j + 1), src)) return;
      float* to = p.retRecv + ((int64_t)src * a.pairRows + c * pl.retRows) * a.hidden;
      dn::detail::copy<dn::Block>(reinterpret_cast<char*>(to),
                                  reinterpret_cast<const char*>(slotAt(src, j)),
                                  (uint64_t)(mxChunkRows(s.ret, pl.retRows, c) * pl.retBytes));
      __threadfence();
      __syncthreads();  // stored by every thread (the combine acquires retReady) and slot read
      if (threadIdx.x == 0) rt::releaseFlag(p.retReady + src, (uint64_t)c + 1, false);
      if (!gxAckChunk(d, src, me, seq, j, pl.slots, s.total)) return;
    }
  }
  gxReceiveEnd(d, p.recvDone, nRecv, me, n, seq);
}

// Thread 0: GEMM2 has stored every column tile of the row blocks holding the packed rows of
// pair rows [pr0, pr0 + rows) of source src (consecutive pair rows of one expert are
// consecutive packed rows, so a block is waited for once per run).
__device__ __forceinline__ bool waitOutRows(const MoeXnParams& p, int src, int64_t pr0,
                                            int64_t rows, const int32_t* srcRow,
                                            const int32_t* recvTab) {
  int64_t last = -1;
  for (int64_t pr = pr0; pr < pr0 + rows; ++pr) {
    const int64_t packed = pairRowTarget(p.a, srcRow, recvTab, src, pr);
    if (packed < 0 || packed / gemm::kTileM == last) continue;
    last = packed / gemm::kTileM;
    if (!rt::waitGe(p.a.f.c.w, p.rowDone2 + last, (uint64_t)p.tilesN2,
                    site(p, p.a.f.rank, (int32_t)last, rt::kWaitFlag), rt::kScopeGpu))
      return false;
  }
  return true;
}

// Thread 0: fan chunk `ctr` holds its `rows` records, or every receive CTA (nRecv) is through
// its dispatch parts, after which no record comes: the counts were inconsistent (e.g. the
// ranks' maxRows differ, which the call reports; the owner then has overflowed and unpacks
// nothing), and the chunk is put as it is rather than left waiting until the timeout.
__device__ __forceinline__ bool waitFanChunk(const MoeXnParams& p, const uint64_t* ctr,
                                             uint64_t rows, int32_t nRecv,
                                             const rt::ErrSite& where) {
  rt::Spin spin(32);
  while (rt::ldAcquire(ctr, rt::kScopeGpu) < rows &&
         rt::ldAcquire(p.dispDone, rt::kScopeGpu) < (uint64_t)nRecv) {
    const uint32_t kind = spin.check(p.a.f.c.w);
    if (kind == rt::kErrNone) continue;
    spin.fail(p.a.f.c.w, kind, where, rows);
    return false;
  }
  return true;
}

__device__ __forceinline__ void sendCta(const MoeXnParams& p, int32_t i, int32_t nSend,
                                        uint64_t seq, const CommSh& sh) {
  const NetDev& d = p.net;
  const A2aParams& a = p.a;
  const MxPlan& pl = p.plan;
  const int n = a.s.nRanks, me = a.f.rank, epr = a.s.expertsPerRank;
  auto stream = [&](int dst) {
    return mxSenderStream(pl, a.node, a.sendCnt, a.recvCnt, epr, dst, a.pairRows);
  };
  // Every round's dispatch part: this rank's records for dst.
  for (int t = 1 + i; t < n; t += nSend) {
    const int dst = gxSendPeer(me, t, n);
    const MxStream s = stream(dst);
    uint64_t acked = 0;  // the highest ack value this CTA has waited for (this destination)
    for (int64_t j = 0; j < s.dispEnd; ++j) {
      const int64_t rows = mxChunkRows(s.blk, pl.dispRows, j);
      if (!gxPutChunk(d, record(p, dst, j * pl.dispRows), dst, me, seq, j, pl.slots, pl.areaBytes,
                      pl.chunkBytes, (uint64_t)(rows * pl.recBytes), &acked))
        return;
    }
  }
  // Every round's fan part (the dedup): the records this rank's receive CTAs forward to dst,
  // chunk by chunk once every record of the chunk is stored (they wait for no compute).
  const int32_t nRecv = p.nComm - nSend;
  for (int t = 1 + i; t < n && a.node.rail; t += nSend) {
    const int dst = gxSendPeer(me, t, n);
    const MxStream s = stream(dst);
    const int l = a.node.localOf[dst];
    uint64_t acked = 0;
    for (int64_t c = 0; c < s.fanEnd - s.dispEnd; ++c) {
      const int64_t rows = mxChunkRows(s.fan, pl.dispRows, c);
      int ok = 1;
      if (threadIdx.x == 0)
        ok = waitFanChunk(p, p.fanChunk + (int64_t)l * p.fanChunks + c, (uint64_t)rows, nRecv,
                          site(p, dst, (int32_t)c, rt::kWaitFlag))
                 ? 1
                 : 0;
      if (__syncthreads_and(threadIdx.x == 0 ? ok : 1) == 0) return;
      const uint8_t* from = p.fanSend + ((int64_t)l * a.pairRows + c * pl.dispRows) * pl.recBytes;
      if (!gxPutChunk(d, from, dst, me, seq, s.dispEnd + c, pl.slots, pl.areaBytes, pl.chunkBytes,
                      (uint64_t)(rows * pl.recBytes), &acked))
        return;
    }
  }
  const bool ovf = p.lay->ovf != 0;
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const int64_t vecs = a.hidden / 4;
  // Every round's return part (the layer): the rows dst sent here, once GEMM2 stored them.
  for (int t = 1 + i; t < n && pl.retBytes > 0; t += nSend) {
    const int dst = gxSendPeer(me, t, n);
    const MxStream s = stream(dst);
    uint64_t acked = 0;
    for (int64_t c = 0; c < mxChunks(s.ret, pl.retRows); ++c) {
      const int64_t pr0 = c * pl.retRows, cnt = mxChunkRows(s.ret, pl.retRows, c);
      int ok = 1;
      if (threadIdx.x == 0 && !ovf)
        ok = waitOutRows(p, dst, pr0, cnt, sh.srcRow, sh.recvTab) ? 1 : 0;
      if (__syncthreads_and(threadIdx.x == 0 ? ok : 1) == 0) return;
      // Overflowed: zeros for every row, as the AllToAll path returns (straight from the zero
      // chunk: dst's rows may exceed this rank's pair buffer when the ranks' maxRows differ).
      const float* from = p.zeroRow;
      if (!ovf) {
        float* stage = p.retSend + ((int64_t)dst * a.pairRows + pr0) * a.hidden;
        for (int64_t r = threadIdx.x >> 5; r < cnt; r += warps) {
          const int64_t packed = pairRowTarget(a, sh.srcRow, sh.recvTab, dst, pr0 + r);
          const float4* row =
              reinterpret_cast<const float4*>(packed < 0 ? p.zeroRow : a.out + packed * a.hidden);
          float4* to = reinterpret_cast<float4*>(stage + r * a.hidden);
          for (int64_t v = lane; v < vecs; v += 32) to[v] = row[v];
        }
        __threadfence();
        __syncthreads();  // the chunk staged by every thread before it is put
        from = stage;
      }
      if (!gxPutChunk(d, from, dst, me, seq, s.fanEnd + c, pl.slots, pl.areaBytes, pl.chunkBytes,
                      (uint64_t)(cnt * pl.retBytes), &acked))
        return;
    }
  }
  gxSendEnd(d, me, n, i, nSend, seq);
}

// The layer's combine for one warp and token t: lane j < topk finds slot j's row (own slots in
// `out` once GEMM2 stored its row block, others in retRecv once their chunk is in place). False
// once a wait failed: the warp stops.
template <typename O>
__device__ __forceinline__ bool combineToken(const MoeXnParams& p, int64_t t) {
  const A2aParams& a = p.a;
  const int lane = threadIdx.x & 31;
  const int topk = a.s.topk, epr = a.s.expertsPerRank, me = a.f.rank;
  const float* src = nullptr;
  float w = 0.f;
  bool ok = true;
  if (lane < topk) {
    const int64_t i = t * topk + lane;
    const int32_t pr = a.slotPos[i];
    if (pr >= 0) {
      const int owner = a.topkIdx[i] / epr;
      w = a.topkWeights[i];
      if (owner != me) {
        ok = rt::waitGe(a.f.c.w, p.retReady + owner, (uint64_t)mxRetChunkOf(pr, p.plan.retRows) + 1,
                        site(p, owner, pr, rt::kWaitData), rt::kScopeGpu, 32);
        src = p.retRecv + ((int64_t)owner * a.pairRows + pr) * a.hidden;
      } else if (p.lay->ovf != 0) {
        src = p.zeroRow;  // the AllToAll path returns zeros for every slot of an overflow
      } else {
        const int64_t packed = pairRowTarget(a, p.srcRow, p.recvTab, me, pr);
        if (packed >= 0) {
          ok = rt::waitGe(a.f.c.w, p.rowDone2 + packed / gemm::kTileM, (uint64_t)p.tilesN2,
                          site(p, me, (int32_t)(packed / gemm::kTileM), rt::kWaitFlag),
                          rt::kScopeGpu, 32);
          src = a.out + packed * a.hidden;
        }
      }
    }
  }
  if (!__all_sync(0xffffffffu, ok)) return false;
  __syncwarp();  // each lane's acquire before every lane's reads of its row
  moedev::combineToken<O>(src, w, topk, a.hidden, static_cast<O*>(a.y) + t * a.hidden);
  return true;
}

template <typename O>
__device__ void combine(const MoeXnParams& p) {
  moedev::claimTokens(p.combClaim, p.a.s.tokens, moedev::kCombineChunk,
                      [&](int64_t t) { return combineToken<O>(p, t); });
}

}  // namespace mxdev

template <class Tr1, class Tr2, bool kFfn>
__global__ void __launch_bounds__(gemm::kThreads, 1)
    moeXnodeKernel(const __grid_constant__ MoeXnParams p) {
  extern __shared__ uint8_t smem[];
  const A2aParams& a = p.a;
  __shared__ uint64_t seqSh, xseqSh;
  if (threadIdx.x == 0) {
    seqSh = callSeq(a.f);
    // The xnode call number: read before any CTA can finish (the last one advances it).
    xseqSh = ptx::ldVolatile64(p.xcalls) + 1;
  }
  __syncthreads();
  if ((int32_t)blockIdx.x < p.nComm) {
    // The comm CTAs' state in the shared memory the GEMM CTAs use for their ring (comm CTAs
    // run no GEMM): the layout tables, and with the dedup the fan caps per local index.
    const int tab = a.s.nRanks * a.s.expertsPerRank;
    int32_t* srcRow = reinterpret_cast<int32_t*>(smem);
    int32_t* recvTab = srcRow + tab;
    int32_t* fanLim = recvTab + tab;
    for (int i = threadIdx.x; i < tab; i += blockDim.x) {
      srcRow[i] = p.srcRow[i];
      recvTab[i] = p.recvTab[i];
    }
    const MoeNodeMap& m = a.node;
    for (int l = threadIdx.x; m.rail && l < m.nLocal; l += blockDim.x) {
      const int q = m.rankAt[m.nodeOf[m.me] * m.nLocal + l];
      const bool sameBound =
          a.recvCnt[q * a.stride + moeCntMax(a.s.expertsPerRank)] == (int32_t)a.pairRows;
      fanLim[l] =
          sameBound ? (int32_t)moeFanOut(m, a.recvCnt, a.s.expertsPerRank, l, a.pairRows) : 0;
    }
    __syncthreads();
    const mxdev::CommSh sh{srcRow, recvTab, fanLim};
    const int32_t nSend = gxSendCtas(p.nComm, a.s.nRanks);
    if ((int32_t)blockIdx.x < nSend) {
      mxdev::sendCta(p, blockIdx.x, nSend, xseqSh, sh);
    } else {
      mxdev::recvCta(p, blockIdx.x - nSend, p.nComm - nSend, xseqSh, sh);
    }
  } else if (!rt::failed(a.f.c.w)) {
    if constexpr (kFfn) {
      // Both GEMMs through one ring and one main loop, then every warp back at the launch's
      // registers for the combine.
      gemm::gemmChainCta<Tr1, Tr2>(p.g1, p.g2, smem);
      gemm::gemmCtaHandBack<Tr1>(smem);
      if (p.outType == (int32_t)gemm::DType::kBF16) {
        mxdev::combine<__nv_bfloat16>(p);
      } else if (p.outType == (int32_t)gemm::DType::kF16) {
        mxdev::combine<__half>(p);
      } else {
        mxdev::combine<float>(p);
      }
    } else {
      // The dynamic schedule (p.g1.tileClaim): `cta` and `nCtas` are not used.
      gemm::gemmCta<Tr1>(p.g1, smem, (int32_t)blockIdx.x, (int32_t)gridDim.x);
      // Every warpgroup back at the launch's registers: thread 0 may be the last CTA's, which
      // records the call's errors below (the producer's setmaxnreg budget is too small for it).
      gemm::gemmCtaHandBack<Tr1>(smem);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && rt::finishCta(a.f.c.w)) {
    if (!rt::failed(a.f.c.w)) a2aReportErrors(a, p.lay->ovf, p.lay->otherMax, p.lay->span);
    *(volatile uint64_t*)fusedCallCounter(a.f) = seqSh;
    *(volatile uint64_t*)p.xcalls = xseqSh;
    __threadfence_system();
  }
}

}  // namespace fused
}  // namespace mk
