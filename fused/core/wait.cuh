// Bounded device waits for fused kernels: every flag wait polls the host-mapped abort flag
// and the shared error record every kPollInterval spins and gives up at a deadline measured
// in SM clock cycles (MKERNEL_TIMEOUT_MS x clock rate, converted on the host). On failure it
// writes the error record and returns false; the caller unwinds and returns. Never trap:
// a trap poisons the CUDA context for every other user of the device.
#pragma once

#include <cstdint>
#include "fused/core/types.h"
#include "fused/gemm/ptx.cuh"

namespace mk {
namespace fused {

constexpr uint32_t kPollInterval = 4096;
// Used when a WaitCtx carries no timeout (e.g. zero-initialised hooks): ~60 s at 2 GHz.
constexpr uint64_t kDefaultTimeoutCycles = 120ull * 1000 * 1000 * 1000;

__device__ __forceinline__ bool failed(const WaitCtx& ctx) {
  if (ctx.abortFlag != nullptr && *ctx.abortFlag != 0) return true;
  if (ctx.err != nullptr && *reinterpret_cast<volatile int32_t*>(&ctx.err->code) != 0) return true;
  return false;
}

// Claims the error record (first failure wins) and publishes it to the host.
// Scalar arguments (no struct by reference) so calling it never forces a stack frame.
static __device__ __noinline__ void recordErrorRaw(ErrorRecord* err, int32_t code, int32_t rank,
                                                   int32_t peer, int32_t op, uint64_t seq,
                                                   int32_t slot) {
  if (err == nullptr) return;
  if (atomicCAS(&err->claimed, 0u, 1u) != 0u) return;
  err->rank = rank;
  err->peer = peer;
  err->op = op;
  err->slot = slot;
  err->seq = seq;
  __threadfence_system();
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(&err->code), "r"(code) : "memory");
}

__device__ __forceinline__ void recordError(const WaitCtx& ctx, int32_t code, int32_t peer,
                                            uint64_t seq, int32_t slot) {
  recordErrorRaw(ctx.err, code, ctx.rank, peer, ctx.op, seq, slot);
}

// Waits until *flag >= expected (64-bit sequence numbers, never reset by the host).
// `sys` picks system-scope acquire (flag written by another GPU or the host).
// Returns false after recording timeout/abort; the caller must stop and return.
__device__ __forceinline__ bool waitGe(const uint64_t* flag, uint64_t expected, const WaitCtx& ctx,
                                       int32_t peer, int32_t slot, bool sys = false) {
  uint64_t v = sys ? ptx::ldAcquireSys(flag) : ptx::ldAcquireGpu(flag);
  if (v >= expected) return true;
  const uint64_t limit = ctx.timeoutCycles ? ctx.timeoutCycles : kDefaultTimeoutCycles;
  const uint64_t start = clock64();
  uint32_t spins = 0;
  while (true) {
    v = sys ? ptx::ldAcquireSys(flag) : ptx::ldAcquireGpu(flag);
    if (v >= expected) return true;
    if (++spins == kPollInterval) {
      spins = 0;
      if (ctx.abortFlag != nullptr && *ctx.abortFlag != 0) {
        recordError(ctx, kErrAbort, peer, expected, slot);
        return false;
      }
      if (ctx.err != nullptr && *reinterpret_cast<volatile int32_t*>(&ctx.err->code) != 0) {
        return false;  // someone else failed first; their record stands
      }
      if (static_cast<uint64_t>(clock64() - start) > limit) {
        recordError(ctx, kErrTimeout, peer, expected, slot);
        return false;
      }
    }
    __nanosleep(32);
  }
}

// Publishes a per-tile / per-slot sequence number after the data it guards is globally
// visible (the caller has fenced: TMA stores waited with wait_group 0 + fence.proxy.async).
__device__ __forceinline__ void releaseFlag(uint64_t* flag, uint64_t value, bool sys) {
  if (sys) {
    ptx::stReleaseSys(flag, value);
  } else {
    ptx::stReleaseGpu(flag, value);
  }
}

}  // namespace fused
}  // namespace mk
