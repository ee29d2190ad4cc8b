// The processes layout of the fused GEMM + collective kernels (fused_kernels.cuh): every local
// rank in its own process. Each rank's control block is a GcCtl and its data region's first
// half holds its partial tiles (or its AllGather shard), the second half the reduced tiles it
// owns (F), whatever the call's shape: a peer may still pull the previous call's F while this
// rank's next call writes its partials. Both are windows every local rank maps
// (fused/core/proc_windows.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include "fused/ops/gemm_coll/clique.h"  // kGcMaxLocal, kGcMaxTiles

namespace mk {
namespace fused {

// A rank's control block (device memory, zeroed at creation, mapped by its local peers).
struct GcCtl {
  uint64_t calls;    // fused calls completed by this rank (never reset)
  uint32_t ctaDone;  // last-CTA detection
  uint32_t pad0;
  uint64_t shardReady;  // AllGather: this call's shard is in the data region (call number)
  uint64_t pad1[13];    // to 128 bytes: the flags below are polled by other ranks
  uint64_t done[kGcMaxTiles];
  uint64_t fin[kGcMaxTiles];
};
static_assert(offsetof(GcCtl, done) == 128, "GcCtl layout");

}  // namespace fused
}  // namespace mk
