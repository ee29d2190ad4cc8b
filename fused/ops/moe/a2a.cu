// The MoE calls on every layout other than the clique (ranks in separate processes, on
// several GPUs, on (virtual) nodes): the routing counts and the token rows travel with
// mkernel's own AllToAll, in per-pair buffers of maxRows rows, so nothing needs the host to
// know a count (no synchronisation, capturable). Then the same packed layout, grouped GEMM,
// and for the whole layer SwiGLU, GEMM2, a return AllToAll of the expert outputs (rounded to
// the input type, as every combine takes them) and the weighted combine in slot order: the
// results equal the clique path's.
//
//   pack (1 CTA)    counts per (destination, local expert), each routed slot's row in its
//                   destination's expert-major pair layout (local expert, then slot order; the
//                   return trip's positions); a pair whose rows exceed maxRows sends nothing
//                   and is flagged (the receiver would overflow anyway); the first bad
//                   expert id; and one token row per (token, destination): a token whose
//                   slots name several experts of one rank travels there once
//   rows            token rows, each with the k entries (pair row, token, slot, weight) of
//                   its slots on that destination, into the pair buffers
//   AllToAll x3     counts, token rows, metadata
//   unpack          every CTA derives the packed layout from the received counts; each token
//                   row into the recv rows of its slots, rowSource and rowWeight; counts and
//                   offsets (0 on overflow)
//   [ffn] return    expert outputs back into the pair positions (zeros on overflow),
//                   AllToAll, then y[t] = sum_j w[t][j] * out(slot j)
// Errors (a bad id, an overflow) are recorded by the last kernel of the call only: a comm that
// has failed leaves its later collectives at once, and its peers would time out.
#include <algorithm>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "base/checks.h"
#include "base/debug.h"
#include "base/param.h"
#include "base/scratch.h"
#include "coll/coll.h"
#include "comm/comm.h"
#include "device/rt/wait.cuh"
#include "fused/core/elem.cuh"
#include "fused/core/fused_comm.h"
#include "fused/gemm/gemm.h"
#include "fused/ops/gemm_coll/gemm_coll_util.h"
#include "fused/ops/moe/a2a.h"
#include "fused/ops/moe/combine_dev.cuh"
#include "fused/ops/moe/moe.h"
#include "fused/ops/moe/moe_layout.h"
#include "fused/ops/moe/moe_node.h"
#include "fused/ops/moe/moe_rank.cuh"

namespace mk {
namespace fused {

namespace {

// One CTA: counts, flags and each slot's pair row. Warp 0 walks the slots in order, 32 at a
// time (lanes with the same expert rank themselves by lane), as the clique dispatch does.
// With the node dedup, the route of every pair (moe_node.h's rule, moeSourceCounts's numbers)
// before the token rows are given out per block.
__global__ void __launch_bounds__(kA2aThreads)
    moeA2aPackKernel(const __grid_constant__ A2aParams p) {
  // cnt[E], seen[E], base[E], blkCnt[n], tokCnt[n], railToks[nodes]
  extern __shared__ int32_t sh[];
  const MoeShape& s = p.s;
  const int n = s.nRanks, epr = s.expertsPerRank, st = p.stride;
  const bool rail = p.node.rail != 0;
  const int nodes = rail ? p.node.nNodes : 0;
  int32_t* cnt = sh;
  int32_t* seen = sh + s.experts;
  int32_t* base = sh + 2 * s.experts;
  int32_t* blkCnt = sh + 3 * s.experts;
  int32_t* tokCnt = blkCnt + n;
  int32_t* railToks = tokCnt + n;
  for (int e = threadIdx.x; e < s.experts; e += blockDim.x) cnt[e] = seen[e] = 0;
  for (int d = threadIdx.x; d < n; d += blockDim.x) blkCnt[d] = tokCnt[d] = 0;
  for (int b = threadIdx.x; b < nodes; b += blockDim.x) railToks[b] = 0;
  if (rail)
    for (int l = threadIdx.x; l < kMoeNodeMaxLocal; l += blockDim.x) p.fanCnt[l] = 0;
  __syncthreads();
  const int64_t slots = (int64_t)s.tokens * s.topk;
  moeCountSlots(p.topkIdx, slots, s.experts, cnt, p.badSlot);
  __syncthreads();
  // Per destination: rows of each local expert start after the previous ones'.
  for (int d = threadIdx.x; d < n; d += blockDim.x) {
    int32_t* c = p.sendCnt + d * st;
    int64_t row = 0;
    for (int le = 0; le < epr; ++le) {
      base[d * epr + le] = (int32_t)row;
      row += cnt[d * epr + le];
      c[le] = cnt[d * epr + le];
    }
    const bool ovf = row > p.pairRows;
    c[moeCntOvf(epr)] = ovf ? 1 : 0;
    c[moeCntMax(epr)] = (int32_t)p.pairRows;
    c[moeCntRows(epr)] = ovf ? 0 : (int32_t)row;
    c[moeCntMode(epr)] = kMoeDirect;
    for (int l = moeCntFan(epr, 0); l < st; ++l) c[l] = 0;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    moeRankSlots(p.topkIdx, slots, s.experts, seen, p.slotPos, [&](int32_t e, int32_t k) {
      return p.sendCnt[(e / epr) * st + moeCntOvf(epr)] == 0 ? base[e] + k : -1;
    });
  }
  __syncthreads();  // slotPos (global) complete and visible to the whole CTA
  if (rail) {
    // Distinct tokens per destination and per node (a token's first sent slot there), then
    // each pair's route: the spill rule needs the node totals.
    for (int64_t t = threadIdx.x; t < s.tokens; t += blockDim.x) {
      int dest[NCCL_MOE_MAX_TOPK];
      for (int j = 0; j < s.topk; ++j) {
        const int64_t i = t * s.topk + j;
        const int d = p.slotPos[i] >= 0 ? p.topkIdx[i] / epr : -1;
        dest[j] = d;
        if (d < 0) continue;
        bool firstDst = true, firstNode = true;
        for (int jj = 0; jj < j; ++jj) {
          if (dest[jj] < 0) continue;
          firstDst = firstDst && dest[jj] != d;
          firstNode = firstNode && p.node.nodeOf[dest[jj]] != p.node.nodeOf[d];
        }
        if (firstDst) atomicAdd(&tokCnt[d], 1);
        if (firstNode) atomicAdd(&railToks[p.node.nodeOf[d]], 1);
      }
    }
    __syncthreads();
    for (int d = threadIdx.x; d < n; d += blockDim.x) {
      int32_t* c = p.sendCnt + d * st;
      const int b = p.node.nodeOf[d];
      const int32_t mode = moeNodeMode(p.node, d, moeNodeRail(p.node, b, railToks[b], p.pairRows));
      c[moeCntMode(epr)] = mode;
      if (mode == kMoeRailBlock)
        for (int l = 0; l < p.node.nLocal; ++l)
          c[moeCntFan(epr, l)] = tokCnt[p.node.rankAt[b * p.node.nLocal + l]];
    }
    __syncthreads();
  }
  // One token row per (token, block), taken by the token's first slot carried by that block.
  // The rows' order inside a block does not matter (each carries its slots' pair rows), so an
  // atomic counter serves, and every thread takes tokens.
  for (int64_t t = threadIdx.x; t < s.tokens; t += blockDim.x) {
    int blk[NCCL_MOE_MAX_TOPK];  // each slot's block, -1: not sent
    for (int j = 0; j < s.topk; ++j) {
      const int64_t i = t * s.topk + j;
      const int b = p.slotPos[i] >= 0 ? a2aBlockOf(p, p.topkIdx[i] / epr) : -1;
      blk[j] = b;
      bool first = b >= 0;
      for (int jj = 0; jj < j && first; ++jj) first = blk[jj] != b;
      p.slotTok[i] = first ? atomicAdd(&blkCnt[b], 1) : -1;
    }
  }
  __syncthreads();
  // Without the dedup every block is its destination's, so its rows are the pair's tokens.
  for (int d = threadIdx.x; d < n; d += blockDim.x) {
    p.sendCnt[d * st + moeCntBlk(epr)] = blkCnt[d];
    p.sendCnt[d * st + moeCntToks(epr)] = rail ? tokCnt[d] : blkCnt[d];
  }
}

// One warp per (token, block) (the slot holding its token row): the token row, and one
// metadata entry per slot of the token carried by that block, into the block's pair buffer.
__global__ void __launch_bounds__(kA2aThreads)
    moeA2aRowsKernel(const __grid_constant__ A2aParams p) {
  const MoeShape& s = p.s;
  const int lane = threadIdx.x & 31, epr = s.expertsPerRank;
  const int64_t slots = (int64_t)s.tokens * s.topk;
  const int64_t vecs = p.rowBytes / 16;
  for (int64_t i = (int64_t)blockIdx.x * kA2aWarps + (threadIdx.x >> 5); i < slots;
       i += (int64_t)gridDim.x * kA2aWarps) {
    const int32_t tr = p.slotTok[i];
    if (tr < 0) continue;  // not sent, or not its token's first slot on that block
    const int blk = a2aBlockOf(p, p.topkIdx[i] / epr);
    const int64_t t = i / s.topk;
    const int64_t at = (int64_t)blk * p.pairRows + tr;
    const int4* from = reinterpret_cast<const int4*>(p.x + t * p.rowBytes);
    // A record (recBytes > 0): the row, then its metadata; else the row and the metadata in
    // their own pair buffers.
    uint8_t* rec = p.sendRows + at * (p.recBytes > 0 ? p.recBytes : p.rowBytes);
    int4* meta =
        p.recBytes > 0 ? reinterpret_cast<int4*>(rec + p.rowBytes) : p.sendMeta + at * s.topk;
    int4* to = reinterpret_cast<int4*>(rec);
    for (int64_t v = lane; v < vecs; v += 32) to[v] = from[v];
    // Lane jj: slot jj of the token (k <= 32). Entries in slot order, then -1.
    const int64_t ii = t * s.topk + lane;
    const int dst = lane < s.topk && p.slotPos[ii] >= 0 ? p.topkIdx[ii] / epr : -1;
    const bool mine = dst >= 0 && a2aBlockOf(p, dst) == blk;
    const uint32_t all = __ballot_sync(0xffffffffu, mine);
    if (mine) {
      // A slot served through a gateway names its owner (local index) and source.
      const bool fan = p.sendCnt[dst * p.stride + moeCntMode(epr)] != kMoeDirect;
      const int32_t z = fan ? moeFanZ(lane, p.node.localOf[dst], p.node.me) : lane;
      meta[__popc(all & ((1u << lane) - 1))] =
          make_int4(p.slotPos[ii], (int32_t)t, z,
                    p.topkWeights != nullptr ? __float_as_int(p.topkWeights[ii]) : 0);
    }
    if (lane >= __popc(all) && lane < s.topk) meta[lane] = make_int4(-1, 0, 0, 0);
  }
}

// Rows, rowSource and rowWeight into the packed layout; CTA 0 writes counts and offsets.
__global__ void __launch_bounds__(kA2aThreads)
    moeA2aUnpackKernel(const __grid_constant__ A2aParams p) {
  extern __shared__ int32_t dyn[];  // srcRow[n*epr], recv[n*epr]
  __shared__ RecvLayout L;
  const MoeShape& s = p.s;
  const int n = s.nRanks, epr = s.expertsPerRank;
  int32_t* srcRow = dyn;
  recvLayout(p, L, srcRow, dyn + n * epr);
  if (blockIdx.x == 0) {
    for (int le = threadIdx.x; le <= epr; le += blockDim.x) {
      p.recv.expertOffset[le] = L.ovf ? 0 : L.start[le];
      if (le < epr) p.recv.expertCount[le] = L.ovf ? 0 : L.count[le];
    }
    if (!L.ovf && p.recv.rowSource != nullptr)
      for (int le = 0; le < epr; ++le)
        for (int64_t r = L.start[le] + L.count[le] + threadIdx.x; r < L.start[le + 1];
             r += blockDim.x)
          for (int c = 0; c < 3; ++c) p.recv.rowSource[r * 3 + c] = -1;
    if (p.report && threadIdx.x == 0) a2aReportErrors(p, L.ovf, L.otherMax, L.span);
  }
  if (L.ovf) return;
  const int lane = threadIdx.x & 31;
  const int64_t vecs = p.rowBytes / 16;
  // One warp per token row received: (block, token row) walked block-major, the direct blocks
  // of the rows AllToAll (a rail block is the forward kernel's), then the fan blocks (node
  // dedup); the row goes to the packed row of every slot its metadata lists.
  const int64_t direct = n * p.pairRows, all = p.node.rail ? 2 * direct : direct;
  for (int64_t w = (int64_t)blockIdx.x * kA2aWarps + (threadIdx.x >> 5); w < all;
       w += (int64_t)gridDim.x * kA2aWarps) {
    const bool fan = w >= direct;
    const int64_t wb = fan ? w - direct : w;
    const int blk = (int)(wb / p.pairRows);
    const int64_t tr = wb - (int64_t)blk * p.pairRows;
    if (fan ? tr >= p.fanUnits[n + blk]
            : (p.recvCnt[blk * p.stride + moeCntMode(epr)] != kMoeDirect ||
               tr >= p.recvCnt[blk * p.stride + moeCntBlk(epr)]))
      continue;
    const int4* from =
        reinterpret_cast<const int4*>((fan ? p.fanRecvRows : p.recvRows) + wb * p.rowBytes);
    const int4* meta = (fan ? p.fanRecvMeta : p.recvMeta) + wb * s.topk;
    for (int m = 0; m < s.topk; ++m) {
      const int4 e = meta[m];
      if (e.x < 0) break;
      int src = blk, slot = e.z;
      if (fan) {
        // A fan row's entries name their source; only a source served through a gateway.
        src = moeFanZSrc(e.z);
        slot = moeFanZSlot(e.z);
        if (src >= n || moeFanZLocal(e.z) != p.node.localOf[p.node.me] ||
            p.recvCnt[src * p.stride + moeCntMode(epr)] == kMoeDirect)
          continue;
      }
      const int64_t row = pairRowTarget(p, srcRow, dyn + n * epr, src, e.x);
      if (row < 0) continue;  // past src's rows (never for a consistent sender)
      int4* to = reinterpret_cast<int4*>(static_cast<uint8_t*>(p.recv.xRecv) + row * p.rowBytes);
      for (int64_t v = lane; v < vecs; v += 32) to[v] = from[v];
      if (lane == 0) {
        if (p.recv.rowSource != nullptr) {
          p.recv.rowSource[row * 3 + 0] = src;
          p.recv.rowSource[row * 3 + 1] = e.y;
          p.recv.rowSource[row * 3 + 2] = slot;
        }
        if (p.recv.rowWeight != nullptr) p.recv.rowWeight[row] = __int_as_float(e.w);
      }
    }
  }
}

// The experts' outputs back into the pair positions they came from (zeros on overflow),
// rounded to In (combine_dev.cuh).
template <typename In>
__global__ void __launch_bounds__(kA2aThreads)
    moeA2aReturnKernel(const __grid_constant__ A2aParams p) {
  extern __shared__ int32_t dyn[];
  __shared__ RecvLayout L;
  const MoeShape& s = p.s;
  const int n = s.nRanks, epr = s.expertsPerRank;
  int32_t* srcRow = dyn;
  recvLayout(p, L, srcRow, dyn + n * epr);
  const int lane = threadIdx.x & 31;
  for (int64_t w = (int64_t)blockIdx.x * kA2aWarps + (threadIdx.x >> 5); w < n * p.pairRows;
       w += (int64_t)gridDim.x * kA2aWarps) {
    const int src = (int)(w / p.pairRows);
    uint8_t* to = static_cast<uint8_t*>(p.retSend) + w * p.hidden * (int64_t)sizeof(In);
    if (L.ovf) {
      // Nothing was received: every slot sent here gets zeros (the layout may be invalid).
      for (int64_t v = lane; v < p.hidden * (int64_t)sizeof(In) / 16; v += 32)
        reinterpret_cast<uint4*>(to)[v] = make_uint4(0u, 0u, 0u, 0u);
      continue;
    }
    const int64_t row = pairRowTarget(p, srcRow, dyn + n * epr, src, w - (int64_t)src * p.pairRows);
    if (row < 0) continue;
    moedev::roundRow<In>(to, p.out + row * p.hidden, p.hidden);
  }
}

// y[t] = sum over the token's slots, in slot order, of w * the returned output (combine_dev.cuh:
// fp32, one rounding); one warp per token. The last kernel of the layer: it records the call's
// errors.
template <typename O, typename In>
__global__ void __launch_bounds__(kA2aThreads)
    moeA2aCombineKernel(const __grid_constant__ A2aParams p) {
  extern __shared__ int32_t dyn[];
  __shared__ RecvLayout L;
  const MoeShape& s = p.s;
  recvLayout(p, L, dyn, dyn + s.nRanks * s.expertsPerRank);
  if (blockIdx.x == 0 && threadIdx.x == 0) a2aReportErrors(p, L.ovf, L.otherMax, L.span);
  const int lane = threadIdx.x & 31;
  O* y = static_cast<O*>(p.y);
  for (int64_t t = (int64_t)blockIdx.x * kA2aWarps + (threadIdx.x >> 5); t < s.tokens;
       t += (int64_t)gridDim.x * kA2aWarps) {
    const uint8_t* src = nullptr;
    float w = 0.f;
    if (lane < s.topk) {
      const int64_t i = t * s.topk + lane;
      const int32_t row = p.slotPos[i];
      if (row >= 0) {
        const int d = p.topkIdx[i] / s.expertsPerRank;
        w = p.topkWeights[i];
        src = static_cast<const uint8_t*>(p.retRecv) +
              ((int64_t)d * p.pairRows + row) * p.hidden * (int64_t)sizeof(In);
      }
    }
    moedev::combineToken<O, In>(src, true, w, s.topk, p.hidden, y + t * p.hidden);
  }
}

ncclResult_t alltoall(const MoeCall& c, const void* send, void* recv, size_t count,
                      ncclDataType_t t) {
  return fusedCollective(c.comm, c.stream, (int)CollType::kAlltoAll, send, recv, count, t,
                         moeApi(c));
}

// An AlltoAll of pair buffers that moves only each pair's rows (the counts' entry `which`:
// moeCntBlk for the dispatch's token rows, moeCntRows for the slots' rows of the return trip,
// known on the device once the counts' AllToAll has run): `back` for the return trip, whose
// blocks are the rows this rank received.
ncclResult_t alltoallRows(const MoeCall& c, const A2aParams& p, const void* send, void* recv,
                          size_t count, ncclDataType_t t, uint64_t rowBytes, int which, bool back) {
  const int32_t* sent = p.sendCnt + which;
  const int32_t* got = p.recvCnt + which;
  SizedUnits u;
  u.units[0] = back ? got : sent;
  u.units[1] = back ? sent : got;
  u.unitBytes = rowBytes;
  u.stride = (uint32_t)p.stride;
  return fusedAlltoAllSized(c.comm, c.stream, send, recv, count, t, u, moeApi(c));
}

// The fan AllToAll of the node dedup: units the forward kernel wrote (fanUnits [0][n] sent,
// [1][n] received; non-zero only between ranks of one node).
ncclResult_t alltoallFan(const MoeCall& c, const A2aParams& p, const void* send, void* recv,
                         size_t count, ncclDataType_t t, uint64_t rowBytes) {
  SizedUnits u;
  u.units[0] = p.fanUnits;
  u.units[1] = p.fanUnits + p.s.nRanks;
  u.unitBytes = rowBytes;
  u.stride = 1;
  return fusedAlltoAllSized(c.comm, c.stream, send, recv, count, t, u, moeApi(c));
}

// The node tables of the call: dedup when asked and the comm's (virtual) nodes allow it
// (moeNodeMapInit's rule), else every pair direct (MKERNEL_MOE_NODE_DEDUP=0's path).
void a2aNodeMap(ncclComm* comm, MoeNodeMap* m) {
  const int n = comm->nRanks;
  const Topo& t = comm->topo;
  const bool want = MK_PARAM_INT(MoeNodeDedup) == 1 && t.nNodes > 1;
  *m = MoeNodeMap{};
  m->nRanks = n;
  m->me = comm->rank;
  if (!want) return;
  if ((int)t.rankToNode.size() != n ||
      !moeNodeMapInit(n, t.rankToNode.data(), comm->rank, true, m) || !m->rail) {
    *m = MoeNodeMap{};
    m->nRanks = n;
    m->me = comm->rank;
    MK_INFO_RATELIMITED(kAllSubsys, 60000,
                        "MoE AllToAll path: MKERNEL_MOE_NODE_DEDUP=1 needs 2..%d nodes of equal "
                        "size 2..%d and at most %d ranks; this comm (%d ranks, %d nodes) sends "
                        "every pair direct",
                        kMoeNodeMaxNodes, kMoeNodeMaxLocal, kMoeNodeMaxRanks, n, t.nNodes);
    return;
  }
  MK_INFO_RATELIMITED(kAllSubsys, 60000,
                      "MoE AllToAll path: node dedup on (MKERNEL_MOE_NODE_DEDUP=1), %d nodes x %d "
                      "ranks",
                      m->nNodes, m->nLocal);
}

using A2aKernel = void (*)(A2aParams);

// The layer's return and combine kernels of its types (rows in inType, y in outType).
A2aKernel returnKernelOf(ncclDataType_t inType) {
  return inType == ncclFloat16 ? moeA2aReturnKernel<__half> : moeA2aReturnKernel<__nv_bfloat16>;
}
A2aKernel combineKernelOf(ncclDataType_t inType, ncclDataType_t outType) {
  return moedev::byLayerTypes(inType, outType, [](auto o, auto in) -> A2aKernel {
    return moeA2aCombineKernel<typename decltype(o)::type, typename decltype(in)::type>;
  });
}

ncclResult_t preloadA2a(const MoeCall& c) {
  cudaFuncAttributes a;
  NCCLCHECK(moeA2aFrontPreload());
  CUDACHECK(cudaFuncGetAttributes(&a, moeA2aUnpackKernel));
  NCCLCHECK(moeA2aNodePreload());
  if (c.ffn) {
    CUDACHECK(cudaFuncGetAttributes(&a, returnKernelOf(c.inType)));
    CUDACHECK(cudaFuncGetAttributes(&a, combineKernelOf(c.inType, c.cfg.outType)));
  }
  return ncclSuccess;
}

size_t align256(size_t b) {
  return (b + 255) & ~size_t(255);
}

}  // namespace

ncclResult_t moeA2aParams(const MoeCall& c, A2aParams* pp) {
  ncclComm* comm = c.comm;
  const int n = comm->nRanks, epr = c.E / n;
  A2aParams& p = *pp;
  p = A2aParams{};
  // Errors are the dispatch's (bad id, bound) on both calls, as on the clique path.
  NCCLCHECK(fusedCommView(comm, rt::kOpMoe, &p.f));
  p.x = static_cast<const uint8_t*>(c.x);
  p.topkIdx = c.topkIdx;
  p.topkWeights = c.topkWeights;
  p.recv = c.recv;
  p.rowBytes = (int64_t)c.H * (int64_t)fusedTypeSize(c.inType);
  p.pairRows = (int64_t)c.recv.maxRows;
  p.hidden = (int64_t)c.H;
  p.s.tokens = (int32_t)c.T;
  p.s.topk = c.k;
  p.s.experts = c.E;
  p.s.nRanks = n;
  p.s.expertsPerRank = epr;
  p.report = c.ffn ? 0 : 1;
  a2aNodeMap(comm, &p.node);
  p.stride = moeCntStride(p.node, epr);
  return ncclSuccess;
}

size_t moeA2aPackSmem(const MoeCall& c, const A2aParams& p) {
  const int nodes = p.node.rail ? p.node.nNodes : 0;
  return (3 * (size_t)c.E + 2 * (size_t)p.s.nRanks + nodes) * sizeof(int32_t);
}

size_t moeA2aLayoutSmem(const A2aParams& p) {
  return 2 * (size_t)p.s.nRanks * p.s.expertsPerRank * sizeof(int32_t);
}

ncclResult_t moeA2aFrontPreload() {
  cudaFuncAttributes a;
  CUDACHECK(cudaFuncGetAttributes(&a, moeA2aPackKernel));
  CUDACHECK(cudaFuncGetAttributes(&a, moeA2aRowsKernel));
  return ncclSuccess;
}

ncclResult_t moeA2aFront(const MoeCall& c, const A2aParams& p, int grid) {
  CUDACHECK(cudaMemsetAsync(p.badSlot, 0xff, sizeof(unsigned long long), c.stream));
  moeA2aPackKernel<<<1, kA2aThreads, moeA2aPackSmem(c, p), c.stream>>>(p);
  CUDACHECK(cudaGetLastError());
  if (c.T * (size_t)c.k > 0) {
    moeA2aRowsKernel<<<grid, kA2aThreads, 0, c.stream>>>(p);
    CUDACHECK(cudaGetLastError());
  }
  const size_t cntBytes = (size_t)p.s.nRanks * p.stride * sizeof(int32_t);
  CUDACHECK(cudaMemsetAsync((void*)p.recvCnt, 0xff, cntBytes, c.stream));
  return alltoall(c, p.sendCnt, (void*)p.recvCnt, p.stride, ncclInt32);
}

ncclResult_t moeA2aRun(const MoeCall& c) {
  ncclComm* comm = c.comm;
  const int n = comm->nRanks, epr = c.E / n;
  const ncclMoeRecv_t& r = c.recv;
  A2aParams p{};
  NCCLCHECK(moeA2aParams(c, &p));
  const bool rail = p.node.rail != 0;

  // Every kernel loaded before the first launch: a lazy load can wait behind running kernels,
  // and peers' collectives (ranks of this process on emulated nodes) wait for this rank's.
  gemm::GemmArgs g1, g2;
  const bool actInGemm = moeSwigluInGemm(c);
  NCCLCHECK(moeGemm(c, r.xRecv, c.w1, c.N, c.H, actInGemm ? c.buf.act : r.y,
                    c.ffn ? c.inType : c.cfg.outType, &g1, actInGemm));
  if (c.ffn) NCCLCHECK(moeGemm(c, c.buf.act, c.w2, c.H, c.I, c.buf.out, ncclFloat32, &g2));
  if (c.ffn && !actInGemm) NCCLCHECK(moeSwigluPreload(c));
  NCCLCHECK(preloadA2a(c));

  // Scratch, stream-ordered (graph memory nodes under capture). The fan buffers only with
  // the node dedup.
  const size_t slots = c.T * (size_t)c.k;
  const size_t pairBytes = (size_t)p.pairRows * p.rowBytes;
  const size_t metaBytes = (size_t)p.pairRows * c.k * sizeof(int4);  // k entries a token row
  const size_t inBytes = fusedTypeSize(c.inType);
  const size_t retBytes = c.ffn ? (size_t)p.pairRows * c.H * inBytes : 0;
  const size_t cntBytes = (size_t)n * p.stride * sizeof(int32_t);
  const size_t fanBytes = rail ? (kMoeNodeMaxLocal + 3 * (size_t)n) * sizeof(int32_t) : 0;
  constexpr int kBufs = 15;
  size_t off[kBufs];
  size_t total = 0;
  const size_t sizes[kBufs] = {align256(slots * sizeof(int32_t) + 1),
                               align256(cntBytes),
                               align256(cntBytes),
                               256,
                               align256(n * pairBytes),
                               align256(n * pairBytes),
                               align256(n * metaBytes),
                               align256(n * metaBytes),
                               align256(2 * n * retBytes),
                               align256(slots * sizeof(int32_t) + 1),
                               align256(fanBytes),
                               rail ? align256(n * pairBytes) : 0,
                               rail ? align256(n * pairBytes) : 0,
                               rail ? align256(n * metaBytes) : 0,
                               rail ? align256(n * metaBytes) : 0};
  for (int i = 0; i < kBufs; ++i) {
    off[i] = total;
    total += sizes[i];
  }
  uint8_t* base = nullptr;
  NCCLCHECK(scratchAlloc(reinterpret_cast<void**>(&base), total, comm->cudaDev, c.stream));
  ncclResult_t res = ncclSuccess;
  p.slotPos = reinterpret_cast<int32_t*>(base + off[0]);
  p.sendCnt = reinterpret_cast<int32_t*>(base + off[1]);
  p.recvCnt = reinterpret_cast<const int32_t*>(base + off[2]);
  p.badSlot = reinterpret_cast<unsigned long long*>(base + off[3]);
  p.sendRows = base + off[4];
  p.recvRows = base + off[5];
  p.sendMeta = reinterpret_cast<int4*>(base + off[6]);
  p.recvMeta = reinterpret_cast<const int4*>(base + off[7]);
  p.retSend = base + off[8];
  p.retRecv = base + off[8] + n * retBytes;
  p.slotTok = reinterpret_cast<int32_t*>(base + off[9]);
  if (rail) {
    p.fanCnt = reinterpret_cast<int32_t*>(base + off[10]);
    p.fanUnits = p.fanCnt + kMoeNodeMaxLocal;
    p.fanSendRows = base + off[11];
    p.fanRecvRows = base + off[12];
    p.fanSendMeta = reinterpret_cast<int4*>(base + off[13]);
    p.fanRecvMeta = reinterpret_cast<const int4*>(base + off[14]);
  }
  p.out = c.buf.out;
  p.y = c.yOut;
  const size_t layoutSmem = moeA2aLayoutSmem(p);
  const int grid = std::max(1, std::min<int>(4 * std::max(1, p.f.smBudget), 65535));
  {
    NCCLCHECKGOTO(moeA2aFront(c, p, grid), res, done);
    NCCLCHECKGOTO(alltoallRows(c, p, p.sendRows, (void*)p.recvRows, pairBytes / 2, c.inType,
                               p.rowBytes, moeCntBlk(epr), false),
                  res, done);
    NCCLCHECKGOTO(alltoallRows(c, p, p.sendMeta, (void*)p.recvMeta, metaBytes / 4, ncclInt32,
                               c.k * sizeof(int4), moeCntBlk(epr), false),
                  res, done);
    if (rail) {
      // The gateway's forward: fan sizes from the received counts, rows to the local owners.
      NCCLCHECKGOTO(moeA2aForward(p, grid, c.stream), res, done);
      NCCLCHECKGOTO(alltoallFan(c, p, p.fanSendRows, (void*)p.fanRecvRows, pairBytes / 2, c.inType,
                                p.rowBytes),
                    res, done);
      NCCLCHECKGOTO(alltoallFan(c, p, p.fanSendMeta, (void*)p.fanRecvMeta, metaBytes / 4, ncclInt32,
                                c.k * sizeof(int4)),
                    res, done);
    }
    moeA2aUnpackKernel<<<grid, kA2aThreads, layoutSmem, c.stream>>>(p);
    CUDACHECKGOTO(cudaGetLastError(), res, done);
    NCCLCHECKGOTO(gemm::launch(g1, c.stream), res, done);
    if (c.ffn) {
      if (!actInGemm) NCCLCHECKGOTO(moeSwiglu(c, p.f.smBudget), res, done);
      NCCLCHECKGOTO(gemm::launch(g2, c.stream), res, done);
      returnKernelOf(c.inType)<<<grid, kA2aThreads, layoutSmem, c.stream>>>(p);
      CUDACHECKGOTO(cudaGetLastError(), res, done);
      NCCLCHECKGOTO(alltoallRows(c, p, p.retSend, (void*)p.retRecv, retBytes / inBytes, c.inType,
                                 (uint64_t)c.H * inBytes, moeCntRows(epr), true),
                    res, done);
      combineKernelOf(c.inType, c.cfg.outType)<<<grid, kA2aThreads, layoutSmem, c.stream>>>(p);
      CUDACHECKGOTO(cudaGetLastError(), res, done);
    }
  }
done:
  return fusedFreeScratch(base, c.stream, res, moeApi(c));
}

}  // namespace fused
}  // namespace mk
