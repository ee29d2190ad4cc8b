// The one bounded device wait. Every wait loop of mkernel (collectives, the device
// communication API, the proxy ring, fused roles) spins through Spin::check: every
// kSpinCheck spins it polls the abort flag (host-mapped), the domain's sticky failure word
// (another CTA, kernel or peer failed first) and the deadline (WaitCtx::timeoutNs against
// %globaltimer, the one time base). On timeout or abort the first waiter of the domain
// fills the error record (err.h); every other one leaves silently. Never `trap`: it would
// poison the CUDA context of every rank sharing the GPU.
#pragma once
#include <cstdint>

#include "device/rt/err.h"
#include "device/rt/ptx.cuh"

namespace mk {
namespace rt {

constexpr uint32_t kSpinCheck = 1024;
// Deadline of a context that carries none (a zero-initialised WaitCtx): the default of
// MKERNEL_TIMEOUT_MS, so that even a forgotten context cannot wait forever.
constexpr uint64_t kDefaultTimeoutNs = 300ull * 1000 * 1000 * 1000;

// Where a wait happened, for its error record.
struct ErrSite {
  int32_t op;    // ErrOp
  int32_t peer;  // rank (or local index, with kErrPeerLocal) waited for; -1: none
  int32_t lane;
  int32_t slot;
  int32_t wait;  // ErrWait
  uint32_t flags;
};

// Records the domain's first failure (device-scope CAS on hdr->failed elects the writer),
// then publishes the host-mapped record: body, fence, release of `valid`. Scalar
// arguments, so that a register-starved caller (the GEMM producer) needs no stack frame.
static __device__ __noinline__ void recordErrorRaw(CtlHdr* hdr, ErrRecord* err, uint32_t kind,
                                                   int32_t rank, int32_t op, int32_t peer,
                                                   int32_t lane, int32_t slot, int32_t wait,
                                                   uint32_t flags, uint64_t seq,
                                                   uint64_t waitedNs) {
  if (hdr == nullptr || atomicCAS(&hdr->failed, 0u, kind) != 0u) return;
  volatile ErrRecord* e = err;
  e->kind = kind;
  e->op = op;
  e->rank = rank;
  e->peer = peer;
  e->lane = lane;
  e->slot = slot;
  e->wait = wait;
  e->flags = flags;
  e->seq = seq;
  e->opCount = hdr->opCount;
  e->waitedNs = waitedNs;
  __threadfence_system();
  ptx::stReleaseSys32(&err->valid, 1u);
}

__device__ __forceinline__ void recordError(const WaitCtx& w, uint32_t kind, const ErrSite& s,
                                            uint64_t seq, uint64_t waitedNs) {
  recordErrorRaw(w.hdr, w.err, kind, w.rank, s.op, s.peer, s.lane, s.slot, s.wait, s.flags, seq,
                 waitedNs);
}

// The domain failed (this kernel or an earlier one): peers are out of step, leave.
__device__ __forceinline__ bool failed(const WaitCtx& w) {
  return w.hdr != nullptr && ptx::ldRelaxedGpu32(&w.hdr->failed) != 0u;
}

// The same verdict for every thread of the CTA (thread 0 reads the flag): a kernel that
// leaves at its start when the domain failed must not lose only some of its warps, which the
// others would then wait for at the first barrier. Every thread of the CTA must call it.
__device__ __forceinline__ bool ctaFailed(const WaitCtx& w) {
  return __syncthreads_or(threadIdx.x == 0 && failed(w)) != 0;
}

// Spin state of one waiting thread. Optional back-off: __nanosleep from sleepNs, doubling
// up to maxSleepNs (waiters polling across PCIe must not slow down what they wait for).
struct Spin {
  uint64_t t0 = 0;
  uint32_t n = 0;
  uint32_t sleepNs, maxSleepNs;
  __device__ __forceinline__ explicit Spin(uint32_t sleep0 = 0, uint32_t maxSleep = 0)
      : sleepNs(sleep0), maxSleepNs(maxSleep > sleep0 ? maxSleep : sleep0) {}
  // One more spin. 0: keep spinning; kErrAbort / kErrTimeout: record it and leave;
  // kErrPeerFailed: the domain failed elsewhere first, leave without recording.
  __device__ __forceinline__ uint32_t check(const WaitCtx& w) {
    if (sleepNs != 0) {
      __nanosleep(sleepNs);
      if (sleepNs < maxSleepNs) sleepNs = sleepNs * 2 < maxSleepNs ? sleepNs * 2 : maxSleepNs;
    }
    if ((++n % kSpinCheck) != 0) return kErrNone;
    if (w.abortFlag != nullptr && ptx::ldVolatile32(w.abortFlag) != 0u) return kErrAbort;
    if (failed(w)) return kErrPeerFailed;
    const uint64_t now = ptx::globalTimerNs();
    if (t0 == 0) {
      t0 = now;
    } else if (now - t0 > (w.timeoutNs != 0 ? w.timeoutNs : kDefaultTimeoutNs)) {
      return kErrTimeout;
    }
    return kErrNone;
  }
  // Records `kind` unless another waiter of the domain already did (kErrPeerFailed).
  __device__ __forceinline__ void fail(const WaitCtx& w, uint32_t kind, const ErrSite& s,
                                       uint64_t seq) const {
    if (kind != kErrPeerFailed) recordError(w, kind, s, seq, waited());
  }
  __device__ __forceinline__ uint64_t waited() const { return t0 ? ptx::globalTimerNs() - t0 : 0; }
};

enum Scope : int { kScopeGpu = 0, kScopeSys = 1 };

__device__ __forceinline__ uint64_t ldAcquire(const uint64_t* p, Scope scope) {
  return scope == kScopeSys ? ptx::ldAcquireSys(p) : ptx::ldAcquireGpu(p);
}

// Waits until *flag >= target (64-bit sequence numbers, never reset by the host). `scope`:
// kScopeSys for flags written by another GPU or the host, kScopeGpu for flags of this GPU.
// Returns false after recording timeout/abort (or when the domain failed first): the caller
// must stop and return.
__device__ __forceinline__ bool waitGe(const WaitCtx& w, const uint64_t* flag, uint64_t target,
                                       const ErrSite& site, Scope scope = kScopeSys,
                                       uint32_t sleepNs = 0) {
  Spin s(sleepNs);
  while (ldAcquire(flag, scope) < target) {
    const uint32_t kind = s.check(w);
    if (kind == kErrNone) continue;
    s.fail(w, kind, site, target);
    return false;
  }
  return true;
}

// A flag another role of this rank releases (tile done, rows ready): the record names
// w.op and the flag index. `sys`: the flag is written by another GPU or the host. Waiters
// sleep 32 ns per spin, leaving issue slots to the roles they wait for.
__device__ __forceinline__ bool waitFlag(const WaitCtx& w, const uint64_t* flag, uint64_t target,
                                         int32_t index, bool sys, int32_t peer = -1) {
  return waitGe(w, flag, target, ErrSite{w.op, peer, -1, index, kWaitFlag, 0},
                sys ? kScopeSys : kScopeGpu, 32);
}

// Publishes a flag after the data it guards is visible at its scope (the caller fenced: a
// TMA store is waited with bulkWait<0> + fenceProxyAsync, generic stores with a fence).
__device__ __forceinline__ void releaseFlag(uint64_t* flag, uint64_t value, bool sys) {
  if (sys) {
    ptx::stReleaseSys(flag, value);
  } else {
    ptx::stReleaseGpu(flag, value);
  }
}

// Last CTA of the grid to finish advances the domain's operation counter (error records
// quote it). Called by thread 0 of every CTA that completed its work. Returns true in the
// last CTA (it may then publish what the whole grid did).
__device__ __forceinline__ bool finishCta(const WaitCtx& w) {
  __threadfence();
  const uint32_t prev = atomicAdd(&w.hdr->ctaDone, 1u);
  if (prev != gridDim.x - 1) return false;
  w.hdr->ctaDone = 0;
  w.hdr->opCount = w.hdr->opCount + 1;
  __threadfence();
  return true;
}

}  // namespace rt
}  // namespace mk
