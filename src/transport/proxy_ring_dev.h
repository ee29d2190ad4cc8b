// Device-memory words of a GPU proxy ring (ProxyRingMem::kCudaMapped). The device view's
// `tail` points at ProxyRingDevWords::tail, so a producer reaches the other words from the
// view alone (proxy_ring.cuh) and the view's layout, which every kernel argument carrying a
// NetDev shares, stays as it is.
//
// headSeen / doneSeen: the producers' copies of the ring's head and done words, which live
// in host memory (one PCIe round trip per read). Each holds a value its host word had at
// some point; both host words only grow, so a copy is never ahead of its word and a
// producer that finds its answer in the copy (a free slot, a completed ticket) is right
// without crossing PCIe. Producers read the host word only when the copy is not enough,
// then raise the copy (atomic max, after a fence: a release for the producers that read it
// with acquire).
#pragma once
#include <cstddef>
#include <cstdint>

namespace mk {

struct ProxyRingDevWords {
  alignas(64) uint64_t tail;      // next ticket (device atomics of every producer)
  alignas(64) uint64_t headSeen;  // <= head
  alignas(64) uint64_t doneSeen;  // <= done
};
static_assert(offsetof(ProxyRingDevWords, tail) == 0, "the view's tail is the block's start");

}  // namespace mk
