#include "transport/proxy_ring.h"

#include <cstdint>
#include <cuda_runtime.h>
#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>

#include "base/checks.h"
#include "base/param.h"
#include "transport/proxy_ring_dev.h"

namespace mk {

static int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

ncclResult_t ProxyRing::create(uint64_t nslots, ProxyRingMem mem, ProxyRing** out) {
  if (nslots == 0) {
    int64_t p = MK_PARAM_INT(ProxyRingSlots);
    nslots = p > 0 ? (uint64_t)p : 1024;
  }
  MK_ARGCHECK(nslots <= (1ull << 24), "proxy ring: %llu slots is too many",
              (unsigned long long)nslots);
  uint64_t n = 1;
  while (n < nslots) n <<= 1;
  ProxyRing* r = new ProxyRing();
  r->mem_ = mem;
  size_t slotBytes = n * sizeof(ProxyCmd);
  if (mem == ProxyRingMem::kHost) {
    r->slotsAlloc_ = aligned_alloc(64, slotBytes);
    r->ctrAlloc_ = aligned_alloc(64, sizeof(ProxyRingCounters));
    if (!r->slotsAlloc_ || !r->ctrAlloc_) {
      delete r;
      MK_WARN("proxy ring: cannot allocate %zu bytes", slotBytes);
      return ncclSystemError;
    }
    memset(r->slotsAlloc_, 0, slotBytes);
    memset(r->ctrAlloc_, 0, sizeof(ProxyRingCounters));
    auto* c = static_cast<ProxyRingCounters*>(r->ctrAlloc_);
    r->host_ = {static_cast<ProxyCmd*>(r->slotsAlloc_), n, &c->tail, &c->head, &c->done, &c->abort};
    r->dev_ = r->host_;
  } else {
    ncclResult_t res = ncclSuccess;
    void *slotsDev = nullptr, *ctrDev = nullptr;
    CUDACHECKGOTO(cudaHostAlloc(&r->slotsAlloc_, slotBytes, cudaHostAllocMapped), res, fail);
    CUDACHECKGOTO(cudaHostAlloc(&r->ctrAlloc_, sizeof(ProxyRingCounters), cudaHostAllocMapped), res,
                  fail);
    // tail and the producers' copies of head and done (proxy_ring_dev.h), all 0 like the
    // host words.
    CUDACHECKGOTO(cudaMalloc(&r->tailDevAlloc_, sizeof(ProxyRingDevWords)), res, fail);
    CUDACHECKGOTO(cudaMemset(r->tailDevAlloc_, 0, sizeof(ProxyRingDevWords)), res, fail);
    CUDACHECKGOTO(cudaHostGetDevicePointer(&slotsDev, r->slotsAlloc_, 0), res, fail);
    CUDACHECKGOTO(cudaHostGetDevicePointer(&ctrDev, r->ctrAlloc_, 0), res, fail);
    memset(r->slotsAlloc_, 0, slotBytes);
    memset(r->ctrAlloc_, 0, sizeof(ProxyRingCounters));
    {
      auto* c = static_cast<ProxyRingCounters*>(r->ctrAlloc_);
      auto* cd = static_cast<ProxyRingCounters*>(ctrDev);
      // The host never reads tail of a device ring: the consumer follows valid words.
      r->host_ = {
          static_cast<ProxyCmd*>(r->slotsAlloc_), n, nullptr, &c->head, &c->done, &c->abort};
      r->dev_ = {static_cast<ProxyCmd*>(slotsDev),
                 n,
                 &static_cast<ProxyRingDevWords*>(r->tailDevAlloc_)->tail,
                 &cd->head,
                 &cd->done,
                 &cd->abort};
    }
    *out = r;
    return ncclSuccess;
  fail:
    delete r;
    return res;
  }
  *out = r;
  return ncclSuccess;
}

ProxyRing::~ProxyRing() {
  if (mem_ == ProxyRingMem::kHost) {
    free(slotsAlloc_);
    free(ctrAlloc_);
  } else {
    if (slotsAlloc_) cudaFreeHost(slotsAlloc_);
    if (ctrAlloc_) cudaFreeHost(ctrAlloc_);
    if (tailDevAlloc_) cudaFree(tailDevAlloc_);
  }
}

// Takes n consecutive tickets (one fetch_add) and waits, bounded and abortable, until the
// last of them has a free slot (then all have: slots free in ticket order). *t: the first.
static ncclResult_t reserveSlots(const ProxyRingView& r, uint64_t n, int64_t timeoutMs,
                                 uint64_t* tOut) {
  uint64_t t = __atomic_fetch_add(r.tail, n, __ATOMIC_RELAXED);
  *tOut = t;
  const uint64_t last = t + n - 1;
  int64_t deadline = 0;
  for (uint64_t spin = 0; last >= __atomic_load_n(r.head, __ATOMIC_ACQUIRE) + r.nslots; spin++) {
    if (__atomic_load_n(r.abort, __ATOMIC_RELAXED)) {
      MK_WARN("proxy ring: push aborted (ticket %llu)", (unsigned long long)t);
      return ncclRemoteError;
    }
    if ((spin & 255) == 255) {
      if (deadline == 0) deadline = nowMs() + timeoutMs;
      if (nowMs() > deadline) {
        MK_WARN("proxy ring: no free slot after %lld ms (ticket %llu, proxy stalled?)",
                (long long)timeoutMs, (unsigned long long)t);
        return ncclRemoteError;
      }
      sched_yield();
    }
  }
  return ncclSuccess;
}

// Writes a command's body into its slot, then its ticket with release: the consumer that
// acquires the valid word sees the whole body.
static void publishCmd(ProxyCmd* s, const ProxyCmd& cmd, uint64_t t) {
  s->op = cmd.op;
  s->sigOp = cmd.sigOp;
  s->peer = cmd.peer;
  s->srcOff = cmd.srcOff;
  s->dstOff = cmd.dstOff;
  s->bytes = cmd.bytes;
  s->slot = cmd.slot;
  s->value = cmd.value;
  __atomic_store_n(&s->valid, t + 1, __ATOMIC_RELEASE);
}

ncclResult_t ProxyRing::push(const ProxyCmd& cmd, int64_t timeoutMs) {
  MK_ARGCHECK(host_.tail != nullptr, "proxy ring: host push on a GPU ring");
  // An inline put of 9..64 bytes is a group header: alone, the consumer would take the next
  // command as its continuation.
  MK_ARGCHECK(proxyGroupSlots(cmd.op, cmd.bytes) == 1,
              "proxy ring: an inline put of %llu bytes needs pushInline (a group of slots)",
              (unsigned long long)cmd.bytes);
  const ProxyRingView& r = host_;
  uint64_t t = 0;
  NCCLCHECK(reserveSlots(r, 1, timeoutMs, &t));
  ProxyCmd* s = &r.slots[t & (r.nslots - 1)];
  publishCmd(s, cmd, t);
  return ncclSuccess;
}

ncclResult_t ProxyRing::pushInline(const ProxyCmd& cmd, const void* data, uint64_t bytes,
                                   int64_t timeoutMs) {
  MK_ARGCHECK(host_.tail != nullptr, "proxy ring: host push on a GPU ring");
  MK_ARGCHECK(bytes >= 1 && bytes <= kProxyInlineExtMax && data != nullptr,
              "proxy ring: inline put of %llu bytes (1..%llu)", (unsigned long long)bytes,
              (unsigned long long)kProxyInlineExtMax);
  ProxyCmd h = cmd;
  h.op |= kProxyInline;
  h.bytes = bytes;
  h.srcOff = 0;
  const char* src = static_cast<const char*>(data);
  memcpy(&h.srcOff, src, bytes < kProxyInlineMax ? bytes : kProxyInlineMax);
  const uint64_t n = proxyGroupSlots(h.op, bytes);
  if (n == 1) return push(h, timeoutMs);
  const ProxyRingView& r = host_;
  MK_ARGCHECK(n <= r.nslots, "proxy ring: a group of %llu slots in a ring of %llu",
              (unsigned long long)n, (unsigned long long)r.nslots);
  uint64_t t = 0;
  NCCLCHECK(reserveSlots(r, n, timeoutMs, &t));
  // Continuation slots first, the header last: the consumer needs all of them anyway (it
  // checks every valid word), this order only makes a waiting consumer's first look likelier
  // to find the group complete.
  for (uint64_t k = 1; k < n; k++) {
    ProxyCmd* s = &r.slots[(t + k) & (r.nslots - 1)];
    const uint64_t off = kProxyInlineMax + (k - 1) * kProxyContBytes;
    const uint64_t len = bytes - off < kProxyContBytes ? bytes - off : kProxyContBytes;
    char* body = reinterpret_cast<char*>(s) + sizeof(uint64_t);
    memset(body, 0, kProxyContBytes);
    memcpy(body, src + off, len);
    __atomic_store_n(&s->valid, t + k + 1, __ATOMIC_RELEASE);
  }
  publishCmd(&r.slots[t & (r.nslots - 1)], h, t);
  return ncclSuccess;
}

ncclResult_t ProxyRing::put(uint64_t peer, uint64_t srcOff, uint64_t dstOff, uint64_t bytes,
                            int64_t timeoutMs) {
  ProxyCmd c = {};
  c.op = kProxyPut;
  c.peer = peer, c.srcOff = srcOff, c.dstOff = dstOff, c.bytes = bytes;
  return push(c, timeoutMs);
}

ncclResult_t ProxyRing::putSignal(uint64_t peer, uint64_t srcOff, uint64_t dstOff, uint64_t bytes,
                                  uint64_t slot, uint64_t value, ProxySignalOp sigOp,
                                  int64_t timeoutMs) {
  ProxyCmd c = {};
  c.op = kProxyPutSignal;
  c.sigOp = sigOp;
  c.peer = peer, c.srcOff = srcOff, c.dstOff = dstOff, c.bytes = bytes;
  c.slot = slot, c.value = value;
  return push(c, timeoutMs);
}

ncclResult_t ProxyRing::signal(uint64_t peer, uint64_t slot, uint64_t value, ProxySignalOp sigOp,
                               int64_t timeoutMs) {
  ProxyCmd c = {};
  c.op = kProxySignal;
  c.sigOp = sigOp;
  c.peer = peer, c.slot = slot, c.value = value;
  return push(c, timeoutMs);
}

int ProxyRing::poll(ProxyCmd* out, int max, uint64_t* firstTicket) {
  const ProxyRingView& r = host_;
  *firstTicket = consumed_;
  stalled_ = false;
  int n = 0;
  while (n < max) {
    ProxyCmd* s = &r.slots[consumed_ & (r.nslots - 1)];
    if (__atomic_load_n(&s->valid, __ATOMIC_ACQUIRE) != consumed_ + 1) break;
    // The header is valid, so its op and bytes are its producer's (acquire above).
    // A group larger than the ring can never be complete (no producer makes one): the header
    // then comes out alone and the proxy rejects it as an incomplete group.
    const uint64_t g = proxyGroupSlots(s->op, s->bytes);
    if (g > 1 && g <= r.nslots) {
      // The whole group or nothing: a partial one stays for the next call (its producer is
      // writing the rest; one that gave up left the ring dead, as a hole does).
      if (g > (uint64_t)(max - n)) break;
      bool ready = true;
      for (uint64_t k = 1; k < g && ready; k++)
        ready = __atomic_load_n(&r.slots[(consumed_ + k) & (r.nslots - 1)].valid,
                                __ATOMIC_ACQUIRE) == consumed_ + k + 1;
      if (!ready) {
        stalled_ = true;
        break;
      }
      for (uint64_t k = 0; k < g; k++) out[n + k] = r.slots[(consumed_ + k) & (r.nslots - 1)];
      n += (int)g;
      consumed_ += g;
      continue;
    }
    out[n] = *s;
    n++;
    consumed_++;
  }
  // One release store per batch: producers waiting for space see the slots free only
  // after we finished copying them.
  if (n) __atomic_store_n(r.head, consumed_, __ATOMIC_RELEASE);
  return n;
}

bool ProxyRing::stalledGroup(uint64_t* ticket) const {
  *ticket = consumed_;
  return stalled_;
}

void ProxyRing::setDone(uint64_t ticket) {
  if (ticket > __atomic_load_n(host_.done, __ATOMIC_RELAXED))
    __atomic_store_n(host_.done, ticket, __ATOMIC_RELEASE);
}
uint64_t ProxyRing::done() const {
  return __atomic_load_n(host_.done, __ATOMIC_ACQUIRE);
}
void ProxyRing::setAbort() {
  __atomic_store_n(host_.abort, 1u, __ATOMIC_RELEASE);
}
bool ProxyRing::aborted() const {
  return __atomic_load_n(host_.abort, __ATOMIC_ACQUIRE) != 0;
}
uint64_t ProxyRing::tail() const {
  return host_.tail ? __atomic_load_n(host_.tail, __ATOMIC_ACQUIRE) : consumed_;
}

}  // namespace mk
