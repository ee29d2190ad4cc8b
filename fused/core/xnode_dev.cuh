// Device steps of the xnode window protocol (core/xnode_proto.h) that every xnode receive
// role takes the same way: AllGather + GEMM, GEMM + ReduceScatter / AllReduce and ring
// attention across (virtual) nodes.
#pragma once
#include <cstdint>

#include "device/net/devcomm.cuh"
#include "fused/core/xnode_proto.h"

namespace mk {
namespace fused {

// Receive side, at the start of call seq: credit every source this receive CTA (k of nRecv)
// serves; from now on their chunks may land in this rank's window. False once the comm failed.
__device__ __forceinline__ bool gxCredit(const NetDev& d, int me, int n, int k, int nRecv,
                                         uint64_t seq) {
  for (int t = 1 + k; t < n; t += nRecv)
    if (!dev::net::signal(d, gxRecvPeer(me, t, n), kGxSigAck + me, gxValue(seq, 0))) return false;
  return true;
}

// Send side: waits until dst's ack frees the slot of chunk j. *acked: the highest ack this
// CTA already waited for from dst (an ack frees a slot for good within the call, so it is
// waited for once). False once the comm failed.
__device__ __forceinline__ bool gxSlotFree(const NetDev& d, int dst, uint64_t seq, int64_t j,
                                           int32_t slots, uint64_t* acked) {
  const uint64_t need = gxAckNeed(seq, j, slots);
  if (need <= *acked) return true;
  if (!dev::net::wait_signal_from(d, kGxSigAck + dst, need, dst)) return false;
  *acked = need;
  return true;
}

// Send side: chunk j (bytes from src) into dst's area of this rank, once its slot is free.
__device__ __forceinline__ bool gxPutChunk(const NetDev& d, const void* src, int dst, int me,
                                           uint64_t seq, int64_t j, int32_t slots, int64_t area,
                                           int64_t chunkBytes, uint64_t bytes, uint64_t* acked) {
  if (!gxSlotFree(d, dst, seq, j, slots, acked)) return false;
  return dev::net::put_signal(d, src, dst, gxSlotOff(area, chunkBytes, slots, me, j), bytes,
                              kGxSigData + me, gxValue(seq, (uint32_t)j + 1));
}

// Send side, at the end: every destination of this send CTA (i of nSend) consumed everything
// (kGxDone): its window is free for the comm's next operation and nothing reads this rank's
// sources any more.
__device__ __forceinline__ bool gxSendEnd(const NetDev& d, int me, int n, int i, int nSend,
                                          uint64_t seq) {
  for (int t = 1 + i; t < n; t += nSend) {
    const int dst = gxSendPeer(me, t, n);
    if (!dev::net::wait_signal_from(d, kGxSigAck + dst, gxValue(seq, kGxDone), dst)) return false;
  }
  return true;
}

// Chunk j of `total` from `src` is consumed: its slot may be refilled. The sender needs the
// ack only for chunk j + slots (kGxDone covers the last ones); across nodes it may ride with
// the next batch to the peer (lazy). The whole CTA calls it; false once the comm failed.
__device__ __forceinline__ bool gxAckChunk(const NetDev& d, int src, int me, uint64_t seq,
                                           int64_t j, int64_t slots, int64_t total) {
  if (!gxAckSent(j, slots, total)) return true;
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
