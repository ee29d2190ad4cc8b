// The gateway's forward of the MoE AllToAll path's node dedup (MKERNEL_MOE_NODE_DEDUP=1;
// fused/ops/moe/moe_node.h has the roles and the count protocol). After the rows AllToAll, a
// rank holds one rail block per remote source that routes through it: one token row per token
// of that source with a slot on this node, whose metadata lists every such slot with its
// owner's local index. This kernel splits each row into one fan row per owner (the owner's
// entries only) in the fan send buffers; the fan AllToAll that follows moves them inside the
// node, sized by fanUnits, which the kernel derives from the received counts alone (moeFanOut,
// moeFanIn: no second exchange, the same numbers at both ends). The atomics that give each fan
// row its place never size a transfer: their totals are compared with the announced sums by
// the call's last kernel (a difference is an internal error, reported, never a hang).
#include <cstdint>
#include <cuda_runtime.h>

#include "base/checks.h"
#include "fused/ops/moe/a2a.h"
#include "fused/ops/moe/moe_node.h"

namespace mk {
namespace fused {

namespace {

// CTA 0 writes fanUnits ([0][q] rows to rank q, [1][q] rows from rank q, [2][q] the unclamped
// sum to rank q); every CTA: one warp per rail row received.
__global__ void __launch_bounds__(kA2aThreads)
    moeA2aForwardKernel(const __grid_constant__ A2aParams p) {
  __shared__ int32_t fanOut[kMoeNodeMaxLocal];  // rows this gateway sends each local index
  __shared__ uint8_t railOk[kMoeNodeMaxRanks];  // the source's rail block here is consistent
  const MoeNodeMap& m = p.node;
  const int n = m.nRanks, nl = m.nLocal, epr = p.s.expertsPerRank, k = p.s.topk;
  const int myNode = m.nodeOf[m.me];
  for (int l = threadIdx.x; l < nl; l += blockDim.x)
    fanOut[l] = (int32_t)moeFanOut(m, p.recvCnt, epr, l, p.pairRows);
  for (int src = threadIdx.x; src < n; src += blockDim.x) {
    const int32_t* c = p.recvCnt + src * p.stride;
    railOk[src] =
        c[moeCntMode(epr)] == kMoeRailBlock && moeCntRouteValid(m, c, src, epr, p.pairRows);
  }
  __syncthreads();
  if (blockIdx.x == 0)
    for (int q = threadIdx.x; q < n; q += blockDim.x) {
      const bool local = m.nodeOf[q] == myNode;
      const int l = m.localOf[q];
      // moeFanOut without its cap: every rail block counts, consistent or not, so a block the
      // warps skipped shows as a difference in the last kernel's check.
      const int64_t raw = local ? moeFanOut(m, p.recvCnt, epr, l, INT64_MAX) : 0;
      // Each end caps a fan size with its own maxRows; with unequal bounds (an error the
      // layout check reports) the two ends could size the fan AllToAll differently and wait
      // out the timeout, so a pair whose bounds differ moves nothing, on both ends alike.
      const bool sameBound = p.recvCnt[q * p.stride + moeCntMax(epr)] == (int32_t)p.pairRows;
      p.fanUnits[q] = local && sameBound ? fanOut[l] : 0;
      p.fanUnits[n + q] =
          local && sameBound ? (int32_t)moeFanIn(m, p.recvCnt, epr, l, p.pairRows) : 0;
      p.fanUnits[2 * n + q] = raw > INT32_MAX ? INT32_MAX : raw < 0 ? -1 : (int32_t)raw;
    }
  const int lane = threadIdx.x & 31;
  const uint32_t below = (1u << lane) - 1;
  const int64_t vecs = p.rowBytes / 16;
  for (int64_t w = (int64_t)blockIdx.x * kA2aWarps + (threadIdx.x >> 5); w < n * p.pairRows;
       w += (int64_t)gridDim.x * kA2aWarps) {
    const int src = (int)(w / p.pairRows);
    if (!railOk[src] || w - (int64_t)src * p.pairRows >= p.recvCnt[src * p.stride + moeCntBlk(epr)])
      continue;
    const RailLanes rl = railLanes(p.recvMeta + w * k, k, nl);
    const int4 e = rl.e;
    const int loc = rl.loc;
    uint32_t leaders = rl.leaders;
    const int4* from = reinterpret_cast<const int4*>(p.recvRows + w * p.rowBytes);
    // One fan row per distinct owner, in first-entry order, with that owner's entries.
    while (leaders != 0) {
      const int leader = __ffs(leaders) - 1;
      leaders &= leaders - 1;
      const int l = __shfl_sync(0xffffffffu, loc, leader);
      int32_t pos = 0;
      if (lane == leader) pos = atomicAdd(&p.fanCnt[l], 1);
      pos = __shfl_sync(0xffffffffu, pos, leader);
      if (pos >= fanOut[l]) continue;  // the owner overflowed (sum over maxRows), or a bad count
      const int64_t at = (int64_t)m.rankAt[myNode * nl + l] * p.pairRows + pos;
      int4* to = reinterpret_cast<int4*>(p.fanSendRows + at * p.rowBytes);
      for (int64_t v = lane; v < vecs; v += 32) to[v] = from[v];
      const bool mine = loc == l;
      const uint32_t all = __ballot_sync(0xffffffffu, mine);
      int4* meta = p.fanSendMeta + at * k;
      if (mine) meta[__popc(all & below)] = e;
      if (lane >= __popc(all) && lane < k) meta[lane] = make_int4(-1, 0, 0, 0);
    }
  }
}

}  // namespace

ncclResult_t moeA2aForward(const A2aParams& p, int grid, cudaStream_t stream) {
  moeA2aForwardKernel<<<grid, kA2aThreads, 0, stream>>>(p);
  CUDACHECK(cudaGetLastError());
  return ncclSuccess;
}

ncclResult_t moeA2aNodePreload() {
  cudaFuncAttributes a;
  CUDACHECK(cudaFuncGetAttributes(&a, moeA2aForwardKernel));
  return ncclSuccess;
}

}  // namespace fused
}  // namespace mk
