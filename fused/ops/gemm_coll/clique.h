// The per-process block that the local ranks of one comm share for the fused GEMM +
// collective kernels: a handshake slot per rank (its buffers for the current call), the
// device-resident call counters, and the tile flag arrays. Ranks of one process share an
// address space, so a peer's kernel reads these pointers directly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda.h>
#include <nccl.h>

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

}  // namespace fused
}  // namespace mk
