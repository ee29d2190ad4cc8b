// Device-side producer of the proxy command ring (protocol in proxy_ring.h).
// One thread per command: call from a single lane (e.g. lane 0 of the sending warp).
#pragma once
#include <stdint.h>

#include "device/rt/wait.cuh"
#include "transport/proxy_ring.h"
#include "transport/proxy_ring_dev.h"

namespace mk {

__device__ __forceinline__ ProxyCmd proxyCmd(uint32_t op, uint32_t sigOp, uint64_t peer,
                                             uint64_t srcOff, uint64_t dstOff, uint64_t bytes,
                                             uint64_t slot, uint64_t value) {
  ProxyCmd c;
  c.valid = 0, c.op = op, c.sigOp = sigOp, c.peer = peer, c.srcOff = srcOff;
  c.dstOff = dstOff, c.bytes = bytes, c.slot = slot, c.value = value;
  return c;
}

// The device words of a GPU ring (proxy_ring_dev.h): the view's tail is their first.
__device__ __forceinline__ ProxyRingDevWords* proxyRingDevWords(const ProxyRingView& r) {
  return reinterpret_cast<ProxyRingDevWords*>(r.tail);
}

// Raises a device copy of a host counter to v, a value the counter had (proxy_ring_dev.h).
// The fence makes the relaxed atomic a release: a producer that reads the copy with acquire
// is ordered after what this thread's acquire of the host word ordered (the proxy's reads
// of the slot, its sends of the source data).
__device__ __forceinline__ void proxyRingRaiseSeen(uint64_t* seen, uint64_t v) {
  __threadfence();
  atomicMax(reinterpret_cast<unsigned long long*>(seen), (unsigned long long)v);
}

// Pushes cmd (its valid field is ignored). A free slot is first looked for in the device
// copy of head (no PCIe read: the ring is rarely full, and one read of head frees a whole
// lap of tickets for every producer); only when the copy says the ring may be full does the
// producer poll head itself, in the bounded wait of `w` (abort flag, earlier failure,
// deadline) that also ends when the proxy stops (the ring's abort word). Waiting producers
// back off (32 ns doubling to 2 us): hundreds of warps polling head across PCIe would slow
// down the very consumer they wait for.
// Returns rt::kErrNone once pushed, else the ErrKind (kErrProxy: the ring was aborted) with
// the time waited in *waitedNs.
__device__ __forceinline__ uint32_t proxyRingPush(const ProxyRingView& r, const ProxyCmd& cmd,
                                                  const rt::WaitCtx& w, uint64_t* waitedNs) {
  unsigned long long t = atomicAdd(reinterpret_cast<unsigned long long*>(r.tail), 1ull);
  uint64_t* headSeen = &proxyRingDevWords(r)->headSeen;
  if (t >= ptx::ldAcquireGpu(headSeen) + r.nslots) {
    rt::Spin spin(32, 2048);
    uint64_t head;
    while (t >= (head = ptx::ldAcquireSys(r.head)) + r.nslots) {
      uint32_t kind = spin.check(w);
      if (kind == rt::kErrNone && (spin.n % rt::kSpinCheck) == 0 &&
          ptx::ldVolatile32(r.abort) != 0u)
        kind = rt::kErrProxy;
      if (kind != rt::kErrNone) {
        *waitedNs = spin.waited();
        return kind;
      }
    }
    proxyRingRaiseSeen(headSeen, head);
  }
  ProxyCmd* s = &r.slots[t & (r.nslots - 1)];
  // Plain stores for the body: the release store below orders them before valid for
  // any observer that acquires valid (the proxy thread, over PCIe / C2C).
  volatile uint64_t* b = reinterpret_cast<volatile uint64_t*>(s);
  b[1] = (uint64_t)cmd.op | ((uint64_t)cmd.sigOp << 32);
  b[2] = cmd.peer;
  b[3] = cmd.srcOff;
  b[4] = cmd.dstOff;
  b[5] = cmd.bytes;
  b[6] = cmd.slot;
  b[7] = cmd.value;
  ptx::stReleaseSys(&s->valid, (uint64_t)t + 1);
  return rt::kErrNone;
}

// Source data of every command with ticket < proxyRingDone() has left the GPU buffer.
__device__ __forceinline__ uint64_t proxyRingDone(const ProxyRingView& r) {
  return ptx::ldAcquireSys(r.done);
}

// Whether every ticket below `need` is done by the device copy of done: true is final (the
// copy never runs ahead of done), false means "read done itself" (proxyRingDone), then
// proxyRingNoteDone with what it said, so that later waiters find it in the copy.
__device__ __forceinline__ bool proxyRingDoneSeen(const ProxyRingView& r, uint64_t need) {
  return ptx::ldAcquireGpu(&proxyRingDevWords(r)->doneSeen) >= need;
}
__device__ __forceinline__ void proxyRingNoteDone(const ProxyRingView& r, uint64_t done) {
  proxyRingRaiseSeen(&proxyRingDevWords(r)->doneSeen, done);
}

}  // namespace mk
