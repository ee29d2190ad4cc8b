// The fused ring-attention kernel: one persistent kernel per rank whose communication CTAs
// bring the other ranks' k/v slices into this rank's gather buffer, source by source in ring
// order (this rank, then rank-1, rank-2, ...), while its attention CTAs (the engine's
// attnCta, fused/attention/) already run on the sources in place: the engine's producer waits
// for each source's ready flag before loading its blocks. Ranks that share one process and
// one GPU (the clique) read their peers' k and v directly, after they publish them in the
// clique block. Ranks in separate processes (fused/core/proc_windows.h) cannot: each copies
// its own slices into its data region (k, then v) while it copies them into its gather
// buffer, releases its control block's `staged` word, and the peers copy from there; or, with
// direct reads (RingParams::direct, the default for up to kRingDirectMax ranks all on this
// GPU), the copy
// engine puts its slices into its region before the kernel and the attention reads every
// rank's region in place through per-source tensor maps (no gather buffer, no copy CTAs).
// Ranks on several (virtual) nodes (the xnode layout, xnode.h, xnode_role.cuh) send and
// receive the slices through the device communication API instead.
#pragma once
#include <cstdint>

#include "base/checks.h"
#include "device/net/devcomm.cuh"
#include "device/rt/wait.cuh"
#include "fused/attention/attn_kernel.cuh"
#include "fused/core/fused_dev.cuh"
#include "fused/core/trace.h"
#include "fused/core/types.h"
#include "fused/core/xnode_dev.cuh"
#include "fused/ops/ring_attn/ring_attn_util.h"
#include "fused/ops/ring_attn/xnode.h"

namespace mk {
namespace fused {

// Most ranks whose sources the attention reads in place (RingParams::direct): every source
// takes two tensor maps (256 bytes) in the kernel's parameters.
constexpr int kRingDirectMax = 8;

// Bytes one communication CTA copies per unit of work (the units of a source are spread over
// the CTAs; the last one done releases the source's flag).
constexpr int64_t kRingChunkBytes = 64 << 10;

struct RingSlot {
  uint64_t seq;   // released (system scope) once k and v below are this call's
  const void* k;  // this call's slices of the rank
  const void* v;
  uint64_t readDone;  // peers that finished copying this rank's slices, summed over calls
  uint64_t pad[4];
};
struct RingClique {
  RingSlot slot[kRingMaxLocal];
};
// A rank's control block in the processes layout (zeroed at creation).
struct RingCtl {
  uint64_t staged;    // call whose slices are in the rank's data region
  uint64_t pad0[15];  // its own 128-byte line: polled by the peers
  // By reader rank (one writer each, a value that only grows): the last call in which that
  // rank finished reading this rank's slices. Per reader, so that a wait for a reader that
  // never finishes (killed mid-call) names it.
  uint64_t readBy[kRingMaxLocal];
};

struct RingParams {
  attn::AttnParams a;  // k/v maps over kAll/vAll (unused with direct reads); hooks.ready = ready
  FusedComm f;
  RingClique* q;
  const void* k;  // this rank's slices
  const void* v;
  // [n][slice] in ring order: index i holds the slice of rank (rank - i) mod n (null with
  // direct reads)
  char* kAll;
  char* vAll;
  uint32_t* chunkDone;          // [n] units done per source, zeroed before the kernel (direct: [0]
                                // counts the attention CTAs done, ringDirectDone)
  uint64_t* ready;              // [n] 1 once source i is in place, zeroed before the kernel
  int64_t sliceBytes;           // a multiple of 16
  int32_t chunks;               // units per slice (k or v)
  SmSplit split;                // CTA counts; the copy CTAs come first in the grid (below)
  int32_t procs;                // 1: the processes layout (ctl, stage below; q unused)
  RingCtl* ctl[kRingMaxLocal];  // by rank, mapped here
  char* stage[kRingMaxLocal];   // by rank: its data region, [k slice][v slice]
  // The xnode layout (xnode.h; q, ctl, stage, chunkDone unused): the device API's view with
  // the operator's wait context, the plan, this rank's xnode call counter (a private signal
  // word, fused/core/xnode_proto.h kGxSigSeq) and the receive CTAs' finish count. ready[i]
  // then counts the units of source i in place.
  int32_t xnode;
  int32_t rxSlots, rxUnits;
  int64_t rxArea, rxChunkBytes;
  uint64_t* xcalls;
  uint32_t* recvDone;
  NetDev net;
  // Direct reads (the processes layout, at most kRingDirectMax ranks): every rank's slices
  // were copied into its data region in stream order before its kernel; the attention reads
  // every source where it lies, source i through kvMap[2i] (k) and kvMap[2i + 1] (v). No gather
  // buffer and no comm CTA: an idle warp of the first attention CTA relays the peers' `staged`
  // words into ready[] (ringDirectRelay); every attention CTA counts itself out in
  // chunkDone[0] (zeroed before the kernel; no units to count here), the last one tells the peers
  // (ringDirectDone), and a one-thread kernel after it holds the call open until every peer has
  // read this rank's region (fused.cu, ringDirectEndKernel).
  int32_t direct;
  // Direct reads only. 1: the relay above. 0 (staged): a one-thread kernel before this one
  // released `staged`, waited for every peer's and set ready[] (fused.cu, ringStageKernel), so
  // no CTA of this kernel waits for a peer and its grid may take the whole GPU beside the
  // peers' kernels (no co-residency needed).
  int32_t relay;
  // MKERNEL_FUSED_TRACE (null otherwise): %globaltimer stamps in mapped host memory, words
  // kRtStart / kRtEnd of every CTA's row, and row split.total() for the one-thread kernels
  // around this one (kRtStage*, kRtEndKernel*; fused.cu prints them).
  uint64_t* trace;
  CUtensorMap kvMap[2 * kRingDirectMax];
};

// Trace words (RingParams::trace): per CTA, and in the extra row.
enum RingTraceWord : int {
  kRtStart = 0,           // the CTA began
  kRtEnd = 1,             // the CTA's work is done (before it counts the call)
  kRtStageStart = 0,      // extra row: ringStageKernel began
  kRtStageEnd = 1,        // ... every peer's slices in place, the ready flags open
  kRtEndKernelStart = 2,  // ringDirectEndKernel began
  kRtEndKernelEnd = 3,    // ... every peer read this rank's region
};

__device__ __forceinline__ void ringTraceStamp(uint64_t* trace, int32_t row, int word) {
  if (trace != nullptr) trace[(int64_t)kTraceMaxWords * row + word] = ptx::globalTimerNs();
}

// Kernel parameters beyond 4 KB need CUDA 12.1+; 32764 bytes is the limit there.
static_assert(sizeof(RingParams) <= 32764, "RingParams exceeds the kernel parameter limit");

// Source bookkeeping of the two layouts: where rank s's slices are once it said so, whether
// they are (acquire), and that this rank no longer reads them (after a system fence).
__device__ __forceinline__ const uint64_t* ringStagedWord(const RingParams& p, int32_t s) {
  return p.procs ? &p.ctl[s]->staged : &p.q->slot[s].seq;
}
// Processes layout, one thread: until every peer has finished reading this rank's slices of
// call seq (its readBy word), in ring order, so that a timeout names the first missing reader.
__device__ __forceinline__ bool ringWaitReaders(const rt::WaitCtx& w, const RingCtl* mine,
                                                int32_t n, int32_t me, uint64_t seq, int32_t idx) {
  for (int32_t q = 1; q < n; ++q) {
    const int32_t s = (me + q) % n;
    if (!rt::waitGe(w, &mine->readBy[s], seq, rt::ErrSite{w.op, s, idx, -1, rt::kWaitData, 0},
                    rt::kScopeSys))
      return false;
  }
  return true;
}
__device__ __forceinline__ void ringMarkRead(const RingParams& p, int32_t s, uint64_t seq) {
  if (p.procs) {
    ptx::stReleaseSys(&p.ctl[s]->readBy[p.f.rank], seq);
  } else {
    atomicAdd_system(reinterpret_cast<unsigned long long*>(&p.q->slot[s].readDone), 1ull);
  }
}

// 16-byte copies by the whole CTA (bytes a multiple of 16, both ends 16-byte aligned), four
// loads in flight per thread before their stores.
__device__ __forceinline__ void copyCta(char* dst, const char* src, int64_t bytes) {
  const int4* s = reinterpret_cast<const int4*>(src);
  int4* d = reinterpret_cast<int4*>(dst);
  const int64_t n = bytes / 16, step = blockDim.x;
  int64_t i = threadIdx.x;
  for (; i + 3 * step < n; i += 4 * step) {
    int4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = s[i + u * step];
#pragma unroll
    for (int u = 0; u < 4; ++u) d[i + u * step] = v[u];
  }
  for (; i < n; i += step) d[i] = s[i];
}

__device__ __forceinline__ void ringCommRole(const RingParams& p, int32_t idx, int32_t nComm,
                                             uint64_t seq) {
  __shared__ const char* src;
  __shared__ int ok;
  const int32_t n = p.f.nRanks, me = p.f.rank, op = p.f.c.w.op;
  if (threadIdx.x == 0) {
    ok = 1;
    if (idx == 0 && !p.procs) {
      RingSlot& s = p.q->slot[me];
      s.k = p.k;
      s.v = p.v;
      __threadfence_system();
      ptx::stReleaseSys(&s.seq, seq);
    }
  }
  const int64_t units = (int64_t)n * 2 * p.chunks;
  int32_t cur = -1;
  for (int64_t u = idx; u < units; u += nComm) {
    const int32_t i = (int32_t)(u / (2 * p.chunks));
    const int32_t kv = (int32_t)((u / p.chunks) & 1);
    const int64_t c = u % p.chunks;
    const int32_t s = (me - i + n) % n;
    if (threadIdx.x == 0) {
      if (p.procs) {
        // My own slices come from the caller's buffers; a peer's once its kernel staged them.
        if (i != cur && ok && i > 0 &&
            !rt::waitGe(p.f.c.w, ringStagedWord(p, s), seq,
                        rt::ErrSite{op, s, idx, -1, rt::kWaitData, 0}, rt::kScopeSys))
          ok = 0;
        src = !ok      ? nullptr
              : i == 0 ? static_cast<const char*>(kv ? p.v : p.k)
                       : p.stage[s] + kv * p.sliceBytes;
      } else {
        if (i != cur && ok &&
            !rt::waitGe(p.f.c.w, &p.q->slot[s].seq, seq,
                        rt::ErrSite{op, s, idx, -1, rt::kWaitData, 0}, rt::kScopeSys))
          ok = 0;
        // Written by the peer's kernel: read after the acquire above.
        const RingSlot& q = p.q->slot[s];
        src = ok ? static_cast<const char*>(kv ? *(const void* const volatile*)&q.v
                                               : *(const void* const volatile*)&q.k)
                 : nullptr;
      }
    }
    cur = i;
    __syncthreads();
    if (!ok) break;  // the comm failed (recorded): the attention CTAs' waits fail too
    const int64_t off = c * kRingChunkBytes;
    const int64_t len = min(kRingChunkBytes, p.sliceBytes - off);
    copyCta((kv ? p.vAll : p.kAll) + i * p.sliceBytes + off, src + off, len);
    // Processes: my own slices also into my data region, for the peers.
    if (p.procs && i == 0) copyCta(p.stage[me] + kv * p.sliceBytes + off, src + off, len);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      if (atomicAdd(&p.chunkDone[i], 1u) == 2u * p.chunks - 1) {
        // Acquire side of the other CTAs' fence + count: their copies are ordered before the flag.
        // Processes: at system scope, which covers both the staged copies (read by the peers'
        // kernels, maybe on other GPUs) and the reads marked in the owner's control block below.
        if (p.procs) {
          __threadfence_system();
        } else {
          __threadfence();
        }
        rt::releaseFlag(&p.ready[i], 1, false);
        if (p.procs && i == 0)
          ptx::stReleaseSys(&p.ctl[me]->staged, seq);  // the peers may copy my slices now
        // This rank no longer reads rank s's slices.
        if (i > 0) ringMarkRead(p, s, seq);
      }
    }
  }
  // The call completes only once every peer has copied this rank's slices: the caller may
  // then overwrite k and v.
  if (idx == 0 && threadIdx.x == 0 && ok && n > 1) {
    if (p.procs) {
      ringWaitReaders(p.f.c.w, p.ctl[me], n, me, seq, idx);
      return;
    }
    // First every peer's slot of this call, so that a peer that never came is the one a
    // timeout names (the summed count below cannot say whose read is missing).
    for (int32_t q = 1; q < n && ok; ++q) {
      const int32_t s = (me + q) % n;
      if (!rt::waitGe(p.f.c.w, ringStagedWord(p, s), seq,
                      rt::ErrSite{op, s, idx, -1, rt::kWaitData, 0}, rt::kScopeSys))
        ok = 0;
    }
    if (ok)
      rt::waitGe(p.f.c.w, &p.q->slot[me].readDone, seq * (uint64_t)(n - 1),
                 rt::ErrSite{op, -1, idx, -1, rt::kWaitData, 0}, rt::kScopeGpu);
  }
}

// Direct reads (RingParams::direct), one thread of the first attention CTA at the kernel's
// start: says that this rank's region holds this call's slices, then passes each source's
// `staged` word on to the attention's ready flag, in the order the attention walks them.
__device__ __forceinline__ void ringDirectRelay(const RingParams& p, uint64_t seq) {
  const int32_t n = p.f.nRanks, me = p.f.rank, op = p.f.c.w.op;
  // The copy into my region finished before this kernel began (stream order); the fence
  // makes it visible to the peers' processes before the flag that says so.
  __threadfence_system();
  ptx::stReleaseSys(&p.ctl[me]->staged, seq);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t s = p.a.srcRank[i];
    if (s != me && !rt::waitGe(p.f.c.w, &p.ctl[s]->staged, seq,
                               rt::ErrSite{op, s, 0, -1, rt::kWaitData, 0}, rt::kScopeSys))
      return;  // recorded: the attention's waits on the later sources fail at once
    // Acquired at system scope above, released to this GPU's attention producers here.
    rt::releaseFlag(&p.ready[i], 1, false);
  }
}

// Direct reads, thread 0 of every attention CTA once the CTA is done: the last one tells
// every peer that this rank no longer reads its region.
__device__ __forceinline__ void ringDirectDone(const RingParams& p, uint64_t seq) {
  __threadfence();
  if (atomicAdd(&p.chunkDone[0], 1u) != (uint32_t)p.split.of(Role::kCompute) - 1) return;
  // Acquire side of the other CTAs' fence + count, and release to the peers' processes.
  __threadfence_system();
  const int32_t n = p.f.nRanks, me = p.f.rank;
  for (int32_t q = 1; q < n; ++q) ringMarkRead(p, (me + q) % n, seq);
}

#include "fused/ops/ring_attn/xnode_role.cuh"

// kDyn: the attention CTAs claim their tiles (p.a.claim, MKERNEL_RING_TILE_CLAIM).
template <class C, bool kDyn>
__global__ void __launch_bounds__(C::kThreads, 1)
    ringAttnKernel(const __grid_constant__ RingParams p) {
  extern __shared__ uint8_t smem[];
  __shared__ uint64_t seqSh, xseqSh;
  if (threadIdx.x == 0) {
    ringTraceStamp(p.trace, blockIdx.x, kRtStart);
    seqSh = callSeq(p.f);
    // The xnode call number: read before any CTA can finish (the last one advances it).
    xseqSh = p.xnode ? ptx::ldVolatile64(p.xcalls) + 1 : 0;
  }
  __syncthreads();
  const uint64_t seq = seqSh;
  // Copy CTAs first: everything waits for them (the slot publish, every source but this
  // rank's), so they take the first SMs when fewer are free than the grid has CTAs.
  const int32_t nComm = p.split.of(Role::kIntraComm);
  if ((int32_t)blockIdx.x < nComm) {
    if (p.xnode) {
      rxCommRole(p, blockIdx.x, nComm, xseqSh);
    } else {
      ringCommRole(p, blockIdx.x, nComm, seq);
    }
  } else {
    // One attnCta in the kernel (two copies of its warpgroups' code made ptxas spill).
    // Direct reads: no comm CTAs (nComm 0); the first CTA's idle warp relays the flags.
    const int32_t cta = blockIdx.x - nComm;
    attn::attnCta<C, kDyn>(p.a, smem, cta, p.split.of(Role::kCompute), p.direct ? p.kvMap : nullptr,
                           [&] {
                             if (p.direct && p.relay && cta == 0) ringDirectRelay(p, seq);
                           });
    if (p.direct) {
      __syncthreads();
      if (threadIdx.x == 0) ringDirectDone(p, seq);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) ringTraceStamp(p.trace, blockIdx.x, kRtEnd);
  // The last CTA counts the call (finishCall), and in the xnode layout the xnode call too.
  if (threadIdx.x == 0 && rt::finishCta(p.f.c.w)) {
    *(volatile uint64_t*)fusedCallCounter(p.f) = seq;
    if (p.xnode) {
      *(volatile uint64_t*)p.xcalls = xseqSh;
      __threadfence_system();
    }
  }
}

// grid <= 0: only loads the kernel.
template <class C>
ncclResult_t launchRing(const RingParams& p, int32_t grid, size_t smem, cudaStream_t s) {
  auto kernel = p.a.claim != nullptr ? ringAttnKernel<C, true> : ringAttnKernel<C, false>;
  CUDACHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  if (grid <= 0) return ncclSuccess;
  kernel<<<grid, C::kThreads, smem, s>>>(p);
  CUDACHECK(cudaGetLastError());
  return ncclSuccess;
}

// Instantiated per head dim in fused_inst_d*.cu (both input types, both schedules).
// The configuration is the attention engine's (attn::withCfg: schedule, and the variant
// buildParams resolved into p.a.variant; smem is attn::smemBytes of the same).
template <int kD, bool kF16>
ncclResult_t ringAttnLaunch(const RingParams& p, bool overlap, int32_t grid, size_t smem,
                            cudaStream_t s) {
  if (p.a.variant > (kD == 128 ? attn::kMaxRingD128Variant : attn::kMaxRingD64Variant)) {
    MK_WARN("ring attention: head-dim-%d variant %d is not built for the fused kernel", kD,
            p.a.variant);
    return ncclInternalError;  // variantOf never resolves it for a call with hooks
  }
  return attn::withCfg<kD, kF16, attn::kMaxRingD64Variant, attn::kMaxRingD128Variant>(
      overlap, p.a.variant, [&](auto c) { return launchRing<decltype(c)>(p, grid, smem, s); });
}

// The head-dim-64 and -128 variants' ring kernels (both input types), each in its own unit
// (fused_inst_d*_v*.cu); extern in fused_inst_d64.cu / fused_inst_d128.cu.
#define MK_RING_ATTN_VARIANT(EXTERN, D, V)                                                         \
  EXTERN template ncclResult_t launchRing<attn::Cfg<D, false, true, V>>(                           \
      const RingParams&, int32_t, size_t, cudaStream_t);                                           \
  EXTERN template ncclResult_t launchRing<attn::Cfg<D, true, true, V>>(const RingParams&, int32_t, \
                                                                       size_t, cudaStream_t);

#define MK_RING_ATTN_LAUNCH(EXTERN, D, F16)                                                     \
  EXTERN template ncclResult_t ringAttnLaunch<D, F16>(const RingParams&, bool, int32_t, size_t, \
                                                      cudaStream_t);
#define MK_RING_ATTN_INSTANTIATE(EXTERN, D) \
  MK_RING_ATTN_LAUNCH(EXTERN, D, false)     \
  MK_RING_ATTN_LAUNCH(EXTERN, D, true)

}  // namespace fused
}  // namespace mk
