// Device steps of the xnode window protocol (core/xnode_proto.h) that every xnode receive
// role takes the same way: AllGather + GEMM, GEMM + ReduceScatter / AllReduce and ring
// attention across (virtual) nodes.
#pragma once
#include <cstdint>

#include "device/net/devcomm.cuh"
#include "fused/core/xnode_proto.h"

namespace mk {
namespace fused {

// Chunk j of `total` from `src` is consumed: its slot may be refilled. The sender needs the
// ack only for chunk j + slots (kGxDone covers the last ones); across nodes it may ride with
// the next batch to the peer (lazy). The whole CTA calls it; false once the comm failed.
__device__ __forceinline__ bool gxAckChunk(const NetDev& d, int src, int me, uint64_t seq,
                                           int64_t j, int64_t slots, int64_t total) {
  if (j + slots >= total) return true;
  return dev::net::signal(d, src, kGxSigAck + me, gxValue(seq, (uint32_t)j + 1),
                          kSignalSet | kSignalLazy);
}

// After a receive CTA consumed its sources: the last of the nRecv receive CTAs (counted in
// *recvDone, call scratch) tells every source that all its chunks are consumed (kGxDone), so
// that the senders may end. The whole CTA calls it.
__device__ __forceinline__ void gxReceiveEnd(const NetDev& d, uint32_t* recvDone, int32_t nRecv,
                                             int me, int n, uint64_t seq) {
  __shared__ int last;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(recvDone, 1u) == (uint32_t)nRecv - 1 ? 1 : 0;
  }
  __syncthreads();
  if (!last) return;
  for (int t = 1; t < n; ++t)
    if (!dev::net::signal(d, gxRecvPeer(me, t, n), kGxSigAck + me, gxValue(seq, kGxDone))) return;
}

}  // namespace fused
}  // namespace mk
