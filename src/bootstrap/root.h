// The bootstrap root: a thread that collects each rank's listen address and tells every rank
// the address of rank+1, so that the ranks can build a ring and allgather the full table among
// themselves (the root never sends O(nranks) data to anyone). With several ids (scalable init),
// each root serves its group of consecutive ranks; the first rank of each group also tells the
// previous group's root its address so that the groups' rings join into one.
//
// The root trusts nothing it reads: every connection must send a complete, valid hello within
// kBootstrapHelloTimeoutMs with the right secret and protocol version; anything else is logged
// at INFO and dropped as soon as a byte of it is wrong. Under a flood the oldest silent
// connections are evicted (proto.h). Hellos that agree on (nranks, nIds, root index) form a
// claim; the root allocates per rank that arrives, never from the claimed count, keeps up to
// kBootstrapMaxClaims claims apart until one completes (a holder of the secret cannot block the
// real ranks by claiming first), and refuses any other claim once the id's creator has told it
// what to expect (bootstrapRootExpect). It exits once every rank of a claim has its answer,
// when a served rank disconnects early and no other claim is left (the rendezvous is doomed:
// everyone is told at once by the closed connection), or when no new rank has arrived for the
// bootstrap timeout.
#pragma once
#include <cstdint>

#include "bootstrap/socket.h"
#include "bootstrap/unique_id.h"

namespace mk {

// MKERNEL_BOOTSTRAP_TIMEOUT_S in ms (at least 1 s).
int64_t bootstrapTimeoutMs();

// Starts a root for `secret` listening on `local` (port 0: any free port); *bound receives the
// address it listens on. The thread is owned by a process-wide registry.
ncclResult_t bootstrapRootStart(uint64_t secret, const SocketAddress* local, SocketAddress* bound);
// When this process runs the root for `secret`, tells it what the id's creator expects: a
// hello claiming anything else is refused. The first call wins; no-op for other processes.
void bootstrapRootExpect(uint64_t secret, int nranks, int nIds, int rootIdx);
// When this process runs the root for `secret`, waits (bounded) until it finished and joins it,
// so that a rank returning from bootstrapInit leaves no root thread behind.
void bootstrapRootJoin(uint64_t secret);
// Joins the roots that have finished; returns how many are still running.
int bootstrapRootsReap();
// Waits up to timeoutMs for every root of this process to finish; returns how many still run.
int bootstrapRootsWait(int64_t timeoutMs);

// Rank side of the rendezvous: registers with the root of this rank's group (and, as the first
// rank of a group when nIds > 1, with the previous group's root), then waits for the listen
// address of rank+1.
ncclResult_t bootstrapRootRendezvous(const BootstrapId* ids, int nIds, int rank, int nranks,
                                     const SocketAddress* myAddr, const uint32_t* abortFlag,
                                     int64_t timeoutMs, SocketAddress* nextAddr);

}  // namespace mk
