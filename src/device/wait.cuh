// Bounded waits and the error record. Every device wait loop goes through Spin::check:
// every kSpinCheck spins it polls the comm's abort flag (host-mapped), the comm's sticky
// failure word (another CTA already gave up) and the deadline (MKERNEL_TIMEOUT_MS against
// %globaltimer). On timeout or abort the first CTA to notice fills the error record in
// host-mapped memory; every kernel of the comm then returns - never `trap`, which would
// poison the CUDA context of every rank sharing the GPU.
#pragma once
#include <cstdint>

#include "coll/launch.h"
#include "device/ptx.cuh"

namespace mk {
namespace dev {

constexpr uint32_t kSpinCheck = 1024;
constexpr uint32_t kQuit = 0xffffffffu;  // another CTA recorded the error: just leave

// Records the comm's first error (device-scope CAS on the failure word elects the writer),
// then publishes the host-mapped record: body, fence, release of `valid`.
static __device__ __noinline__ void recordError(const CommDev& c, uint32_t code, int peer, int coll,
                                                int lane, int slot, int waitSend, uint64_t seq,
                                                uint64_t waitedNs) {
  if (atomicCAS(&c.hdr->failed, 0u, code) != 0u) return;
  volatile ErrRecord* e = c.err;
  e->code = code;
  e->peer = peer;
  e->coll = coll;
  e->lane = lane;
  e->slot = slot;
  e->waitSend = waitSend;
  e->seq = seq;
  e->opCount = c.hdr->opCount;
  e->waitedNs = waitedNs;
  __threadfence_system();
  stReleaseSys32((uint32_t*)&c.err->valid, 1u);
}

__device__ __forceinline__ bool commFailed(const CommDev& c) {
  return ldRelaxedGpu32(&c.hdr->failed) != 0u;
}

// Spin state of one waiting thread.
struct Spin {
  uint64_t t0 = 0;
  uint32_t n = 0;
  // 0: keep spinning; kErrAbort/kErrTimeout: record it; kQuit: leave silently.
  __device__ __forceinline__ uint32_t check(const CommDev& c) {
    if ((++n % kSpinCheck) != 0) return 0;
    if (ldVolatile32(c.abortFlag) != 0u) return kErrAbort;
    if (commFailed(c)) return kQuit;
    uint64_t now = globalTimerNs();
    if (t0 == 0) {
      t0 = now;
    } else if (now - t0 > c.timeoutNs) {
      return kErrTimeout;
    }
    return 0;
  }
  __device__ __forceinline__ uint64_t waited() const { return t0 ? globalTimerNs() - t0 : 0; }
};

// Waits until *flag >= target. Returns false (after recording the error when this thread
// is the first) on abort, timeout or an earlier failure of the comm.
__device__ __forceinline__ bool waitGe(const CommDev& c, const uint64_t* flag, uint64_t target,
                                       int peer, int coll, int lane, int slot, int waitSend) {
  Spin s;
  while (ldAcquireSys(flag) < target) {
    uint32_t code = s.check(c);
    if (code == 0) continue;
    if (code != kQuit) recordError(c, code, peer, coll, lane, slot, waitSend, target, s.waited());
    return false;
  }
  return true;
}

// Workspace addresses (ws = base pointer of the workspace that holds them).
__device__ __forceinline__ uint64_t* readyFlag(void* ws, const WsLayout& w, int src, int lane,
                                               int slot) {
  return (uint64_t*)((char*)ws + wsReadyOffset(w, src, lane, slot));
}
__device__ __forceinline__ uint64_t* consumedFlag(void* ws, const WsLayout& w, int src, int lane,
                                                  int slot) {
  return (uint64_t*)((char*)ws + wsConsumedOffset(w, src, lane, slot));
}
__device__ __forceinline__ char* slotData(void* ws, const WsLayout& w, int src, int lane,
                                          int slot) {
  return (char*)ws + wsDataOffset(w, src, lane, slot);
}

// Last CTA of the grid to finish advances the comm's operation counter (error records
// quote it). Called by thread 0 of every CTA that completed its work.
__device__ __forceinline__ void finishCta(const CommDev& c) {
  __threadfence();
  uint32_t prev = atomicAdd(&c.hdr->ctaDone, 1u);
  if (prev == gridDim.x - 1) {
    c.hdr->ctaDone = 0;
    c.hdr->opCount = c.hdr->opCount + 1;
    __threadfence();
  }
}

}  // namespace dev
}  // namespace mk
