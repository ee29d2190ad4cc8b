// The communication role of the fused ring attention on a comm spanning (virtual) nodes (the
// xnode layout, xnode.h: units, ready counters; fused/core/xnode_proto.h: window slots,
// signal slots and values). Part of fused_kernel.cuh (included there, inside namespace
// mk::fused, after RingParams and copyCta; not a header of its own).
//
// Comm CTAs [0, gxSendCtas) send, the others receive. Every transfer goes through the device
// communication API, so P2P stores reach the ranks of this node and the proxy the others, and
// every wait is bounded and abortable (p.net.w is the operator's wait context: a failed peer
// also ends the attention CTAs' waits on the ready counters).
//  - Receive CTA k of nRecv: credits every source it serves (ack = gxValue(seq, 0)); the own
//    copier (rxOwnCopier) copies this rank's k and v into gather index 0 unit by unit,
//    raising ready[0]; then rounds t = 1 + k, 1 + k + nRecv, ...: source me - t (gather index
//    t: the ring order the attention walks), unit by unit in order: wait for its data
//    signal, copy the slot into the gather buffer, raise ready[t] to u + 1, ack the unit when
//    the sender will need the slot again. The last receive CTA to finish sends kGxDone to
//    every source.
//  - Send CTA i: rounds t = 1 + i, 1 + i + nSend, ...: destination me + t, every unit of this
//    rank's k and v in order (put_signal into the destination's area of this rank once the
//    ack frees its slot); then waits for each destination's kGxDone (its window is free for
//    the comm's next operation, and no peer reads this rank's k and v any more: the caller
//    may overwrite them once the call completed).
// Round t pairs sender me with receiver me + t on both sides (gxSendPeer / gxRecvPeer), and
// sends and receives run in different CTAs: a sender waiting for an ack never holds up a
// receive, so the rounds cannot wait in a cycle.
#pragma once

// Where unit u of gather index i goes, and where this rank's own unit u comes from.
__device__ __forceinline__ char* rxGatherAt(const RingParams& p, int32_t i, int32_t u) {
  return ((u & 1) ? p.vAll : p.kAll) + (int64_t)i * p.sliceBytes + rxUnitOff(p.rxChunkBytes, u);
}
__device__ __forceinline__ const char* rxMine(const RingParams& p, int32_t u) {
  return static_cast<const char*>((u & 1) ? p.v : p.k) + rxUnitOff(p.rxChunkBytes, u);
}

// After a CTA's copy of unit u of gather index i: every thread's stores are visible at GPU
// scope before the counter (the attention's producer acquires it, then reads with TMA).
__device__ __forceinline__ void rxRaise(const RingParams& p, int32_t i, int32_t u) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) rt::releaseFlag(&p.ready[i], (uint64_t)u + 1, false);
}

__device__ __forceinline__ void rxRecv(const RingParams& p, int32_t k, int32_t nRecv,
                                       uint64_t seq) {
  namespace dn = dev::net;
  const NetDev& d = p.net;
  const int n = p.f.nRanks, me = p.f.rank;
  // Credit for call seq to every source this CTA serves: from now on their units may land in
  // this rank's window (it left every earlier operation of the comm).
  if (!gxCredit(d, me, n, k, nRecv, seq)) return;
  if (k == rxOwnCopier(nRecv, n)) {
    for (int32_t u = 0; u < p.rxUnits; ++u) {
      copyCta(rxGatherAt(p, 0, u), rxMine(p, u), rxUnitBytes(p.rxChunkBytes, p.sliceBytes, u));
      rxRaise(p, 0, u);
    }
  }
  for (int t = 1 + k; t < n; t += nRecv) {
    const int src = gxRecvPeer(me, t, n);
    for (int32_t u = 0; u < p.rxUnits; ++u) {
      if (!dn::wait_signal_from(d, kGxSigData + src, gxValue(seq, (uint32_t)u + 1), src)) return;
      const uint64_t off = gxSlotOff(p.rxArea, p.rxChunkBytes, p.rxSlots, src, u);
      dn::detail::copy<dn::Block>(rxGatherAt(p, t, u), dn::recv_ptr(d, src, off),
                                  (uint64_t)rxUnitBytes(p.rxChunkBytes, p.sliceBytes, u));
      rxRaise(p, t, u);  // also: every thread has read the slot before it is acked
      if (!gxAckChunk(d, src, me, seq, u, p.rxSlots, p.rxUnits)) return;
    }
  }
  // The last receive CTA: every chunk of every source consumed; the sources may end.
  gxReceiveEnd(d, p.recvDone, nRecv, me, n, seq);
}

__device__ __forceinline__ void rxSend(const RingParams& p, int32_t i, int32_t nSend,
                                       uint64_t seq) {
  const NetDev& d = p.net;
  const int n = p.f.nRanks, me = p.f.rank;
  for (int t = 1 + i; t < n; t += nSend) {
    const int dst = gxSendPeer(me, t, n);
    uint64_t acked = 0;  // the highest ack value this CTA has waited for
    for (int32_t u = 0; u < p.rxUnits; ++u) {
      if (!gxPutChunk(d, rxMine(p, u), dst, me, seq, u, p.rxSlots, p.rxArea, p.rxChunkBytes,
                      (uint64_t)rxUnitBytes(p.rxChunkBytes, p.sliceBytes, u), &acked))
        return;
    }
  }
  gxSendEnd(d, me, n, i, nSend, seq);
}

__device__ __forceinline__ void rxCommRole(const RingParams& p, int32_t idx, int32_t nComm,
                                           uint64_t seq) {
  const int32_t nSend = gxSendCtas(nComm, p.f.nRanks);
  if (idx < nSend) {
    rxSend(p, idx, nSend, seq);
  } else {
    rxRecv(p, idx - nSend, nComm - nSend, seq);
  }
}
