// Zero-copy collectives over registered buffers and windows (docs/collectives.md,
// "Zero-copy"): the decision for one collective and where every peer's buffer is.
//
// A collective runs zero-copy when the buffers its peers touch remotely (its "remote"
// buffers: the send buffers that other ranks read, the receive buffers that other ranks
// write) are reachable, found in this order:
//  1. windows (kZcWindow): each remote buffer lies in a window that every local rank
//     mapped at registration; the kernels exchange window keys and offsets (local, no
//     exchange on the host, any offsets);
//  2. one process, one GPU (kZcRaw, CollState::zeroCopy): each remote buffer lies in a
//     registration or a window of this rank, or (ReduceScatter, AllGather) anywhere, as
//     for the AllReduce (planReduction); the kernels exchange raw pointers;
//  3. ranks in separate processes (kZcMapped, CollState::sepProcs), from
//     kRegZeroCopyMinBytes up, when this rank's remote buffers are ncclCommRegister'ed:
//     peerMemLookup of each of them (a collective exchange per buffer and call).
// Sizes: from kZeroCopyMinBytes (1, 2) or kRegZeroCopyMinBytes (3) up, any size with
// MKERNEL_ALGO=zerocopy; never with MKERNEL_REG_ZERO_COPY=0 (step 2 also needs
// MKERNEL_ZERO_COPY), with another forced algorithm, across (virtual) nodes, with
// more than kZcMaxMapped local ranks, for an in-place AlltoAll or for send/receive.
// Whether to try each step is a local decision: they agree across ranks when the ranks follow
// NCCL's rule (every rank's buffers registered, or none). When they do not, the ranks take
// different paths and the operation fails (a peer in another window: a protocol error at
// once; a peer on the staging path: a timeout after MKERNEL_TIMEOUT_MS), naming the peer:
// an error, never wrong data.
#pragma once
#include <cstdint>
#include <vector>
#include <nccl.h>

#include "coll/coll.h"
#include "coll/launch.h"

struct ncclComm;

namespace mk {

struct ZcPlan {
  bool on = false;
  ZcBufs bufs{};  // what the kernel gets (coll/launch.h)
};

// Which buffers of collective `a` (not Send/Recv) peers touch remotely, and their extents.
struct ZcRemote {
  bool send = false, recv = false;
  uint64_t sendBytes = 0, recvBytes = 0;
  uint64_t msgBytes = 0;  // size compared with the thresholds (same on every rank)
};
// none (both false) when the collective cannot run zero-copy (in-place AlltoAll, send/recv).
ZcRemote zcRemoteOf(const CollArgs& a, int nRanks);

// Whether the size and switch rules let a remote message of msgBytes (ZcRemote::msgBytes) on n
// local ranks try steps 1 and 2 (windows; one process on one GPU); the buffers decide the rest.
// zcPlan applies it, and so does ncclGroupSimulateEnd's estimate, without the buffer lookups.
bool zcSizeAllows(uint64_t msgBytes, int nRanks);

// Plans collective `a` on its comm (an intra-node comm with collective state). May call
// peerMemLookup (step 3), a collective exchange.
ncclResult_t zcPlan(ncclComm* comm, const CollArgs& a, ZcPlan* out);

// Debug counters of this process: launches of type t planned zero-copy (by any rank) since
// start; the planners count every zero-copy launch, the GPU tests read the counts to check
// which path ran.
void zcCount(CollType t);
// " (window)", " (raw)", " (mapped)": for log lines.
const char* zcModeName(int mode);
uint64_t zcTakenCount(CollType t);

}  // namespace mk
