// The handshake of the zero-copy collectives (reduce_kernel.cuh, zc_copy.cu): ranks that
// read and write each other's user buffers directly agree on when they may start and when
// they are finished, through the ZcSlot in each rank's workspace (comm/workspace.h).
//
// Buffers: see ZcBufs (coll/launch.h) for the three ways a rank finds its peers' buffers.
//
// Call number: my last `done` + 1, read by every CTA at the start (`done` is written by my
// last CTA only after every CTA has read it). Every zero-copy operation of a comm shares
// this numbering, whatever its type: the ranks issue the same operations in the same order.
//  - arrive: CTA 0 publishes my send/receive pointers (for in-process peers) and `seq`:
//    from then on peers may read my input and write my output (my stream has reached them);
//  - finish: the last CTA publishes `done` and waits until every peer is done, so that when
//    my kernel ends nobody still reads my input or writes my output.
#pragma once
#include <cstdint>

#include "device/chan.cuh"

namespace mk {
namespace dev {

__device__ __forceinline__ ZcSlot* zcSlot(void* ws, const WsLayout& w) {
  return reinterpret_cast<ZcSlot*>((char*)ws + w.zcOff);
}

// Thread 0 of every CTA: this call's number; CTA 0 also publishes the arrival.
__device__ __forceinline__ uint64_t zcArrive(const CommDev& c, const ZcBufs& z, const void* send,
                                             const void* recv, uint64_t scalar) {
  ZcSlot* mine = zcSlot(c.peers[c.me], c.ws);
  const uint64_t s = ptx::ldAcquireSys(&mine->done) + 1;
  if (blockIdx.x == 0) {
    *(volatile uint64_t*)&mine->send = (uint64_t)send;
    *(volatile uint64_t*)&mine->recv = (uint64_t)recv;
    *(volatile uint64_t*)&mine->scalar = scalar;
    *(volatile uint64_t*)&mine->sendKey = z.sendKey;
    *(volatile uint64_t*)&mine->sendOff = z.sendOff;
    *(volatile uint64_t*)&mine->recvKey = z.recvKey;
    *(volatile uint64_t*)&mine->recvOff = z.recvOff;
    ptx::fenceAcqRelSys();
    ptx::stReleaseSys(&mine->seq, s);
  }
  return s;
}

// Peer q's buffers, once it arrived: its raw pointers (kZcRaw), the mapped ones of the
// arguments (kZcMapped), or its window offset added to our mapping of its window
// (kZcWindow; buffers with key 0 are not used remotely and stay null). A peer whose buffer
// is in another window than ours breaks the ranks' agreement: recorded (kErrProtocol,
// naming the peer), false.
__device__ __forceinline__ bool zcPeerBufs(const CommDev& c, const ZcBufs& z, int q, int coll,
                                           const void** send, void** recv) {
  const ZcSlot* p = zcSlot(c.peers[q], c.ws);
  if (z.mode == kZcRaw) {
    *send = (const void*)*(const volatile uint64_t*)&p->send;
    *recv = (void*)*(const volatile uint64_t*)&p->recv;
    return true;
  }
  if (z.mode == kZcMapped) {
    *send = (const void*)z.send[q];
    *recv = (void*)z.recv[q];
    return true;
  }
  const uint64_t sk = *(const volatile uint64_t*)&p->sendKey;
  const uint64_t rk = *(const volatile uint64_t*)&p->recvKey;
  if (sk != z.sendKey || rk != z.recvKey) {
    const bool s = sk != z.sendKey;
    rt::recordError(c.w, rt::kErrProtocol,
                    rt::ErrSite{coll, q, -1, s ? 0 : 1, rt::kWaitNone, rt::kErrPeerLocal},
                    s ? sk : rk, s ? z.sendKey : z.recvKey);
    return false;
  }
  *send = sk ? (const void*)(z.send[q] + *(const volatile uint64_t*)&p->sendOff) : nullptr;
  *recv = rk ? (void*)(z.recv[q] + *(const volatile uint64_t*)&p->recvOff) : nullptr;
  return true;
}

// One thread per peer: waits until local peer q arrived at call s. False on timeout or
// abort (recorded).
__device__ __forceinline__ bool zcWaitArrived(const CommDev& c, int q, uint64_t s, int coll) {
  return waitPeer(c, &zcSlot(c.peers[q], c.ws)->seq, s, q, coll, -1, 0, false);
}

// Thread 0 of every CTA, after a __syncthreads that follows the CTA's last access to any
// peer buffer. The last CTA publishes `done` and waits for every peer's. False on timeout
// or abort (recorded).
__device__ __forceinline__ bool zcFinish(const CommDev& c, uint64_t s, int coll) {
  __threadfence();
  if (atomicAdd(&c.w.hdr->ctaDone, 1u) != gridDim.x - 1) return true;
  c.w.hdr->ctaDone = 0;
  c.w.hdr->opCount = c.w.hdr->opCount + 1;
  ptx::fenceAcqRelSys();
  ptx::stReleaseSys(&zcSlot(c.peers[c.me], c.ws)->done, s);
  for (int q = 0; q < c.nLocal; q++) {
    if (q == c.me) continue;
    if (!waitPeer(c, &zcSlot(c.peers[q], c.ws)->done, s, q, coll, -1, 1, true)) return false;
  }
  return true;
}

}  // namespace dev
}  // namespace mk
