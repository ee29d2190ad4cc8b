// The slot-FIFO channel protocol of device/chan.cuh over the device communication API
// (devcomm.cuh), for channels whose ends may be on different nodes: message k lands in the
// receiver's window with put_signal(..., dataSlot, chanReady(k)); the receiver frees its
// slot with signal(sender, ackSlot, chanReady(k)). The slot offsets in the window are the
// caller's (they depend on its window layout); the counting is the protocol's.
// A channel's data slot is written by its sender only and its ack slot by its receiver only,
// for the comm's lifetime, so the waits may name that writer (kOneWriter: wait_signal_from,
// one word polled; false: wait_signal, for kernels that cannot afford its registers).
// Every call is made by the whole group G and returns false once the comm failed.
#pragma once
#include <cstdint>

#include "device/chan.cuh"
#include "device/net/devcomm.cuh"

namespace mk {
namespace dev {

// Sender: wait until the slot of message k is free (the receiver acknowledged message
// k - slots); `peer`, the receiver, is the only writer of ackSlot.
template <class G = net::Block, bool kOneWriter = true>
__device__ __forceinline__ bool netAcquire(const NetDev& d, uint32_t ackSlot, uint64_t k,
                                           uint64_t slots, int peer) {
  if (!chanNeedsFree(k, slots)) return true;
  if constexpr (kOneWriter) return net::wait_signal_from<G>(d, ackSlot, chanFree(k, slots), peer);
  return net::wait_signal<G>(d, ackSlot, chanFree(k, slots), peer);
}
// Sender: put message k (bytes of src) at dstOff of the peer's window and publish it.
// kInl: the kernel carries the small-put path (devcomm.cuh putRemote).
template <class G = net::Block, bool kInl = false>
__device__ __forceinline__ bool netPublish(const NetDev& d, const void* src, int peer,
                                           uint64_t dstOff, uint64_t bytes, uint32_t dataSlot,
                                           uint64_t k) {
  return net::put_signal<G, kInl>(d, src, peer, dstOff, bytes, dataSlot, chanReady(k));
}
// Receiver: wait until message k from `peer` (the only writer of dataSlot) has landed.
template <class G = net::Block, bool kOneWriter = true>
__device__ __forceinline__ bool netReceive(const NetDev& d, uint32_t dataSlot, uint64_t k,
                                           int peer) {
  if constexpr (kOneWriter) return net::wait_signal_from<G>(d, dataSlot, chanReady(k), peer);
  return net::wait_signal<G>(d, dataSlot, chanReady(k), peer);
}
// Receiver: message k from `peer` is read; its slot may be reused. The sender needs this
// only `slots` messages later, so across nodes the ack may wait for the next batch to the
// peer (kSignalLazy).
template <class G = net::Block>
__device__ __forceinline__ bool netRelease(const NetDev& d, int peer, uint32_t ackSlot,
                                           uint64_t k) {
  return net::signal<G>(d, peer, ackSlot, chanReady(k), kSignalSet | kSignalLazy);
}

}  // namespace dev
}  // namespace mk
