// Windows (ncclCommWindowRegister / ncclCommWindowDeregister, NCCL 2.27+): a buffer that
// every rank of the comm registers together, so that every local peer's window is mapped
// here once, at registration, instead of at each collective.
//
// A window is an ordinary registration (transport/peer_mem.h: the lookup path of
// ncclCommRegister finds it too) plus, per local rank, the base of that rank's window
// mapped in this process. A collective on a window buffer needs no exchange on the host:
// each rank publishes its window key and offset in the kernels' handshake (device/zc.cuh)
// and its peers add the offset to their mapping of its window. So NCCL_WIN_COLL_SYMMETRIC
// (equal offsets promised) and NCCL_WIN_DEFAULT behave the same here, and in-place
// collectives, whose buffers sit at rank-dependent offsets, work on windows too.
//
// Registration is collective over the whole comm (every rank, in the same order); it maps
// what can be mapped and never fails for lack of it: a window some local rank cannot map
// (host memory of another process, no fd handle, a failed import) is "not mapped" and the
// collectives stage through the workspace. Deregistration is local (as in NCCL: one thread
// may deregister several ranks' windows one after the other).
#pragma once
#include <cstddef>
#include <cstdint>
#include <nccl.h>
#include <vector>

struct ncclComm;

namespace mk {

// Checks made when the call is issued (local, no communication): comm has peer memory;
// buff is device memory of comm->cudaDev (not host, not managed); size > 0; flags only
// NCCL_WIN_DEFAULT / NCCL_WIN_COLL_SYMMETRIC. ncclInvalidArgument + message otherwise.
ncclResult_t peerMemWinCheck(ncclComm* comm, void* buff, size_t size, int flags);

// COLLECTIVE and blocking: every rank of the comm calls it, in the same order of
// registrations, each from its own thread (one thread driving several ranks must run
// them concurrently: api/api_window.cc does it at ncclGroupEnd). Registers the buffer,
// exchanges sizes and flags, maps every local peer's window and agrees on the result.
// *win is set on success only; on failure nothing stays registered or mapped.
ncclResult_t peerMemWinRegister(ncclComm* comm, void* buff, size_t size, int flags,
                                ncclWindow_t* win);

// Local. win must be a live window of this comm: a window of another comm, one already
// deregistered, or anything else -> ncclInvalidArgument with a message (nothing is
// dereferenced before it is found in the registry). The caller makes sure no operation
// on the window is still running (api/api_window.cc waits for the comm's work).
ncclResult_t peerMemWinDeregister(ncclComm* comm, ncclWindow_t win);

// Local lookups at enqueue (no communication).
// [ptr, ptr + bytes) lies in a window of this rank that every local rank mapped: its key
// (id + 1, the same on every rank), this rank's offset in it and every local rank's window
// base valid in this process (by local index).
bool peerMemWinFind(ncclComm* comm, const void* ptr, size_t bytes, uint64_t* key, uint64_t* off,
                    std::vector<void*>* bases);
// [ptr, ptr + bytes) lies in a registration (ncclCommRegister) or a window of this comm.
bool peerMemIsRegistered(ncclComm* comm, const void* ptr, size_t bytes);
// Windows this rank holds (tests).
int peerMemWinCount(ncclComm* comm);

}  // namespace mk
