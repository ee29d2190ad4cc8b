// The one PTX set of mkernel: every inline-assembly statement of src/ and fused/ lives here
// (and in wgmma_asm.inc, its generated operand list), one wrapper per instruction, no policy.
// Collectives, the device communication API, the proxy ring and the fused kernels all call
// these (namespace mk::ptx); scripts/check_layers.py rejects `asm` anywhere else.
//
// Memory model (DESIGN.md "Synchronisation protocol"): the writer of a cross-GPU or
// GPU->CPU flag writes the data, fences (fenceAcqRelSys) and releases the flag
// (stReleaseSys / redAddReleaseSys); the reader acquires it (ldAcquireSys). Flags read only
// by the same GPU may use the .gpu scope. Data written by TMA (async proxy) and flags
// written by ordinary stores (generic proxy) need fenceProxyAsync on the side that switches
// proxies, and a TMA store must be complete (bulkWait<0>, not bulkWaitRead) before its flag
// is released. wgmma, setmaxnreg and the .shared::cluster TMA forms need sm_90a.
#pragma once
#include <cuda.h>
#include <cstdint>

namespace mk {
namespace ptx {

// ---- memory model: loads, stores, reductions, fences ----------------------------------

__device__ __forceinline__ uint64_t ldAcquireSys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t ldAcquireGpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void stReleaseSys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void stReleaseGpu(uint64_t* p, uint64_t v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void stReleaseSys32(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void redAddReleaseSys(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void redAddReleaseGpu(uint64_t* p, uint64_t v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint32_t ldVolatile32(const volatile uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// A plain volatile read (no ordering): counters only this GPU writes, read after a barrier.
__device__ __forceinline__ uint64_t ldVolatile64(const uint64_t* p) {
  return *(const volatile uint64_t*)p;
}
__device__ __forceinline__ uint32_t ldRelaxedGpu32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void fenceAcqRelSys() {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}

// ---- clocks and thread identity ----------------------------------------------------------

// Nanoseconds since an arbitrary origin, the same for every SM of the GPU: the one time
// base of every device deadline (the SM clock changes with the boost state).
__device__ __forceinline__ uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t laneId() {
  uint32_t l;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
}

// ---- shared memory and mbarrier ----------------------------------------------------------

__device__ __forceinline__ uint32_t smemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A 32-bit word at a shared-window address (smemAddr): kernels at their register cap keep
// one 32-bit address instead of a 64-bit generic pointer.
__device__ __forceinline__ void stShared32(uint32_t addr, int32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ int32_t ldShared32(uint32_t addr) {
  int32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void mbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smemAddr(bar)), "r"(count));
}

// Ends a barrier's life: its shared memory may then hold anything else (data, another
// barrier), which PTX allows only after an inval.
__device__ __forceinline__ void mbarInval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smemAddr(bar)) : "memory");
}

// Makes the inits visible to the async proxy (TMA complete_tx) before first use.
__device__ __forceinline__ void fenceMbarInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smemAddr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smemAddr(bar)) : "memory");
}

__device__ __forceinline__ bool mbarTryWait(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(smemAddr(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}

// Waits for the phase with the given parity to complete. The other side is the producer or
// consumers of the same CTA, or of the partner CTA of a GEMM CTA pair (a cluster is
// scheduled as a whole, so the partner runs too); it is itself bounded, so no deadline is
// needed here.
__device__ __forceinline__ void mbarWait(uint64_t* bar, uint32_t parity) {
  while (!mbarTryWait(bar, parity)) {
  }
}

// ---- TMA (bulk tensor copies) -------------------------------------------------------------

__device__ __forceinline__ void tmaLoad2d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                          int32_t x, int32_t y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(smemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smemAddr(bar)), "r"(x), "r"(y)
      : "memory");
}

// A box of a 3-D tensor (grouped GEMM: B as [groups][rows][cols], z = the group).
__device__ __forceinline__ void tmaLoad3d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                          int32_t x, int32_t y, int32_t z) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(smemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smemAddr(bar)), "r"(x), "r"(y), "r"(z)
      : "memory");
}

__device__ __forceinline__ void tmaStore2d(const CUtensorMap* map, const void* src, int32_t x,
                                           int32_t y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smemAddr(src)), "r"(x), "r"(y)
               : "memory");
}

// An L2 eviction policy whose lines go first when L2 needs room (createpolicy, fraction 1.0):
// for data written once and not read again by the kernel, so that it does not push out
// operands that are (a GEMM's D streaming through L2 past its A and B bands).
__device__ __forceinline__ uint64_t l2EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// tmaStore2d with an L2 cache policy (l2EvictFirstPolicy) for the written lines.
__device__ __forceinline__ void tmaStore2dHint(const CUtensorMap* map, const void* src, int32_t x,
                                               int32_t y, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3}], [%1], "
      "%4;" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(smemAddr(src)), "r"(x), "r"(y), "l"(policy)
      : "memory");
}

// 1-D bulk copies (no tensor map): addresses 16-byte aligned, bytes a multiple of 16.
// global -> shared, completing `bytes` of transaction count on `bar`.
__device__ __forceinline__ void bulkLoad1d(void* dst, const void* src, uint32_t bytes,
                                           uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smemAddr(bar))
      : "memory");
}

// shared -> global in the issuing thread's current bulk group (bulkCommit / bulkWait*).
__device__ __forceinline__ void bulkStore1d(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                   reinterpret_cast<uint64_t>(dst)),
               "r"(smemAddr(src)), "r"(bytes)
               : "memory");
}

// 4-D tensor store (fused partials stored tile by tile, see gemm::GemmArgs::dTiled).
__device__ __forceinline__ void tmaStore4d(const CUtensorMap* map, const void* src, int32_t x,
                                           int32_t y, int32_t z, int32_t w) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smemAddr(src)), "r"(x), "r"(y), "r"(z), "r"(w)
      : "memory");
}

// Copies a 128-byte tensor map from shared to global memory and releases it to the tensormap
// proxy at system scope (every thread of the warp executes it: .sync.aligned). A reader
// acquires it with fenceTensormapAcquire after the flag that announces it.
__device__ __forceinline__ void tensormapPublish(void* dstGlobal, const void* srcSmem) {
  asm volatile(
      "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.sys.sync.aligned"
      " [%0], [%1], 128;" ::"l"(reinterpret_cast<uint64_t>(dstGlobal)),
      "r"(smemAddr(srcSmem))
      : "memory");
}

__device__ __forceinline__ void fenceTensormapAcquire(const void* mapGlobal) {
  asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;" ::"l"(
                   reinterpret_cast<uint64_t>(mapGlobal))
               : "memory");
}

__device__ __forceinline__ void bulkCommit() {
  asm volatile("cp.async.bulk.commit_group;");
}

// At most N bulk groups still reading their shared-memory source (staging reuse).
template <int N>
__device__ __forceinline__ void bulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// At most N bulk groups not yet complete, i.e. their global writes done (before publishing).
template <int N>
__device__ __forceinline__ void bulkWait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

// A hint: `bytes` (a multiple of 16, from a 16-byte aligned address) of global memory into
// L2 by the copy engine, with no register or shared memory held while the lines come in.
__device__ __forceinline__ void bulkPrefetchL2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(reinterpret_cast<uint64_t>(src)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void prefetchTensorMap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Four 8x8 b16 matrices from the warp's registers to shared memory: register q of every lane
// holds its two elements of matrix q in the mma accumulator layout (row lane / 4, columns
// 2 * (lane % 4) + {0, 1}), and lane 8q + r gives the address of row r of matrix q (16 bytes).
__device__ __forceinline__ void stmatrixX4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                           uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// ---- proxy fences -------------------------------------------------------------------------

// Generic-proxy shared-memory writes (st.shared, stmatrix) -> async-proxy readers (TMA store).
__device__ __forceinline__ void fenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// All state spaces: flags acquired through the generic proxy, data then read by TMA, or TMA
// stores completed and then announced through generic-proxy flag stores.
__device__ __forceinline__ void fenceProxyAsync() {
  asm volatile("fence.proxy.async;" ::: "memory");
}

// ---- warpgroup register reallocation and named barriers -----------------------------------

template <int N>
__device__ __forceinline__ void setmaxnregDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnregInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}

__device__ __forceinline__ void namedBarSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// bar.red.and over a named barrier: a barrier like bar.sync (it orders the threads' memory
// accesses around it) that also tells every thread whether `pred` held for all of them.
__device__ __forceinline__ bool namedBarAnd(int id, int threads, bool pred) {
  uint32_t r;
  asm volatile(
      "{\n\t.reg .pred p, q;\n\tsetp.ne.u32 p, %1, 0;\n\t"
      "bar.red.and.pred q, %2, %3, p;\n\tselp.u32 %0, 1, 0, q;\n\t}"
      : "=r"(r)
      : "r"((uint32_t)pred), "r"(id), "r"(threads)
      : "memory");
  return r != 0;
}

// ---- wgmma --------------------------------------------------------------------------------

__device__ __forceinline__ void wgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

#include "device/rt/wgmma_asm.inc"

// D(64x256, fp32) (+)= A(64x16, K-major smem) * B(16x256, smem; TRANS_B=1 means N-major).
// scaleD = 0 overwrites D (first k-slice of a tile), so accumulators need no zeroing.
template <bool kF16, int kTransB>
__device__ __forceinline__ void wgmmaM64N256K16(float (&d)[128], uint64_t descA, uint64_t descB,
                                                int scaleD) {
  if constexpr (kF16) {
    asm volatile(MK_WGMMA_N256_ASM("f16")
                 : MK_WGMMA_N256_OUTS(d)
                 : "l"(descA), "l"(descB), "r"(scaleD), "n"(kTransB));
  } else {
    asm volatile(MK_WGMMA_N256_ASM("bf16")
                 : MK_WGMMA_N256_OUTS(d)
                 : "l"(descA), "l"(descB), "r"(scaleD), "n"(kTransB));
  }
}

// Tells the compiler the accumulators are live across the asynchronous wgmma, so it never
// moves other definitions of them into the pipeline (ptxas C7515 serialisation).
__device__ __forceinline__ void fenceAccumulators(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

}  // namespace ptx
}  // namespace mk
