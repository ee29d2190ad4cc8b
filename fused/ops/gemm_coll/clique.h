// The per-process block that the local ranks of one comm share for the fused GEMM +
// collective kernels: a handshake slot per rank (its buffers for the current call), the
// device-resident call counters, and the tile flag arrays. Ranks of one process share an
// address space, so a peer's kernel reads these pointers directly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda.h>
#include <nccl.h>

#include "fused/gemm/gemm.h"                // kTileM, kTileN
#include "fused/ops/gemm_coll/gemm_coll.h"  // GemmColl

struct ncclComm;

namespace mk {
namespace fused {

constexpr int kGcMaxLocal = 32;
constexpr int kGcMaxTiles = 16384;  // tiles of 128x256: e.g. M = 32768 with N = 16384

struct GcSlot {
  uint64_t seq;   // released (system scope) after the fields below are written
  const void* A;  // AllGather: the rank's shard
  void* C;        // the rank's output
  const void* P;  // the rank's partials (output type, tile by tile)
  // The rank's C (AllReduce/ReduceScatter), published by its kernel; 128-byte aligned for
  // tensormap.cp_fenceproxy.
  alignas(128) CUtensorMap cmap;
};
static_assert(sizeof(GcSlot) == 256 && offsetof(GcSlot, cmap) == 128, "GcSlot layout");

struct GcClique {
  GcSlot slot[kGcMaxLocal];
  uint64_t calls[kGcMaxLocal];      // fused calls completed by each rank (never reset)
  uint32_t ctaDone[kGcMaxLocal];    // last-CTA detection per rank
  uint32_t tailClaim[kGcMaxLocal];  // reduce-tail claims of each rank's current call
  int32_t gemmClaim[kGcMaxLocal];   // GEMM tile claims of each rank's call (MKERNEL_FUSED_DYN)
  // followed by the flag arrays: uint64_t flags[3][n][kGcMaxTiles] (done, final, tail log)
};

// The clique block of comm's local ranks (created by the first of them to ask, on comm's
// device; one per commHash in this process). `flags` points at its flag arrays. Fails
// (ncclInvalidUsage, no message) when the comm's ranks are not all in this process on one
// node: the caller then uses the sequential path.
ncclResult_t gcCliqueGet(ncclComm* comm, GcClique** q, uint64_t** flags);

// ncclFusedAuto in the clique layout (ranks as threads sharing this GPU, helpers on): a rule
// of the call's own arguments, as across nodes (xnode.h gxAutoFuses), so every rank takes the
// same path. The fused kernel wins where the helpers keep up with the reduce during the GEMM.
// Measured on the H200, 4 ranks, variants interleaved (bench/results/session25-2026-12-03 and
// session26-2026-12-03), fused / sequential:
//  - AllReduce: 0.97-1.02 at 8192^3, 0.98-1.01 at 4096x8192x8192 (1024 tiles), 0.95-0.99 at
//    8192x8192x4096, 1.00-1.01 at 4096x8192x4096, but 1.00-1.04 at K = 2048 and 1.07-1.08 at
//    K = 1024, where the helpers reduce only a third of the tiles during the GEMM (the GEMM's
//    own L2 traffic leaves them little: a ring of bulk loads, session 26, raised that by an
//    eighth and changed nothing end to end). So K >= 4096.
//  - ReduceScatter, against the zero-copy stand-alone ReduceScatter (session 26; the staged
//    one took twice the AllReduce's time and made fusing look better): 0.985-1.01 at 8192^3,
//    0.97-0.99 at 8192x8192x4096, 1.01 at 4096x8192x4096, 1.03-1.05 at K = 2048, 1.18 at
//    K = 1024. So K >= 8192 (K = 4096 with 2048 tiles would also pay, by 1-3%).
// Fewer than 1024 tiles were not measured fused with helpers, so auto stays sequential there;
// nor was a 32-bit output (twice the partials' bytes for the helpers to move), so it needs a
// 16-bit one. Measured with 4 ranks; a rank's reduce traffic and its GEMM time per SM do not
// depend on the rank count on one GPU, so the rule does not either.
// Output tiles (gemm::kTileM x kTileN) of an M x N product.
inline int64_t gcTiles(int64_t M, int64_t N) {
  return ((M + gemm::kTileM - 1) / gemm::kTileM) * ((N + gemm::kTileN - 1) / gemm::kTileN);
}

constexpr int64_t kGcAutoMinKAllReduce = 4096;
constexpr int64_t kGcAutoMinKReduceScatter = 8192;
constexpr int64_t kGcAutoMinTiles = 1024;
inline bool gcAutoFuses(GemmColl op, bool helpers, size_t outBytes, int64_t M, int64_t N,
                        int64_t K) {
  if (op == GemmColl::kAllGather || !helpers || outBytes != 2 || gcTiles(M, N) < kGcAutoMinTiles)
    return false;
  return K >= (op == GemmColl::kAllReduce ? kGcAutoMinKAllReduce : kGcAutoMinKReduceScatter);
}

// The clique rule as a call applies it: ncclFusedAuto with the split left to mkernel (a split
// forced through config->commSms goes to the model's verdict, MKERNEL_FUSED_AUTO, instead).
// One predicate for gemmCollRun's early choice and the fused launch's, so they cannot differ.
inline bool gcCliqueAutoFuses(const GemmCollCall& c, bool helpers) {
  return c.cfg.algo == ncclFusedAuto && c.cfg.commSms < 0 &&
         gcAutoFuses(c.op, helpers, fusedTypeSize(c.cfg.outType), (int64_t)c.M, (int64_t)c.N,
                     (int64_t)c.K);
}

}  // namespace fused
}  // namespace mk
