// The slot-FIFO channel protocol, written once for every user: the collectives' reduce and
// copy kernels, the inter-node channel engine (hier_xfer.cu, hier_allreduce.cu through the
// device communication API) and fused operators' communication roles.
//
// A channel is the in-order message stream of one (sender, receiver, lane). Message k
// (0-based, counted by both ends in device memory, never reset) travels in slot
// k % slots of the receiver's area for that sender and lane:
//   sender    acquire  wait until consumed[slot] >= k + 1 - slots (the first `slots`
//                      messages need no wait), then write the slot;
//             publish  fence (fence.acq_rel.sys; one fence may cover several publishes),
//                      then release ready[slot] = k + 1;
//   receiver  receive  wait until ready[slot] >= k + 1, then read the slot;
//             release  fence, then release consumed[slot] = k + 1.
// Every remote access of a rank is a write into, or a flag read of, a peer that still has to
// wait for the message, so a rank whose kernels finished is never touched again.
//
// Transports. P2pLink (here): flags and slots in the receiver's symmetric workspace
// (comm/workspace.h), reached with plain stores. The proxy form (devcomm.cuh: put_signal
// into the receiver's window and a DATA signal for `ready`, signal of an ACK word for
// `consumed`) follows the same counting: chanFree / chanReady give the targets of both.
#pragma once
#include <cstdint>

#include "comm/comm_dev.h"
#include "device/rt/wait.cuh"

namespace mk {
namespace dev {

// The flag values that make message k sendable (its slot is free) and receivable.
MK_HD inline bool chanNeedsFree(uint64_t k, uint64_t slots) {
  return k >= slots;
}
MK_HD inline uint64_t chanFree(uint64_t k, uint64_t slots) {
  return k + 1 - slots;
}
MK_HD inline uint64_t chanReady(uint64_t k) {
  return k + 1;
}

// One channel as its two ends see it: everything lives in the receiver's workspace.
struct P2pLink {
  uint64_t* ready;     // [slots]
  uint64_t* consumed;  // [slots]
  char* data;          // [slots][slotBytes]
  uint64_t slotBytes;
  int slots;
};

// The channel src -> owner of `recvWs` on `lane` (flags and data are contiguous per slot).
__device__ __forceinline__ P2pLink p2pLink(void* recvWs, const WsLayout& w, int src, int lane) {
  char* b = static_cast<char*>(recvWs);
  return P2pLink{reinterpret_cast<uint64_t*>(b + wsReadyOffset(w, src, lane, 0)),
                 reinterpret_cast<uint64_t*>(b + wsConsumedOffset(w, src, lane, 0)),
                 b + wsDataOffset(w, src, lane, 0), w.slotBytes, w.slots};
}
// ws[q]: workspace of local rank q (c.peers, or a shared-memory copy of it).
__device__ __forceinline__ P2pLink sendLink(const CommDev& c, void* const* ws, int q, int lane) {
  return p2pLink(ws[q], c.ws, c.me, lane);
}
__device__ __forceinline__ P2pLink recvLink(const CommDev& c, void* const* ws, int q, int lane) {
  return p2pLink(ws[c.me], c.ws, q, lane);
}

__device__ __forceinline__ int chanSlot(const P2pLink& l, uint64_t k) {
  return (int)(k % (uint64_t)l.slots);
}
__device__ __forceinline__ char* slotData(const P2pLink& l, uint64_t k) {
  return l.data + l.slotBytes * (uint64_t)chanSlot(l, k);
}

// Non-blocking probes (engines that poll many channels at once).
__device__ __forceinline__ bool canSend(const P2pLink& l, uint64_t k) {
  return !chanNeedsFree(k, l.slots) ||
         ptx::ldAcquireSys(l.consumed + chanSlot(l, k)) >= chanFree(k, l.slots);
}
__device__ __forceinline__ bool canRecv(const P2pLink& l, uint64_t k) {
  return ptx::ldAcquireSys(l.ready + chanSlot(l, k)) >= chanReady(k);
}

// The error-record site of a wait on channel message k with local peer `peer`.
__device__ __forceinline__ rt::ErrSite chanSite(int op, int peer, int lane, const P2pLink& l,
                                                uint64_t k, bool send) {
  return rt::ErrSite{
      op, peer, lane, chanSlot(l, k), send ? rt::kWaitSlot : rt::kWaitData, rt::kErrPeerLocal};
}

// Bounded waits (one thread): false once the comm failed (recorded, or failed earlier).
__device__ __forceinline__ bool acquire(const CommDev& c, const P2pLink& l, uint64_t k, int op,
                                        int peer, int lane) {
  if (!chanNeedsFree(k, l.slots)) return true;
  return rt::waitGe(c.w, l.consumed + chanSlot(l, k), chanFree(k, l.slots),
                    chanSite(op, peer, lane, l, k, true));
}
__device__ __forceinline__ bool receive(const CommDev& c, const P2pLink& l, uint64_t k, int op,
                                        int peer, int lane) {
  return rt::waitGe(c.w, l.ready + chanSlot(l, k), chanReady(k),
                    chanSite(op, peer, lane, l, k, false));
}

// A flag of local peer `peer` outside the channels (the zero-copy AllReduce's handshake):
// its data (slotFree false) or the release of something of ours (slotFree true).
__device__ __forceinline__ bool waitPeer(const CommDev& c, const uint64_t* flag, uint64_t target,
                                         int peer, int op, int lane, int slot, bool slotFree) {
  return rt::waitGe(c.w, flag, target,
                    rt::ErrSite{op, peer, lane, slot, slotFree ? rt::kWaitSlot : rt::kWaitData,
                                rt::kErrPeerLocal});
}

// The caller made the slot's data (publish) or its reads (release) precede these with
// ptx::fenceAcqRelSys() after a barrier of the threads that touched it.
__device__ __forceinline__ void publish(const P2pLink& l, uint64_t k) {
  ptx::stReleaseSys(l.ready + chanSlot(l, k), chanReady(k));
}
__device__ __forceinline__ void release(const P2pLink& l, uint64_t k) {
  ptx::stReleaseSys(l.consumed + chanSlot(l, k), chanReady(k));
}

}  // namespace dev
}  // namespace mk
