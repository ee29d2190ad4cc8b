// The gather role of the fused AllGather + GEMM on a comm spanning (virtual) nodes (the xnode
// layout, fused/ops/gemm_coll/xnode.h: window slots, signal slots and values). Part of
// fused_kernels.cuh (included there, inside namespace mk::fused, after GcParams and
// gcCopyBulk; not a header of its own).
//
// Comm CTAs [0, gxSendCtas) send, the others receive. Every transfer goes through the device
// communication API, so P2P stores reach the ranks of this node and the proxy the others, and
// every wait is bounded and abortable (the API's waits run in the comm's domain: p.net.w is
// the fused operator's wait context, so a failed peer also stops this rank's GEMM waits).
//  - Receive CTA k: credits every source it serves (ack = gxValue(seq, 0)), copies its share
//    of this rank's own shard into G (gxOwnCopier: the CTAs that serve no source if any, else
//    all in turn; those rows first: the engine starts there), then serves rounds t = 1 + k, 1 + k +
//    nRecv, ...: source me - t, chunk by chunk in order: wait for its data signal, copy the slot
//    into G, release the chunk's rows-ready flag (the GEMM starts on those rows at once), ack it
//    when the sender will need the slot again. The last receive CTA to finish sends kGxDone to
//    every source.
//  - Send CTA i: rounds t = 1 + i, 1 + i + nSend, ...: destination me + t, every chunk of
//    this rank's shard in order (put_signal into the destination's area of this rank, after
//    the ack that frees its slot); then waits for each destination's kGxDone (its window is
//    then free for the comm's next operation, and no peer reads this rank's Ashard any more).
#pragma once

// Receive CTA k of nRecv (file comment). The API calls are made by the whole CTA and return
// the same verdict to every thread, so a failure leaves the CTA together.
__device__ __forceinline__ void gxGatherRecv(const GcParams& p, int32_t k, int32_t nRecv,
                                             uint8_t* smem, uint64_t seq) {
  namespace dn = dev::net;
  __shared__ uint32_t uses[kGatherBufs];
  const NetDev& d = p.net;
  const int n = p.n, me = p.me;
  const int64_t shardBytes = (int64_t)p.rowsPerRank * p.K * 2;
  uint8_t* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem) + 127) & ~uintptr_t(127));
  uint64_t* bar = reinterpret_cast<uint64_t*>(base);
  if (threadIdx.x == 0) {
    for (int b = 0; b < kGatherBufs; ++b) {
      ptx::mbarInit(&bar[b], 1);
      uses[b] = 0;
    }
    ptx::fenceMbarInit();
  }
  __syncthreads();
  // Credit for call seq to every source this CTA serves: from now on their chunks may land
  // in this rank's window (it left every earlier operation of the comm).
  if (!gxCredit(d, me, n, k, nRecv, seq)) return;
  // My own shard, in chunks shared by the receive CTAs (the bulk-copy ring of gcCopyBulk).
  const uint8_t* A = static_cast<const uint8_t*>(p.A);
  uint8_t* G = static_cast<uint8_t*>(p.G);
  for (int32_t j = 0; j < p.gxChunks; ++j) {
    if (!gxOwnCopier(k, nRecv, n, j)) continue;
    uint8_t* to = G + me * shardBytes + (int64_t)j * p.gxChunkBytes;
    const uint8_t* from = A + (int64_t)j * p.gxChunkBytes;
    if (threadIdx.x == 0) {
      if (from != to) gcCopyBulk(to, from, p.gxChunkBytes, base + 128, bar, uses);
      __threadfence();
      ptx::stReleaseGpu(p.rowFlags + (int64_t)me * p.gxChunks + j, seq);
    }
  }
  __syncthreads();
  for (int t = 1 + k; t < n; t += nRecv) {
    const int src = gxRecvPeer(me, t, n);
    for (int32_t j = 0; j < p.gxChunks; ++j) {
      if (!dn::wait_signal_from(d, kGxSigData + src, gxValue(seq, (uint32_t)j + 1), src)) return;
      const uint64_t off = gxSlotOff(p.gxArea, p.gxChunkBytes, p.gxSlots, src, j);
      dn::detail::copy<dn::Block>(
          reinterpret_cast<char*>(G + src * shardBytes + (int64_t)j * p.gxChunkBytes),
          dn::recv_ptr(d, src, off), (uint64_t)p.gxChunkBytes);
      __threadfence();
      __syncthreads();  // every thread's rows are stored, and the slot read
      if (threadIdx.x == 0) ptx::stReleaseGpu(p.rowFlags + (int64_t)src * p.gxChunks + j, seq);
      if (!gxAckChunk(d, src, me, seq, j, p.gxSlots, p.gxChunks)) return;
    }
  }
  // The last receive CTA: every chunk of every source consumed; the sources may end.
  gxReceiveEnd(d, p.recvDone, nRecv, me, n, seq);
}

__device__ __forceinline__ void gxGatherSend(const GcParams& p, int32_t i, int32_t nSend,
                                             uint64_t seq) {
  const NetDev& d = p.net;
  const int n = p.n, me = p.me;
  const uint8_t* A = static_cast<const uint8_t*>(p.A);
  for (int t = 1 + i; t < n; t += nSend) {
    const int dst = gxSendPeer(me, t, n);
    uint64_t acked = 0;  // the highest ack value this CTA has waited for
    for (int32_t j = 0; j < p.gxChunks; ++j) {
      if (!gxPutChunk(d, A + (int64_t)j * p.gxChunkBytes, dst, me, seq, j, p.gxSlots, p.gxArea,
                      p.gxChunkBytes, (uint64_t)p.gxChunkBytes, &acked))
        return;
    }
  }
  gxSendEnd(d, me, n, i, nSend, seq);
}

__device__ __forceinline__ void gcGatherNetRole(const GcParams& p, int32_t idx, int32_t nIdx,
                                                uint8_t* smem) {
  const uint64_t seq = gcSeq(p);
  const int32_t nSend = gxSendCtas(nIdx, p.n);
  if (idx < nSend) {
    gxGatherSend(p, idx, nSend, seq);
  } else {
    gxGatherRecv(p, idx - nSend, nIdx - nSend, smem, seq);
  }
  __syncthreads();
}
