// Out-of-band bootstrap: unique id, TCP rendezvous, and a small message layer (allgather,
// barrier, tagged send/recv) between the ranks of a communicator. CPU only: works without a GPU.
//
// Design (details in root.h and bootstrap_impl.h):
//  - bootstrapGetUniqueId makes a random 64-bit secret and starts a root thread listening on the
//    bootstrap interface (ifaces.h); the id carries both. With NCCL_COMM_ID=host:port the id
//    carries that address and a secret derived from it (every process computes the same id, so
//    nothing is secret then, as in NCCL); the root is started in bootstrapInit by the first rank
//    of the root's group (rank 0 with a single id, like NCCL), which must be able to bind it.
//  - Each rank listens on its own socket, registers with the root, learns the address of
//    rank+1, and the ranks allgather the full address table around that ring. After that the
//    root is not needed: messages go directly between ranks.
//  - Messages are matched by (peer, tag) whatever their arrival order: a receiver thread per
//    Bootstrap drains every incoming connection into a queue, so a send never waits for the
//    matching recv (no deadlock when two ranks send to each other first).
//  - Every blocking call ends within MKERNEL_BOOTSTRAP_TIMEOUT_S (ncclRemoteError naming the
//    peer) and within ~20 ms of the abort flag becoming non-zero (ncclInternalError, "aborted").
//  - All functions are safe to call concurrently from several threads on one Bootstrap, except
//    that the collectives (allgather, barrier, split) must be called in the same order by all
//    ranks, one at a time per Bootstrap.
#pragma once
#include <cstddef>
#include <cstdint>

#include <nccl.h>

namespace mk {

struct Bootstrap;  // one rank's endpoint in one communicator

// Creates a unique id (see above). Works without a GPU.
ncclResult_t bootstrapGetUniqueId(ncclUniqueId* out);

// Collective over nranks callers (threads or processes). nIds > 1 (ncclCommInitRankScalable):
// rank r registers with the root of ids[r * nIds / nranks]; 1 <= nIds <= nranks, the same ids
// in the same order on every rank. abortFlag (may be null) is polled with an acquire load.
ncclResult_t bootstrapInit(const ncclUniqueId* ids, int nIds, int rank, int nranks,
                           const uint32_t* abortFlag, Bootstrap** out);

// Child bootstrap among members[0..nMembers) (parent ranks, in child-rank order), called by
// the members only, with identical arguments except myIndex (the caller's index in members).
// Addresses travel through the parent's send/recv around a ring of the members only, so
// non-members (possibly dead: ncclCommShrink) are never contacted. `tag` distinguishes
// concurrent splits of one parent. abortFlag is the child's; the parent's flag is also honoured
// while the split talks through the parent.
ncclResult_t bootstrapSplit(Bootstrap* parent, const int* members, int nMembers, int myIndex,
                            uint64_t tag, const uint32_t* abortFlag, Bootstrap** out);

// In place: data holds nranks slices of bytesPerRank; slice `rank` is this rank's input.
ncclResult_t bootstrapAllGather(Bootstrap* b, void* data, size_t bytesPerRank);
ncclResult_t bootstrapBarrier(Bootstrap* b);
// Tagged point-to-point messages; the sizes of a matching send and recv must be equal. Sending to
// oneself is allowed. A send returns once the data is handed to the kernel.
ncclResult_t bootstrapSend(Bootstrap* b, int peer, int tag, const void* data, size_t size);
ncclResult_t bootstrapRecv(Bootstrap* b, int peer, int tag, void* data, size_t size);
int bootstrapRank(const Bootstrap* b);
int bootstrapNRanks(const Bootstrap* b);
// Frees every fd, thread and byte. Safe after an abort or a failure; null is a no-op.
ncclResult_t bootstrapClose(Bootstrap* b);

// Test and diagnostics hooks: wait up to timeoutMs for this process's root threads to finish
// (they end by themselves) and join them; returns how many still run.
int bootstrapRootsWait(int64_t timeoutMs);

}  // namespace mk
