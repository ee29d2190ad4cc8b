// Fused operators' state when every local rank is its own process (no peer pointer is valid
// in this one): per rank, a control block (zeroed at creation, never regrown) and a data
// region of two halves, both registered as windows of the comm (transport/peer_mem_win.h), so
// that every local rank maps every other's. One set per (comm, operator family).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>
#include <nccl.h>

#include "fused/core/clique_block.h"  // CliqueTag

struct ncclComm;

namespace mk {
namespace fused {

constexpr int kProcMaxLocal = 32;

// Valid in this process, by rank (the layout is one node).
struct ProcView {
  void* ctl[kProcMaxLocal];
  uint8_t* data[kProcMaxLocal];
  size_t halfBytes;  // each half of every rank's data region
};

// Whether comm runs the processes layout: one node, 2..min(maxLocal, kProcMaxLocal) ranks,
// each in its own process on this host (two ranks of one process would need one thread each
// for the collective registrations below; those layouts run the sequential paths).
bool procWindowsEligible(const ncclComm* comm, int maxLocal);

// COLLECTIVE (every rank of comm calls it with the same arguments, in the same order of
// calls; a fused call's own order guarantees it): makes sure this rank's control block of
// ctlBytes exists and its data region's halves hold halfBytes each, creating or growing them
// as windows of comm. A grown region replaces the old one for later calls; the old one stays
// allocated and mapped until the comm goes (a captured graph may still use it, and so may
// kernels in flight), so a growth waits for nothing. Outside stream capture only when it has
// to create or grow (*ok false, nothing done, when `stream` is being captured then). *ok false
// also when some local rank could not allocate or map: the caller then runs its sequential
// path (every rank agrees).
ncclResult_t procWindowsGet(ncclComm* comm, CliqueTag tag, size_t ctlBytes, size_t halfBytes,
                            cudaStream_t stream, ProcView* view, bool* ok);

// Drops every set of comm (at comm destruction, before its peer memory goes).
void procWindowsRelease(ncclComm* comm);
// At the destruction of a comm whose kernels may still run: forgets its sets without freeing
// or deregistering their memory (leaked: a kernel may still read it). The sets are keyed by
// the comm's address, which a later comm may get: left in place, they would hand it this
// comm's windows and their stale call numbers.
void procWindowsForget(ncclComm* comm);

}  // namespace fused
}  // namespace mk
