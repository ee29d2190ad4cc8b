// The fused GEMM + collective kernels: one persistent cooperative kernel per rank whose
// CTAs are [compute | intra-node comm] (fused/core/types.h SmSplit).
//
// GEMM + AllReduce / ReduceScatter (gcKernel with GcReduce). Compute CTAs run the GEMM engine on
// this rank's A_r B_r, writing partial tiles P_r in the output type (rounded once, as the
// sequential path's GEMM output is) and releasing tileDone[me][tile].
// Every tile has one owner rank (tile % n). The owner's comm CTAs wait for the tile's flag on every
// rank, sum the n partial tiles in rank order (so every rank gets the same bits, run after run),
// add the bias, round to the output type and store the result: into every rank's C
// (AllReduce) or into the shard of the rank owning each row (ReduceScatter); then they
// release tileFinal[q][tile] on every rank q. A rank's kernel ends once all its tileFinal
// flags are set: its C is complete and no owner still reads its partials.
//
// AllGather + GEMM (gcKernel with GcGather). Comm CTAs pull every rank's shard of A into Agathered
// (this rank's first) and release rowReady[me][shard]; the engine's producer waits for the
// shard flags covering a tile before loading it, and starts on this rank's own rows. A
// puller marks tileFinal[shard owner][me] once it has copied that shard, and every rank
// waits for its pullers before its kernel ends (its Ashard may then change).
//
// Two layouts of the local ranks:
//  - clique (every rank in this process): peers find each other's buffers through a
//    handshake slot per rank in a per-process clique block (one address space);
//  - processes (one rank per process, gemm_coll/procs.h): no pointer of a peer is valid
//    here, so everything a peer reads lives in its own control block and data region, which
//    every local rank maps. GEMM + AllReduce / ReduceScatter: the owner of a tile stores the
//    reduced rows into its C (the rows of its shard for ReduceScatter) and into its data
//    region's F (same tile-by-tile layout as the partials), then releases its own final flag;
//    every other rank (ReduceScatter: the shard owner) pulls the tile from the owner's F into
//    its C. AllGather + GEMM: each rank first copies its shard into its data region and
//    releases shardReady; pullers copy from there.
// The reduce role of GEMM + AllReduce / ReduceScatter in these two layouts is reduce_role.cuh.
// A comm spanning (virtual) nodes runs AllGather + GEMM (xnode_role.cuh) and GEMM +
// ReduceScatter / AllReduce (xnode_rs_role.cuh) in the xnode layout: data moves through the
// device communication API (P2P stores inside a node, the proxy across nodes).
// Sequence numbers are device-resident (the rank's call counter), so a captured launch
// publishes new values at every replay. Every wait is bounded (rt::waitGe: abort flag,
// deadline, error record).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "device/net/devcomm.cuh"
#include "device/rt/wait.cuh"
#include "fused/core/elem.cuh"
#include "fused/core/types.h"
#include "fused/core/xnode_dev.cuh"
#include "fused/gemm/gemm_kernel.cuh"
#include "fused/ops/gemm_coll/clique.h"
#include "fused/ops/gemm_coll/xnode.h"

namespace mk {
namespace fused {

// Words per CTA of GcParams::trace.
constexpr int kGcTraceWords = 4;

struct GcParams {
  gemm::GemmParams g;  // first: holds the 64-byte aligned tensor maps
  CUtensorMap cmap;    // AllReduce/ReduceScatter: this rank's C, box kTileN x chunkRows
  int32_t chunkRows;   // tile rows per reduce chunk (GcReducePlan)
  int32_t stages;      // reduce chunks in flight (GcReducePlan)
  SmSplit split;
  rt::WaitCtx w;
  GcClique* q;  // clique layout: shared by the local ranks (device memory); null for processes
  // Flags of each rank (by rank; valid in this process): done[q][tile] (AR/RS: q's partial
  // tile is stored; AG: shard tile of q is in G, indexed by shard), fin[q][tile] (clique AR/RS:
  // tile final in q's C; processes AR/RS: tile reduced into q's F, q the owner; AG: index r:
  // rank r has read q's shard).
  uint64_t* done[kGcMaxLocal];
  uint64_t* fin[kGcMaxLocal];
  uint64_t* calls;                    // this rank's completed calls (never reset)
  uint32_t* ctaDone;                  // this rank's last-CTA detection word
  int32_t procs;                      // 1: the processes layout (below)
  uint8_t* peerData[kGcMaxLocal];     // processes: each rank's data region (P or the AG shard
                                      // at 0, F at fOff: half the region, the same every call)
  uint64_t* shardReady[kGcMaxLocal];  // processes AG: each rank's shard-copied word
  int64_t fOff;
  int32_t me, n;     // local index == comm rank (single node, one process)
  int32_t kind;      // GemmColl
  int32_t outType;   // gemm::DType of C
  const void* bias;  // [N] of outType, or null
  const void* A;     // AllGather: this rank's shard
  void* C;           // AllReduce/ReduceScatter: this rank's output
  void* G;           // AllGather: the gathered A [M, K]
  void* P;           // AllReduce/ReduceScatter: this rank's partials of outType, tile by tile
  int32_t M, N, K;
  int32_t rowsPerRank;  // M / n (ReduceScatter, AllGather)
  // The reduce role's tail (clique AllReduce / ReduceScatter; 0 = none): the owned tiles of
  // the last tailTiles schedule positions go to whichever CTA of the rank asks first (every
  // comm CTA after its share of the earlier tiles, every compute CTA once its GEMM tiles are
  // done): tailClaim counts the claims (reset by the call's last CTA), tailLog[m] says which
  // CTA took owned tail tile m in which call (GcChunkIt).
  int32_t tailTiles;
  uint32_t* tailClaim;
  uint64_t* tailLog;
  // 1: the compute CTAs' idle producer warps reduce ready tiles during the GEMM (gcHelperRole;
  // clique AllReduce / ReduceScatter with every tile in the tail).
  int32_t helpers;
  // xnode layout (xnode.h): the device API's view with the comm's wait context, the plan,
  // the rows-ready flags [n][gxChunks] and the receive CTAs' finish count (call scratch,
  // zeroed before the kernel). calls/ctaDone: this rank's private signal words.
  // ReduceScatter / AllReduce (xnode_rs_role.cuh): gxChunks is this rank's chunk count,
  // rowFlags the staged-chunk flags [n][gxChunks], G the staging buffer, tileFlags the GEMM's
  // tileDone.
  int32_t xnode;
  int32_t gxChunkRows, gxSlots, gxChunks;
  int64_t gxArea, gxChunkBytes;
  uint64_t* rowFlags;
  uint32_t* recvDone;
  int32_t grsChunkTiles, grsRowChunks, grsArRows, grsArChunks;  // AllReduce: arChunks > 0
  int64_t grsTileBytes;
  uint64_t* tileFlags;
  uint64_t* redFlags;  // [gxChunks]: this rank's reduce chunk stored (C)
  NetDev net;
  // MKERNEL_FUSED_TRACE: [CTA][kGcTraceWords]: start, main loop done (comm CTAs) or GEMM done
  // (compute CTAs), end (%globaltimer stamps), and the tiles its helpers reduced; in mapped
  // host memory, read by a host function queued after the kernel (fused_launch.cu); null when
  // off.
  uint64_t* trace;
  // MKERNEL_FUSED_DEBUG (diagnosis of the reduce role's rate; results are wrong with bits 0-2):
  // bit 0 skips the stores, bit 1 the loads, bit 2 the sums; bit 3 reads the tile flags at GPU
  // scope (enough when every rank runs on this GPU); bit 4 keeps the clique's at system scope.
  int32_t debug;
  // 1: the tile flags (done, final) are released and acquired at GPU scope. The clique's
  // ranks all run on this GPU (cliqueEligible), and a system-scope release costs the GEMM's
  // consumers a stall of ~1-2 us per tile (publishTile), ~10% of a tile at K = 1024.
  int32_t gpuFlags;
};

__device__ __forceinline__ uint64_t* gcDone(const GcParams& p, int q) {
  return p.done[q];
}
__device__ __forceinline__ uint64_t* gcFinal(const GcParams& p, int q) {
  return p.fin[q];
}

// The scope of the tile flags (GcParams::gpuFlags).
__device__ __forceinline__ rt::Scope gcScope(const GcParams& p) {
  return p.gpuFlags || (p.debug & 8) ? rt::kScopeGpu : rt::kScopeSys;
}
__device__ __forceinline__ void gcRelease(const GcParams& p, uint64_t* flag, uint64_t seq) {
  rt::releaseFlag(flag, seq, gcScope(p) == rt::kScopeSys);
}
// Orders this thread's stores before a later release of the tile flags, at their scope.
__device__ __forceinline__ void gcFence(const GcParams& p) {
  if (gcScope(p) == rt::kScopeSys) {
    __threadfence_system();
  } else {
    __threadfence();
  }
}

// This call's sequence number: calls completed by this rank + 1. Read before any CTA can
// finish (the last CTA advances it), so every CTA sees the same value.
__device__ __forceinline__ uint64_t gcSeq(const GcParams& p) {
  return *reinterpret_cast<volatile uint64_t*>(p.calls) + 1;
}

// This rank's buffers, then the sequence number (one thread of the publishing CTA).
__device__ __forceinline__ void gcPublish(const GcParams& p, uint64_t seq) {
  GcSlot& s = p.q->slot[p.me];
  s.A = p.A;
  s.C = p.C;
  s.P = p.P;
  __threadfence_system();
  ptx::stReleaseSys(&s.seq, seq);
}

// Every lane of one warp of the publishing CTA: this rank's C map into its slot (tensormap
// proxy, staged through 128 bytes of shared memory at `stage`), then its buffers and sequence
// number (gcPublish): the map lands before the seq that announces it.
__device__ __forceinline__ void gcPublishWarp(const GcParams& p, uint64_t seq, uint8_t* stage) {
  const int lane = threadIdx.x & 31;
  if (lane < 8)
    reinterpret_cast<uint4*>(stage)[lane] = reinterpret_cast<const uint4*>(&p.cmap)[lane];
  __syncwarp();
  ptx::tensormapPublish(&p.q->slot[p.me].cmap, stage);
  if (lane == 0) gcPublish(p, seq);
  __syncwarp();
}

// Waits for rank q's handshake of this call; false on timeout/abort (recorded).
__device__ __forceinline__ bool gcPeerSlot(const GcParams& p, int q, uint64_t seq) {
  return rt::waitGe(p.w, &p.q->slot[q].seq, seq,
                    rt::ErrSite{p.w.op, q, (int32_t)blockIdx.x, -1, rt::kWaitData, 0});
}

// The last CTA of the grid advances this rank's call counter (next call's seq).
__device__ __forceinline__ void gcFinish(const GcParams& p) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (p.trace != nullptr) p.trace[kGcTraceWords * blockIdx.x + 2] = ptx::globalTimerNs();
  __threadfence();
  const uint32_t prev = atomicAdd(p.ctaDone, 1u);
  if (prev == gridDim.x - 1) {
    *p.ctaDone = 0;
    if (p.tailClaim != nullptr) *p.tailClaim = 0;  // every CTA has made its last claim
    if (p.g.tileClaim != nullptr) *p.g.tileClaim = 0;
    __threadfence();
    *p.calls = *p.calls + 1;
    __threadfence_system();
  }
}

// Owner of the tile at schedule position t (gemm::tileCoords, the same on every rank): round
// robin over positions for AllReduce and ReduceScatter alike. The GEMMs produce tiles in
// schedule order, so every rank's comm CTAs have work from the first tiles on (owners by
// shard would leave the last rank's CTAs idle until the GEMMs reach its rows; a ReduceScatter
// owner stores into the shard owner's C), and comm CTA idx of rank r takes positions
// r + n * (idx + nIdx * k): the k-th is found without walking the schedule.
__device__ __forceinline__ int gcOwner(const GcParams& p, int32_t t) {
  return t % p.n;
}

// 16 bytes of T: the unit every comm thread loads and stores.
template <typename T>
struct GcVec {
  static constexpr int kN = 16 / sizeof(T);
  __device__ static void add(float (&acc)[kN], const uint4& v) {
    const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int j = 0; j < kN; ++j) acc[j] += toF(h[j]);
  }
  __device__ static uint4 pack(const float (&acc)[kN]) {
    uint4 v;
    T* h = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int j = 0; j < kN; ++j) h[j] = fromF<T>(acc[j]);
    return v;
  }
};

#include "fused/ops/gemm_coll/reduce_role.cuh"

// ---- gather role (AllGather + GEMM) -----------------------------------------------------------
//
// Pulls shards (own first: the engine starts on those rows) into G and releases rowReady.
// Thread 0 streams each shard through a ring of kGatherBufs shared-memory chunks with bulk
// copies, loading kGatherAhead chunks ahead of the one it stores. A buffer is reloaded only
// once the store that read it was issued behind loads already waited for: the wait for its
// reads then never stalls behind loads queued after it.
constexpr int kGatherBufs = 6;
constexpr int kGatherAhead = kGatherBufs / 2;
constexpr int32_t kGatherChunk = 32 * 1024;
static_assert(kGatherBufs * kGatherChunk + 256 <= gemm::kSmemBytes, "gather ring exceeds smem");

__device__ __forceinline__ void gcCopyBulk(uint8_t* to, const uint8_t* from, int64_t bytes,
                                           uint8_t* ring, uint64_t* bar, uint32_t* uses) {
  const int64_t nChunks = (bytes + kGatherChunk - 1) / kGatherChunk;
  auto size = [&](int64_t j) {
    return (uint32_t)min((int64_t)kGatherChunk, bytes - j * kGatherChunk);
  };
  for (int64_t j = 0; j < nChunks + kGatherAhead; ++j) {
    const int64_t k = j - kGatherAhead;  // chunk stored this step
    if (k >= 0) {
      const int b = (int)(k % kGatherBufs);
      ptx::mbarWait(&bar[b], uses[b] & 1);
      ++uses[b];
      ptx::bulkStore1d(to + k * kGatherChunk, ring + b * kGatherChunk, size(k));
      ptx::bulkCommit();
    }
    if (j < nChunks) {
      // The buffer's previous chunk, j - kGatherBufs, was stored kGatherBufs - kGatherAhead
      // groups ago.
      ptx::bulkWaitRead<kGatherBufs - kGatherAhead>();
      const int b = (int)(j % kGatherBufs);
      ptx::mbarArriveExpectTx(&bar[b], size(j));
      ptx::bulkLoad1d(ring + b * kGatherChunk, from + j * kGatherChunk, size(j), &bar[b]);
    }
  }
  ptx::bulkWait<0>();
  ptx::fenceProxyAsync();  // the copies' writes -> the generic-proxy flag release
}

__device__ __forceinline__ void gcGatherRole(const GcParams& p, int32_t idx, int32_t nIdx,
                                             uint8_t* smem) {
  __shared__ int ok;
  __shared__ uint32_t uses[kGatherBufs];  // completed phases per ring buffer
  const uint64_t seq = gcSeq(p);
  uint8_t* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem) + 127) & ~uintptr_t(127));
  uint64_t* bar = reinterpret_cast<uint64_t*>(base);
  uint8_t* ring = base + 128;
  if (threadIdx.x == 0) {
    ok = 1;
    for (int b = 0; b < kGatherBufs; ++b) {
      ptx::mbarInit(&bar[b], 1);
      uses[b] = 0;
    }
    ptx::fenceMbarInit();
    if (idx == 0 && !p.procs) gcPublish(p, seq);
  }
  __syncthreads();
  const int64_t shardBytes = (int64_t)p.rowsPerRank * p.K * 2;
  for (int j = idx; j < p.n; j += nIdx) {
    const int src = (p.me + j) % p.n;  // own shard first: the engine starts on those rows
    if (threadIdx.x != 0 || !ok) continue;
    const uint8_t* from = nullptr;
    if (p.procs && src == p.me) {
      // Processes: my shard into my data region for the peers first (they wait for it).
      gcCopyBulk(p.peerData[p.me], static_cast<const uint8_t*>(p.A), shardBytes, ring, bar, uses);
      __threadfence_system();
      ptx::stReleaseSys(p.shardReady[p.me], seq);
      from = static_cast<const uint8_t*>(p.A);
    } else if (p.procs) {
      if (!rt::waitGe(p.w, p.shardReady[src], seq,
                      rt::ErrSite{p.w.op, src, (int32_t)blockIdx.x, src, rt::kWaitSlot, 0},
                      rt::kScopeSys)) {
        ok = 0;
        continue;
      }
      from = p.peerData[src];
    } else {
      if (!gcPeerSlot(p, src, seq)) {
        ok = 0;
        continue;
      }
      from = static_cast<const uint8_t*>(p.q->slot[src].A);
    }
    uint8_t* to = static_cast<uint8_t*>(p.G) + src * shardBytes;
    if (from != to) {
      ptx::fenceProxyAsync();  // the slot was acquired through the generic proxy
      gcCopyBulk(to, from, shardBytes, ring, bar, uses);
    }
    __threadfence_system();
    ptx::stReleaseGpu(gcDone(p, p.me) + src, seq);   // rows of shard src are in G
    ptx::stReleaseSys(gcFinal(p, src) + p.me, seq);  // src's shard was read by me
  }
  __syncthreads();
  // Every rank has read this rank's shard before the kernel (and the caller's use of
  // Ashard) ends.
  for (int q = idx; q < p.n; q += nIdx) {
    if (threadIdx.x == 0 && ok &&
        !rt::waitGe(p.w, gcFinal(p, p.me) + q, seq,
                    rt::ErrSite{p.w.op, q, (int32_t)blockIdx.x, q, rt::kWaitSlot, 0},
                    rt::kScopeSys))
      ok = 0;
  }
  __syncthreads();
}

#include "fused/ops/gemm_coll/xnode_role.cuh"
#include "fused/ops/gemm_coll/xnode_rs_role.cuh"

// The comm roles, as types for gcKernel.
// tail: whether compute CTAs join the role once their GEMM tiles are done (GcParams::tailTiles).
// help: the compute CTAs' side job during their GEMM (GcParams::helpers).
template <typename TOut>
struct GcReduce {
  static constexpr bool kTail = true;
  static __device__ void run(const GcParams& p, int32_t idx, int32_t n, uint8_t* smem) {
    if (p.xnode) {
      grsRole<TOut>(p, idx, n);
    } else {
      gcReduceRole<TOut>(p, idx, n, smem);
    }
  }
  static __device__ void help(const GcParams& p, int32_t cta, const volatile int* gemmDone) {
    gcHelperRole<TOut>(p, cta, gemmDone);
  }
};
struct GcGather {
  static constexpr bool kTail = false;
  static __device__ void help(const GcParams&, int32_t, const volatile int*) {}
  static __device__ void run(const GcParams& p, int32_t idx, int32_t n, uint8_t* smem) {
    if (p.xnode) {
      gcGatherNetRole(p, idx, n, smem);
    } else {
      gcGatherRole(p, idx, n, smem);
    }
  }
};

// One persistent kernel per rank: compute CTAs run the engine, comm CTAs run CommRole.
template <class Tr, class CommRole>
__global__ void __launch_bounds__(gemm::kThreads, 1) gcKernel(const __grid_constant__ GcParams p) {
  extern __shared__ uint8_t smem[];
  if (p.trace != nullptr && threadIdx.x == 0)
    p.trace[kGcTraceWords * blockIdx.x] = ptx::globalTimerNs();
  int32_t idx;
  switch (p.split.roleOf(blockIdx.x, &idx)) {
    case Role::kCompute:
      if (CommRole::kTail && p.helpers) {
        // Set by the first consumer thread once its GEMM tiles are done (both consumer WGs
        // leave the tile loop at the same tile); the helpers then stop claiming.
        __shared__ int gemmDone;
        volatile int* done = &gemmDone;
        if (threadIdx.x == 0) *done = 0;  // before gemmCta's first barrier
        gemm::gemmCta<Tr>(p.g, smem, idx, p.split.of(Role::kCompute),
                          [&] { CommRole::help(p, idx, done); });
        if (threadIdx.x == 128) *done = 1;
      } else {
        gemm::gemmCta<Tr>(p.g, smem, idx, p.split.of(Role::kCompute));
      }
      // The GEMM's end, stamped by the first consumer thread as it leaves its tile loop:
      // anything later in the CTA (helpers finishing a claimed tile, the tail) only delays the
      // CTA's end stamp, so the trace tells the GEMM's own spread from the reduce's.
      if (p.trace != nullptr && threadIdx.x == 128)
        p.trace[kGcTraceWords * blockIdx.x + 1] = ptx::globalTimerNs();
      if (CommRole::kTail && p.tailTiles > 0 && !p.xnode && !p.procs) {
        const int32_t nComm = p.split.of(Role::kIntraComm);
        // A GEMM that left on a failure may still have loads landing in its stages: such a
        // CTA does not hand its shared memory to the tail (the call fails anyway).
        if (!rt::ctaFailed(p.w)) {
          gemm::gemmCtaHandBack<Tr>(smem);
          CommRole::run(p, nComm + idx, nComm, smem);
        }
      }
      break;
    case Role::kIntraComm:
      CommRole::run(p, idx, p.split.of(Role::kIntraComm), smem);
      break;
    default:
      break;
  }
  gcFinish(p);
}

}  // namespace fused
}  // namespace mk
