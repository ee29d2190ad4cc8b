// The fused MoE kernel on a comm spanning (virtual) nodes (the xnode layout; stream layout and
// chunk arithmetic in moe_xnode.h, window slots, signal slots and values in
// fused/core/xnode_proto.h): ncclMoeDispatchGemm (kFfn false) and ncclMoeDispatchFfnCombine
// (kFfn true) as one persistent cooperative kernel per rank, after the AllToAll path's pack,
// rows and counts' AllToAll and a one-CTA layout kernel (xnode.cu), which leave on the device
// every pair's record and row counts, the packed layout (counts, offsets, the layout tables)
// and the tiles' padding rows counted.
//
// CTAs [0, nComm) communicate: mxSendCtas(nComm) send, the others land; the next nUnpack
// CTAs unpack, then join the GEMMs; the rest compute. Every transfer goes through the device
// communication API, every wait is bounded and abortable. Send and land CTAs work in groups
// (mxGroup): group q of Q takes the rounds t = 1 + q, 1 + q + Q, ..., its G lanes split every
// chunk of those streams by rows; lane 0 signals, acks and releases once every lane is through
// its slice (groupJoin).
//  - Land CTAs: lane 0 credits the group's sources, then rounds t: source me - t, its dispatch
//    chunks in order: wait for the data signal, copy the lane's slice of the chunk from the
//    window into landRec (device memory, many loads in flight: the socket backend's window is
//    host memory); lane 0 releases landed[src] = chunks landed and acks. Then every round's fan
//    part the same way (the dedup), then (the layer) every round's return part: each return
//    chunk into retRecv at its pair rows, retReady[src] raised to the chunks in place, ack.
//    The last land CTA sends kGxDone to every source.
//  - Unpack CTAs: the units (source, chunk) of every dispatch part, this rank's own records
//    included (its block of the rows buffer, nothing to land), chunk-major (mxUnits), each
//    once landed[src] covers it: each record's token row into the packed row of every slot its
//    metadata lists (rowSource and rowWeight for the dispatch call, +1 on the row's tile
//    counter), or, as a gateway (the dedup), split per owner into fanSend. Then the fan parts'
//    units. Then they join the GEMMs (the dynamic schedule claims tiles, whoever asks).
//  - Send CTAs: rounds t: destination me + t, its records in chunks (each lane puts its slice
//    into the destination's area of this rank once the ack frees the slot; lane 0 signals).
//    Then every round's fan part, each chunk once its records are stored. Only then (the
//    layer) every round's return part: once GEMM2 stored the row blocks of every row the
//    destination sent here, each chunk: the lane's slice of rows of `out` (zeros when this
//    rank's layout overflowed) rounded to the input type into retSend (what the combine takes
//    of it: half the bytes of fp32) and put. Then waits for each destination's
//    kGxDone.
//  - Compute CTAs: the grouped GEMM (the layer: GEMM1 with the SwiGLU epilogue and GEMM2
//    through one ring, gemm_chain.cuh) on the dynamic schedule, each tile loaded once its
//    rows' counter reached kTileM; the layer's CTAs then combine: warps claim tokens, each
//    slot's row is read once it is in place (own slots: GEMM2's counter of the row block in
//    `out`; others: retReady of the owner), summed in slot order (combine_dev.cuh), so y is
//    bit for bit the AllToAll path's.
// Why it cannot wait in a cycle: land CTAs wait only for data (never for unpacking or
// compute: landRec and retRecv hold everything), so every part lands whatever else waits;
// unpack CTAs wait only for landing, and take every dispatch unit before any fan unit (a fan
// chunk waits for gateways' unpacking of dispatch units, never the other way round); send and
// land CTAs take every round's dispatch part before any fan part and every fan part before any
// return part, and the rounds pair sender me with receiver me + t on both sides
// (xnode_proto.h). Every rank's grid is at most its share of the GPU (cooperative launch), so
// the peers' kernels are resident beside this one.
// The last CTA records the call's errors (a bad expert id, another rank's maxRows, this rank's
// overflow: recorded earlier they would fail the waits its peers still need) and counts the
// call and the xnode call.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fused/gemm/gemm_chain.cuh"
#include "fused/gemm/gemm_kernel.cuh"
#include "fused/ops/moe/combine_dev.cuh"
#include "fused/ops/moe/xnode_roles.cuh"

namespace mk {
namespace fused {
namespace mxdev {

// The layer's combine for one warp and token t: lane j < topk finds slot j's row (own slots in
// `out` once GEMM2 stored its row block, others in retRecv once their chunk is in place). False
// once a wait failed: the warp stops.
template <typename O, typename In>
__device__ __forceinline__ bool combineToken(const MoeXnParams& p, int64_t t) {
  const A2aParams& a = p.a;
  const int lane = threadIdx.x & 31;
  const int topk = a.s.topk, epr = a.s.expertsPerRank, me = a.f.rank;
  const void* src = nullptr;
  bool inRow = false;  // src holds In elements (a returned row), else GEMM2's fp32
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
        src = p.retRecv + ((int64_t)owner * a.pairRows + pr) * p.plan.retBytes;
        inRow = true;
      } else if (p.lay->ovf != 0) {
        src = p.zeroRow;  // the AllToAll path returns zeros for every slot of an overflow
        inRow = true;
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
  moedev::combineToken<O, In>(src, inRow, w, topk, a.hidden, static_cast<O*>(a.y) + t * a.hidden);
  return true;
}

template <typename O, typename In>
__device__ void combine(const MoeXnParams& p) {
  // Thread 0 first waits, sleeping 1 us between polls, until every owner's return rows are in
  // place: thousands of lanes polling the same retReady words while the return part streamed
  // in (one word per owner, one L2 slice) slowed the land and send CTAs' copies several times
  // over on the H200. The combine then finds every row at once.
  const A2aParams& a = p.a;
  int ok = 1;
  if (threadIdx.x == 0)
    for (int o = 0; o < a.s.nRanks && ok; ++o) {
      if (o == a.f.rank) continue;
      const MxStream s =
          mxReceiverStream(p.plan, a.node, a.sendCnt, a.recvCnt, a.s.expertsPerRank, o, a.pairRows);
      const int64_t chunks = mxChunks(s.ret, p.plan.retRows);
      if (chunks > 0)
        ok = rt::waitGe(a.f.c.w, p.retReady + o, (uint64_t)chunks,
                        site(p, o, (int32_t)chunks, rt::kWaitData), rt::kScopeGpu, 1000)
                 ? 1
                 : 0;
    }
  if (__syncthreads_and(threadIdx.x == 0 ? ok : 1) == 0) return;
  moedev::claimTokens(p.combClaim, p.a.s.tokens, moedev::kCombineChunk,
                      [&](int64_t t) { return combineToken<O, In>(p, t); });
}

// The send and unpack CTAs' state in the shared memory the GEMMs use for their ring (an unpack
// CTA's GEMM starts after its units): the layout tables, with the dedup the fan caps per local
// index, and the unpack units per source.
__device__ __forceinline__ CommSh commShared(const MoeXnParams& p, uint8_t* smem) {
  const A2aParams& a = p.a;
  const int n = a.s.nRanks, epr = a.s.expertsPerRank, me = a.f.rank, tab = n * epr;
  int32_t* srcRow = reinterpret_cast<int32_t*>(smem);
  int32_t* recvTab = srcRow + tab;
  int32_t* fanLim = recvTab + tab;
  int32_t* dCnt = fanLim + kMoeNodeMaxLocal;
  int32_t* fCnt = dCnt + n;
  for (int i = threadIdx.x; i < tab; i += blockDim.x) {
    srcRow[i] = p.srcRow[i];
    recvTab[i] = p.recvTab[i];
  }
  const MoeNodeMap& m = a.node;
  for (int l = threadIdx.x; m.rail && l < m.nLocal; l += blockDim.x) {
    const int q = m.rankAt[m.nodeOf[m.me] * m.nLocal + l];
    const bool sameBound = a.recvCnt[q * a.stride + moeCntMax(epr)] == (int32_t)a.pairRows;
    fanLim[l] = sameBound ? (int32_t)moeFanOut(m, a.recvCnt, epr, l, a.pairRows) : 0;
  }
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    const MxStream st = mxReceiverStream(p.plan, m, a.sendCnt, a.recvCnt, epr, s, a.pairRows);
    dCnt[s] =
        (int32_t)(s == me ? mxChunks(a.sendCnt[me * a.stride + moeCntBlk(epr)], p.plan.dispRows)
                          : st.dispEnd);
    fCnt[s] = (int32_t)(st.fanEnd - st.dispEnd);
  }
  __syncthreads();
  return CommSh{srcRow, recvTab, fanLim, dCnt, fCnt};
}

// The send and unpack roles, not inlined: the kernel's registers stay the GEMM's (inlined, the
// comm code's live ranges made ptxas spill around the GEMM).
// Each takes its place from blockIdx and the call number from `seq` (shared memory): calls
// with few arguments left the kernel without spills.
template <typename In>
static __device__ __noinline__ void sendRole(const MoeXnParams& p, uint8_t* smem,
                                             const uint64_t* seq) {
  sendCta<In>(p, (int32_t)blockIdx.x, mxSendCtas(p.nComm), *seq, commShared(p, smem));
}
static __device__ __noinline__ void landRole(const MoeXnParams& p, const uint64_t* seq) {
  const int32_t nSend = mxSendCtas(p.nComm);
  landCta(p, (int32_t)blockIdx.x - nSend, p.nComm - nSend, *seq);
}
static __device__ __noinline__ bool unpackRole(const MoeXnParams& p, uint8_t* smem) {
  const bool ok = unpackCta(p, (int32_t)blockIdx.x - p.nComm, commShared(p, smem));
  __syncthreads();  // every warp is through the tables before the GEMM's ring overwrites them
  return ok;
}

// The GEMMs' end: word kTwPart2 of an unpack CTA, kTwPart1 of a compute CTA (from blockIdx
// after the GEMM: nothing held in registers across it).
__device__ __forceinline__ void gemmDoneStamp(const MoeXnParams& p) {
  traceStamp(p, (int32_t)blockIdx.x < p.nComm + p.nUnpack ? kTwPart2 : kTwPart1);
}

// A compute CTA's work (an unpack CTA's after its units): the GEMMs on the dynamic schedule
// (p.g1.tileClaim: `cta` and `nCtas` are not used), then (the layer) the combine.
template <class Tr1, class Tr2, bool kFfn>
__device__ __forceinline__ void compute(const MoeXnParams& p, uint8_t* smem) {
  if constexpr (kFfn) {
    // Both GEMMs through one ring and one main loop, then every warp back at the launch's
    // registers for the combine.
    gemm::gemmChainCta<Tr1, Tr2>(p.g1, p.g2, smem);
    gemm::gemmCtaHandBack<Tr1>(smem);
    gemmDoneStamp(p);
    using In = moedev::InElem<Tr1::kF16In>;
    if (p.outType == (int32_t)gemm::DType::kBF16) {
      combine<__nv_bfloat16, In>(p);
    } else if (p.outType == (int32_t)gemm::DType::kF16) {
      combine<__half, In>(p);
    } else {
      combine<float, In>(p);
    }
    traceStamp(p, kTwPart3);
  } else {
    gemm::gemmCta<Tr1>(p.g1, smem, (int32_t)blockIdx.x, (int32_t)gridDim.x);
    // Every warpgroup back at the launch's registers: thread 0 may be the last CTA's, which
    // records the call's errors (the producer's setmaxnreg budget is too small for it).
    gemm::gemmCtaHandBack<Tr1>(smem);
    gemmDoneStamp(p);
  }
}

}  // namespace mxdev

template <class Tr1, class Tr2, bool kFfn>
__global__ void __launch_bounds__(gemm::kThreads, 1)
    moeXnodeKernel(const __grid_constant__ MoeXnParams p) {
  extern __shared__ uint8_t smem[];
  const A2aParams& a = p.a;
  __shared__ uint64_t seqSh, xseqSh;
  mxdev::traceStamp(p, mxdev::kTwStart);
  if (threadIdx.x == 0) {
    seqSh = callSeq(a.f);
    // The xnode call number: read before any CTA can finish (the last one advances it).
    xseqSh = ptx::ldVolatile64(p.xcalls) + 1;
  }
  __syncthreads();
  const int32_t b = (int32_t)blockIdx.x;
  if (b < mxSendCtas(p.nComm)) {
    mxdev::sendRole<moedev::InElem<Tr1::kF16In>>(p, smem, &xseqSh);
  } else if (b < p.nComm) {
    mxdev::landRole(p, &xseqSh);
  } else {
    // Unpack CTAs join the compute CTAs once their units are unpacked.
    const bool ok = b >= p.nComm + p.nUnpack || mxdev::unpackRole(p, smem);
    if (ok && !rt::failed(a.f.c.w)) mxdev::compute<Tr1, Tr2, kFfn>(p, smem);
  }
  __syncthreads();
  mxdev::traceStamp(p, mxdev::kTwEnd);
  if (threadIdx.x == 0 && rt::finishCta(a.f.c.w)) {
    if (!rt::failed(a.f.c.w)) a2aReportErrors(a, p.lay->ovf, p.lay->otherMax, p.lay->span);
    *(volatile uint64_t*)fusedCallCounter(a.f) = seqSh;
    *(volatile uint64_t*)p.xcalls = xseqSh;
    __threadfence_system();
  }
}

}  // namespace fused
}  // namespace mk
