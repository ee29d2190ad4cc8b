// Device-side producer of the proxy command ring (protocol in proxy_ring.h).
// One thread per command: call from a single lane (e.g. lane 0 of the sending warp).
#pragma once
#include <stdint.h>

#include "transport/proxy_ring.h"

namespace mk {

enum ProxyPushResult : int { kPushOk = 0, kPushAborted = 1, kPushTimeout = 2 };

__device__ __forceinline__ uint64_t proxyLdAcquireSys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t proxyLdVolatile(const uint32_t* p) {
  return *(const volatile uint32_t*)p;
}
__device__ __forceinline__ void proxyStReleaseSys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Pushes cmd (its valid field is ignored). timeoutCycles: deadline of the wait for a
// free slot, in clock64() cycles (derived by the caller from MKERNEL_TIMEOUT_MS and the
// clock rate read at runtime). The abort flag is checked every 64 polls (backed off).
__device__ __forceinline__ int proxyRingPush(const ProxyRingView& r, const ProxyCmd& cmd,
                                             uint64_t timeoutCycles) {
  unsigned long long t = atomicAdd(reinterpret_cast<unsigned long long*>(r.tail), 1ull);
  long long start = clock64();
  // Waiting producers back off: hundreds of warps polling head across PCIe would slow
  // down the very consumer they wait for.
  uint32_t backoffNs = 32;
  for (uint32_t spin = 0; t >= proxyLdAcquireSys(r.head) + r.nslots; spin++) {
    if ((spin & 63) == 63) {
      if (proxyLdVolatile(r.abort)) return kPushAborted;
      if ((uint64_t)(clock64() - start) > timeoutCycles) return kPushTimeout;
    }
    __nanosleep(backoffNs);
    if (backoffNs < 2048) backoffNs <<= 1;
  }
  ProxyCmd* s = &r.slots[t & (r.nslots - 1)];
  // Plain stores for the body: the release store below orders them before valid for
  // any observer that acquires valid (the proxy thread, over PCIe / C2C).
  volatile uint64_t* w = reinterpret_cast<volatile uint64_t*>(s);
  w[1] = (uint64_t)cmd.op | ((uint64_t)cmd.sigOp << 32);
  w[2] = cmd.peer;
  w[3] = cmd.srcOff;
  w[4] = cmd.dstOff;
  w[5] = cmd.bytes;
  w[6] = cmd.slot;
  w[7] = cmd.value;
  proxyStReleaseSys(&s->valid, (uint64_t)t + 1);
  return kPushOk;
}

__device__ __forceinline__ int proxyPut(const ProxyRingView& r, uint64_t peer, uint64_t srcOff,
                                        uint64_t dstOff, uint64_t bytes, uint64_t timeoutCycles) {
  ProxyCmd c;
  c.valid = 0, c.op = kProxyPut, c.sigOp = 0, c.peer = peer, c.srcOff = srcOff;
  c.dstOff = dstOff, c.bytes = bytes, c.slot = 0, c.value = 0;
  return proxyRingPush(r, c, timeoutCycles);
}

__device__ __forceinline__ int proxyPutSignal(const ProxyRingView& r, uint64_t peer,
                                              uint64_t srcOff, uint64_t dstOff, uint64_t bytes,
                                              uint64_t slot, uint64_t value, uint32_t sigOp,
                                              uint64_t timeoutCycles) {
  ProxyCmd c;
  c.valid = 0, c.op = kProxyPutSignal, c.sigOp = sigOp, c.peer = peer, c.srcOff = srcOff;
  c.dstOff = dstOff, c.bytes = bytes, c.slot = slot, c.value = value;
  return proxyRingPush(r, c, timeoutCycles);
}

__device__ __forceinline__ int proxySignal(const ProxyRingView& r, uint64_t peer, uint64_t slot,
                                           uint64_t value, uint32_t sigOp, uint64_t timeoutCycles) {
  ProxyCmd c;
  c.valid = 0, c.op = kProxySignal, c.sigOp = sigOp, c.peer = peer, c.srcOff = 0;
  c.dstOff = 0, c.bytes = 0, c.slot = slot, c.value = value;
  return proxyRingPush(r, c, timeoutCycles);
}

// Source data of every command with ticket < proxyRingDone() has left the GPU buffer.
__device__ __forceinline__ uint64_t proxyRingDone(const ProxyRingView& r) {
  return proxyLdAcquireSys(r.done);
}

}  // namespace mk
