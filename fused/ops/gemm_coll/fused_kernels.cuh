// The fused GEMM + collective kernels: one persistent cooperative kernel per rank whose
// CTAs are [compute | intra-node comm] (fused/core/types.h SmSplit).
//
// GEMM + AllReduce / ReduceScatter (gcKernel with GcReduce). Compute CTAs run the GEMM engine on
// this rank's A_r B_r, writing partial tiles P_r in the output type (rounded once, as the
// sequential path's GEMM output is) and releasing tileDone[me][tile].
// Every tile has one owner rank (AllReduce: tile % n; ReduceScatter: the rank whose shard
// holds the tile's first row). The owner's comm CTAs wait for the tile's flag on every rank,
// sum the n partial tiles in rank order (so every rank gets the same bits, run after run),
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
// Peers find each other's buffers through a handshake slot per rank in a per-process
// clique block (ranks of one process share an address space); sequence numbers are
// device-resident (GcClique::calls), so a captured launch publishes new values at every
// replay. Every wait is bounded (rt::waitGe: abort flag, deadline, error record).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "device/rt/wait.cuh"
#include "fused/core/types.h"
#include "fused/gemm/gemm_kernel.cuh"
#include "fused/ops/gemm_coll/clique.h"

namespace mk {
namespace fused {

struct GcParams {
  gemm::GemmParams g;  // first: holds the 64-byte aligned tensor maps
  SmSplit split;
  rt::WaitCtx w;
  GcClique* q;      // shared by the local ranks (device memory)
  uint64_t* flags;  // q's flag arrays, [2][n][maxTiles]
  int32_t maxTiles;
  int32_t me, n;     // local index == comm rank (single node, one process)
  int32_t kind;      // GemmColl
  int32_t outType;   // gemm::DType of C
  const void* bias;  // [N] of outType, or null
  const void* A;     // AllGather: this rank's shard
  void* C;           // AllReduce/ReduceScatter: this rank's output
  void* G;           // AllGather: the gathered A [M, K]
  void* P;           // AllReduce/ReduceScatter: this rank's partials [M, N] of outType
  int32_t M, N, K;
  int32_t rowsPerRank;  // M / n (ReduceScatter, AllGather)
};

__device__ __forceinline__ uint64_t* gcDone(const GcParams& p, int q) {
  return p.flags + (int64_t)q * p.maxTiles;
}
__device__ __forceinline__ uint64_t* gcFinal(const GcParams& p, int q) {
  return p.flags + (int64_t)(p.n + q) * p.maxTiles;
}

template <typename T>
__device__ __forceinline__ T gcFromF(float v) {
  if constexpr (sizeof(T) == 4) {
    return v;
  } else if constexpr (std::is_same<T, __half>::value) {
    return __float2half_rn(v);
  } else {
    return __float2bfloat16_rn(v);
  }
}
template <typename T>
__device__ __forceinline__ float gcToF(T v) {
  return static_cast<float>(v);
}

// This call's sequence number: calls completed by this rank + 1. Read before any CTA can
// finish (the last CTA advances it), so every CTA sees the same value.
__device__ __forceinline__ uint64_t gcSeq(const GcParams& p) {
  return *reinterpret_cast<volatile uint64_t*>(&p.q->calls[p.me]) + 1;
}

// Thread 0 of comm CTA 0 publishes this rank's buffers, then the sequence number.
__device__ __forceinline__ void gcPublish(const GcParams& p, uint64_t seq) {
  GcSlot& s = p.q->slot[p.me];
  s.A = p.A;
  s.C = p.C;
  s.P = p.P;
  __threadfence_system();
  ptx::stReleaseSys(&s.seq, seq);
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
  __threadfence();
  const uint32_t prev = atomicAdd(&p.q->ctaDone[p.me], 1u);
  if (prev == gridDim.x - 1) {
    p.q->ctaDone[p.me] = 0;
    __threadfence();
    p.q->calls[p.me] = p.q->calls[p.me] + 1;
    __threadfence_system();
  }
}

// Owner of tile (mBlk, nBlk).
__device__ __forceinline__ int gcOwner(const GcParams& p, int32_t mBlk, int32_t nBlk) {
  if (p.kind == 2) return min(p.n - 1, (mBlk * gemm::kTileM) / p.rowsPerRank);
  return (mBlk * p.g.tilesN + nBlk) % p.n;
}

// 16 bytes of T: the unit every comm thread loads and stores.
template <typename T>
struct GcVec {
  static constexpr int kN = 16 / sizeof(T);
  __device__ static void add(float (&acc)[kN], const uint4& v) {
    const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int j = 0; j < kN; ++j) acc[j] += gcToF(h[j]);
  }
  __device__ static uint4 pack(const float (&acc)[kN]) {
    uint4 v;
    T* h = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int j = 0; j < kN; ++j) h[j] = gcFromF<T>(acc[j]);
    return v;
  }
};

// Reduces one tile over every rank's partials (of the output type: the GEMM rounds each
// rank's product once, as the sequential path's GEMM does) and stores it (see the file
// comment). Each thread takes 16-byte vectors (the host requires N to be a multiple of one)
// of kRows rows and loads every rank's vectors of a batch of ranks before adding them in rank
// order: many loads in flight per thread (one CTA then moves ~4x the bytes of one vector at
// a time), while the sum stays the same on every rank.
template <typename T>
__device__ void gcReduceTile(const GcParams& p, int32_t mBlk, int32_t nBlk, const T* const* parts,
                             T* const* outs) {
  using V = GcVec<T>;
  constexpr int kRows = 4;   // vectors per thread in flight per rank
  constexpr int kBatch = 4;  // ranks loaded before they are added
  const int32_t m0 = mBlk * gemm::kTileM, n0 = nBlk * gemm::kTileN;
  const int32_t rows = min(gemm::kTileM, p.M - m0), cols = min(gemm::kTileN, p.N - n0);
  const int32_t vecs = cols / V::kN;  // cols % V::kN == 0 (host rule)
  const int32_t total = rows * vecs;
  const T* bias = static_cast<const T*>(p.bias);
  for (int32_t e0 = threadIdx.x; e0 < total; e0 += kRows * blockDim.x) {
    int64_t off[kRows];
    int32_t col[kRows];
    float acc[kRows][V::kN];
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      const int32_t e = min(e0 + u * (int32_t)blockDim.x, total - 1);  // clamped: loads stay legal
      const int32_t r = e / vecs;
      col[u] = n0 + (e - r * vecs) * V::kN;
      off[u] = (int64_t)(m0 + r) * p.N + col[u];
#pragma unroll
      for (int j = 0; j < V::kN; ++j) acc[u][j] = 0.f;
    }
    for (int q0 = 0; q0 < p.n; q0 += kBatch) {
      uint4 v[kBatch][kRows];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
#pragma unroll
        for (int u = 0; u < kRows; ++u)
          if (q0 + j < p.n)
            v[j][u] = __ldcg(reinterpret_cast<const uint4*>(parts[q0 + j] + off[u]));
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
#pragma unroll
        for (int u = 0; u < kRows; ++u)
          if (q0 + j < p.n) V::add(acc[u], v[j][u]);
    }
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      if (e0 + u * (int32_t)blockDim.x >= total) break;
      if (bias != nullptr) {
#pragma unroll
        for (int j = 0; j < V::kN; ++j) acc[u][j] += gcToF(bias[col[u] + j]);
      }
      const uint4 o = V::pack(acc[u]);
      if (p.kind == 0) {
        for (int q = 0; q < p.n; ++q) *reinterpret_cast<uint4*>(outs[q] + off[u]) = o;
      } else {
        const int32_t row = (int32_t)(off[u] / p.N), d = row / p.rowsPerRank;
        *reinterpret_cast<uint4*>(outs[d] + (int64_t)(row - d * p.rowsPerRank) * p.N + col[u]) = o;
      }
    }
  }
}

// Comm role of GEMM + AllReduce / ReduceScatter: CTA idx of nIdx.
template <typename T>
__device__ void gcReduceRole(const GcParams& p, int32_t idx, int32_t nIdx) {
  __shared__ const T* parts[kGcMaxLocal];
  __shared__ T* outs[kGcMaxLocal];
  __shared__ int ok;
  const uint64_t seq = gcSeq(p);
  if (threadIdx.x == 0) {
    ok = 1;
    if (idx == 0) gcPublish(p, seq);
    for (int q = 0; q < p.n && ok; ++q) {
      if (!gcPeerSlot(p, q, seq)) {
        ok = 0;
        break;
      }
      parts[q] = static_cast<const T*>(p.q->slot[q].P);
      outs[q] = static_cast<T*>(p.q->slot[q].C);
    }
  }
  __syncthreads();
  if (!ok) return;
  const int32_t numTiles = p.g.tilesM * p.g.tilesN;
  // Owned tiles in the order the compute CTAs produce them, dealt round robin to the CTAs.
  int32_t mine = 0;
  for (int32_t t = 0; t < numTiles; ++t) {
    int32_t mBlk, nBlk;
    gemm::tileCoords(p.g, t, &mBlk, &nBlk);
    if (gcOwner(p, mBlk, nBlk) != p.me) continue;
    if ((mine++ % nIdx) != idx) continue;
    const int32_t id = mBlk * p.g.tilesN + nBlk;
    if (threadIdx.x == 0) {
      for (int q = 0; q < p.n && ok; ++q) {
        if (!rt::waitGe(p.w, gcDone(p, q) + id, seq,
                        rt::ErrSite{p.w.op, q, (int32_t)blockIdx.x, id, rt::kWaitData, 0},
                        rt::kScopeSys))
          ok = 0;
      }
    }
    __syncthreads();
    if (!ok) return;
    gcReduceTile<T>(p, mBlk, nBlk, parts, outs);
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int q = 0; q < p.n; ++q) ptx::stReleaseSys(gcFinal(p, q) + id, seq);
    }
  }
  // This rank's C is complete, and its partials unread, once every tile's owner finished.
  for (int32_t id = idx; id < numTiles; id += nIdx) {
    if (threadIdx.x == 0 && ok) {
      const int32_t owner = gcOwner(p, id / p.g.tilesN, id % p.g.tilesN);
      if (!rt::waitGe(p.w, gcFinal(p, p.me) + id, seq,
                      rt::ErrSite{p.w.op, owner, (int32_t)blockIdx.x, id, rt::kWaitData, 0},
                      rt::kScopeSys))
        ok = 0;
    }
  }
  __syncthreads();
}

// Comm role of AllGather + GEMM: pull shards (own first) into G, release rowReady.
__device__ __forceinline__ void gcGatherRole(const GcParams& p, int32_t idx, int32_t nIdx) {
  __shared__ int ok;
  const uint64_t seq = gcSeq(p);
  if (threadIdx.x == 0) {
    ok = 1;
    if (idx == 0) gcPublish(p, seq);
  }
  __syncthreads();
  const int64_t shardBytes = (int64_t)p.rowsPerRank * p.K * 2;
  for (int j = idx; j < p.n; j += nIdx) {
    const int src = (p.me + j) % p.n;  // own shard first: the engine starts on those rows
    if (threadIdx.x == 0 && ok && !gcPeerSlot(p, src, seq)) ok = 0;
    __syncthreads();
    if (!ok) return;
    const int4* from = static_cast<const int4*>(p.q->slot[src].A);
    int4* to = reinterpret_cast<int4*>(static_cast<char*>(p.G) + src * shardBytes);
    if (from != to) {
      // kUnroll loads in flight per thread before their stores (one at a time left a CTA
      // far below the bandwidth it can pull).
      constexpr int kUnroll = 8;
      const int64_t nVec = shardBytes / 16;
      for (int64_t i0 = threadIdx.x; i0 < nVec; i0 += kUnroll * (int64_t)blockDim.x) {
        int4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t i = i0 + u * (int64_t)blockDim.x;
          if (i < nVec) v[u] = __ldcg(from + i);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t i = i0 + u * (int64_t)blockDim.x;
          if (i < nVec) to[i] = v[u];
        }
      }
    }
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
      ptx::stReleaseGpu(gcDone(p, p.me) + src, seq);   // rows of shard src are in G
      ptx::stReleaseSys(gcFinal(p, src) + p.me, seq);  // src's shard was read by me
    }
  }
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

// The comm roles, as types for gcKernel.
template <typename TOut>
struct GcReduce {
  static __device__ void run(const GcParams& p, int32_t idx, int32_t n) {
    gcReduceRole<TOut>(p, idx, n);
  }
};
struct GcGather {
  static __device__ void run(const GcParams& p, int32_t idx, int32_t n) { gcGatherRole(p, idx, n); }
};

// One persistent kernel per rank: compute CTAs run the engine, comm CTAs run CommRole.
template <class Tr, class CommRole>
__global__ void __launch_bounds__(gemm::kThreads, 1) gcKernel(const __grid_constant__ GcParams p) {
  extern __shared__ uint8_t smem[];
  int32_t idx;
  switch (p.split.roleOf(blockIdx.x, &idx)) {
    case Role::kCompute:
      gemm::gemmCta<Tr>(p.g, smem, idx, p.split.of(Role::kCompute));
      break;
    case Role::kIntraComm:
      CommRole::run(p, idx, p.split.of(Role::kIntraComm));
      break;
    default:
      break;
  }
  gcFinish(p);
}

}  // namespace fused
}  // namespace mk
