// Device half of the fused operators' comm view (fused_comm.h): the call number of a launch.
#pragma once
#include <cstdint>

#include "device/rt/wait.cuh"
#include "fused/core/fused_comm.h"

namespace mk {
namespace fused {

// The number of this call of the operator (1, 2, ...): completed calls + 1, the same on
// every rank (every rank makes the same calls) and in every CTA. Thread 0 of each CTA reads
// it before that CTA calls finishCall, so the last CTA's update cannot be seen early.
__device__ __forceinline__ uint64_t callSeq(const FusedComm& f) {
  return ptx::ldVolatile64(fusedCallCounter(f)) + 1;
}

// Thread 0 of every CTA, once the CTA is done (also after a failure: the comm is dead then
// anyway): the last CTA of the grid counts the call. The next launch of the comm is
// stream-ordered after this one, so it reads the new value.
__device__ __forceinline__ void finishCall(const FusedComm& f, uint64_t seq) {
  if (rt::finishCta(f.c.w)) *(volatile uint64_t*)fusedCallCounter(f) = seq;
}

}  // namespace fused
}  // namespace mk
