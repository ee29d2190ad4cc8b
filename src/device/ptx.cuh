// PTX wrappers: the memory-model operations the collectives' flag protocol is built on.
// Cross-GPU protocol (DESIGN.md "Synchronisation protocol"): write data, fence.acq_rel.sys,
// st.release.sys on the flag; the reader polls with ld.acquire.sys.
#pragma once
#include <cstdint>

namespace mk {
namespace dev {

__device__ __forceinline__ uint64_t ldAcquireSys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void stReleaseSys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void stReleaseSys32(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ldVolatile32(const volatile uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint32_t ldRelaxedGpu32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void fenceAcqRelSys() {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}

// Nanoseconds since an arbitrary origin, the same for every SM of the GPU.
__device__ __forceinline__ uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace dev
}  // namespace mk
