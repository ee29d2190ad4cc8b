// The processes layout of the fused GEMM + collective kernels (fused_kernels.cuh): every local
// rank in its own process, so no peer pointer is valid in this one. Each rank owns a control
// block (call counter, tile flags) and a data region (its partial tiles, and the reduced tiles
// it owns, or its AllGather shard), both registered as windows of the comm
// (transport/peer_mem_win.h), so that every local rank maps every other's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>
#include <nccl.h>

#include "fused/ops/gemm_coll/clique.h"  // kGcMaxLocal, kGcMaxTiles

struct ncclComm;

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

// What a launch needs, valid in this process (by rank: the layout is one node). A data region
// is two halves of halfBytes: [0, half) the rank's partials (or AllGather shard), [half, 2 half)
// the reduced tiles it owns (F). F's place must not depend on the call's shape: a peer may
// still pull the previous call's F while this rank's next call already writes its partials.
struct GcProcsView {
  GcCtl* ctl[kGcMaxLocal];
  uint8_t* data[kGcMaxLocal];
  size_t halfBytes;
};

// Whether comm runs the processes layout: one node, at most kGcMaxLocal ranks, each in its own
// process on this host (two ranks of one process would need one thread each for the
// collective registrations below; those layouts run the sequential path).
bool gcProcsEligible(const ncclComm* comm);

// COLLECTIVE (every rank of comm calls it with the same halfBytes, in the same order of calls;
// the fused call's own order guarantees it): makes sure this rank's control block exists and
// its data region's halves hold halfBytes each, creating or growing them as windows of comm. A
// grown region replaces the old one for later calls; the old one stays allocated and mapped
// until the comm goes (a captured graph may still use it, and so may kernels in flight), so a
// growth waits for nothing. Outside stream capture only when it has to create or grow (*ok
// false, nothing done, when `stream` is being captured then). *ok false also when some local
// rank could not allocate or map: the caller then runs the sequential path (every rank agrees).
ncclResult_t gcProcsGet(ncclComm* comm, size_t halfBytes, cudaStream_t stream, GcProcsView* view,
                        bool* ok);

// Drops comm's blocks (at comm destruction, before its peer memory goes).
void gcProcsRelease(ncclComm* comm);

}  // namespace fused
}  // namespace mk
