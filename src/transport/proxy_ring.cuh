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
// Takes n consecutive tickets with one atomic and waits (as above) until the LAST of them has
// a free slot; slots free in ticket order, so then every one of them is free.
__device__ __forceinline__ uint32_t proxyRingReserve(const ProxyRingView& r, uint64_t n,
                                                     const rt::WaitCtx& w, uint64_t* waitedNs,
                                                     uint64_t* tOut) {
  unsigned long long t =
      atomicAdd(reinterpret_cast<unsigned long long*>(r.tail), (unsigned long long)n);
  *tOut = t;
  const uint64_t last = (uint64_t)t + n - 1;
  uint64_t* headSeen = &proxyRingDevWords(r)->headSeen;
  if (last >= ptx::ldAcquireGpu(headSeen) + r.nslots) {
    rt::Spin spin(32, 2048);
    uint64_t head;
    while (last >= (head = ptx::ldAcquireSys(r.head)) + r.nslots) {
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
  return rt::kErrNone;
}

// The body of a command slot, plain stores: a later release store of this thread orders them
// before the valid word for any observer that acquires it (the proxy thread, over PCIe / C2C).
__device__ __forceinline__ void proxyRingWriteBody(ProxyCmd* s, const ProxyCmd& cmd) {
  volatile uint64_t* b = reinterpret_cast<volatile uint64_t*>(s);
  b[1] = (uint64_t)cmd.op | ((uint64_t)cmd.sigOp << 32);
  b[2] = cmd.peer;
  b[3] = cmd.srcOff;
  b[4] = cmd.dstOff;
  b[5] = cmd.bytes;
  b[6] = cmd.slot;
  b[7] = cmd.value;
}

// One slot: never an inline put of 9..64 bytes (proxyGroupSlots > 1: its bytes need the group
// proxyRingPushInline writes; alone, the consumer would take the next command as its
// continuation). The callers in devcomm.cuh route those sizes to proxyRingPushInline.
__device__ __forceinline__ uint32_t proxyRingPush(const ProxyRingView& r, const ProxyCmd& cmd,
                                                  const rt::WaitCtx& w, uint64_t* waitedNs) {
  uint64_t t = 0;
  const uint32_t kind = proxyRingReserve(r, 1, w, waitedNs, &t);
  if (kind != rt::kErrNone) return kind;
  ProxyCmd* s = &r.slots[t & (r.nslots - 1)];
  proxyRingWriteBody(s, cmd);
  ptx::stReleaseSys(&s->valid, t + 1);
  return rt::kErrNone;
}

// Pushes an inline put of kProxyInlineMax+1..kProxyInlineExtMax bytes (proxy_ring.h): cmd is
// its header (kProxyInline set, srcOff = data word 0, bytes), `words` the data as
// kProxyInlineExtMax / 8 words, zero past bytes (words[1..]: the continuation slots' payload,
// 7 words per slot; loops of compile-time bounds so that words stays in registers).
// One thread, one atomic for the group's tickets, ONE system-scope release: the continuation
// slots (body and valid word, plain stores) are written before the header's body and its
// release, which orders them for the proxy, who acquires the header's valid word first and
// the rest after. The ring must have at least proxyGroupSlots(..) slots (NetDev::inlineCmd
// == 2 says so).
__device__ __forceinline__ uint32_t proxyRingPushInline(const ProxyRingView& r, const ProxyCmd& cmd,
                                                        const uint64_t* words, const rt::WaitCtx& w,
                                                        uint64_t* waitedNs) {
  const uint64_t n = proxyGroupSlots(cmd.op, cmd.bytes);
  uint64_t t = 0;
  const uint32_t kind = proxyRingReserve(r, n, w, waitedNs, &t);
  if (kind != rt::kErrNone) return kind;
  constexpr int kWords = (int)(kProxyInlineExtMax / 8), kCont = (int)(kProxyContBytes / 8);
#pragma unroll
  for (int k = 1; k < (int)kProxyGroupMaxSlots; k++) {
    if ((uint64_t)k >= n) break;
    volatile uint64_t* b = reinterpret_cast<volatile uint64_t*>(&r.slots[(t + k) & (r.nslots - 1)]);
#pragma unroll
    for (int j = 0; j < kCont; j++) {
      const int wi = 1 + (k - 1) * kCont + j;
      b[1 + j] = wi < kWords ? words[wi] : 0;
    }
    b[0] = t + k + 1;  // valid: ordered by the header's release below
  }
  ProxyCmd* s = &r.slots[t & (r.nslots - 1)];
  proxyRingWriteBody(s, cmd);
  ptx::stReleaseSys(&s->valid, t + 1);
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
