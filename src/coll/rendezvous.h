// Host rendezvous of the ranks of one comm that share a GPU inside this process, each driven
// by its own thread (nccl-tests -t, one thread per rank in frameworks).
//
// Why: a rank's kernel spins on the device until its peers' kernels run. When the peers live
// in this process on the same GPU, their threads share one CUDA context with it, and any
// device-synchronising call one of them makes before issuing its part (cudaDeviceSynchronize,
// cudaFree, cudaFreeHost, synchronous cudaMemset/cudaMemcpy, lazy module loading) waits for
// the spinning kernel, which waits for that thread: a deadlock that only the kernel's
// MKERNEL_TIMEOUT_MS ends. nccl-tests does exactly that (cudaDeviceSynchronize in its data
// initialisation and check, with the threads a futex wake-up apart after every barrier).
// So a call that would launch work depending on such a peer first waits, on the host, until
// that peer has issued its matching call (NCCL documents that its calls may block until the
// other threads' ranks arrive), and transitively until every rank that the peer's call still
// waits for has issued its own: the peer launches only when its wait ends, so a kernel
// depends on the whole chain (a send/recv ring of 4 or more ranks is such a chain). Then
// every kernel on the GPU has all the in-process kernels it depends on launched or about to
// be, and every device-wide synchronisation completes.
//
// Matching: collectives (and fused operators) are counted per rank, in call order; sends and
// receives per (rank, peer) pair, in order, as NCCL matches them. A call posts its counts and
// the call it waits in first and only then waits, all under one process-wide lock, so calls
// of different threads never wait for each other in a cycle and the chain is read as one
// snapshot. A peer driven by the waiting thread itself (one thread driving several ranks,
// which must group its calls) is never waited for, nor is a peer no live thread has driven
// yet once a short grace period has passed (the single-thread patterns that issue ranks one
// after another). Waits are bounded by MKERNEL_TIMEOUT_MS and end on the comm's abort.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>
#include <nccl.h>

#include "coll/coll.h"

namespace mk {

struct RdvClique;

// What one comm of a call or group contributes.
struct RdvWork {
  ncclComm* comm = nullptr;
  uint64_t colls = 0;                          // collectives and fused operators
  const std::vector<CollArgs>* p2p = nullptr;  // sends and receives (may be null)
  bool launches = false;                       // the call launches device work for this comm
};

// collInit: joins the clique of the comm's ranks in this process on its GPU; *out stays null
// when the rank has no such peer (nothing to wait for, no cost at enqueue).
ncclResult_t rdvJoin(ncclComm* comm, std::shared_ptr<RdvClique>* out, int* slot);
// collFini (also after abort): later waits for this rank fail at once instead of timing out.
void rdvLeave(const std::shared_ptr<RdvClique>& c, int slot);
// Posts the works' counts, then waits until every in-process peer on the same GPU has issued
// what the launching works need. On timeout or abort: the comm's async error is set and an
// error returned (nothing of the call must be launched then).
ncclResult_t rdvArrive(const std::vector<RdvWork>& works, const char* api);
// After the launches of a call that rdvArrive let through (on every exit path, `wait` false
// on errors): marks them launched and, with `wait`, waits until the in-process peers it
// depends on have launched their matching operations, before the caller puts anything
// behind its kernels. Why: a GPU feeds the streams of a process through a few hardware
// queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default), in submission order. A command that
// depends on our spinning kernel (the GEMM after an AllGather, a stream join, an event wait)
// holds its queue until that kernel ends; a peer's kernel submitted later to the same queue
// then never starts, and our kernel waits for it: a deadlock that only the device timeout
// ends (FusedMatrixThreadPerRank.EveryCall/n8, 3 runs in 7 on the H200). Once every matching
// kernel is submitted, such commands queue behind them. Bounded by MKERNEL_TIMEOUT_MS and
// the comms' abort flags; never an error (the kernels' own timeouts name a peer that never
// launches). Calls with several launch rounds per rank still submit round i + 1 before
// their peers' round i (coll/enqueue.cc, phase B).
void rdvLaunched(const std::vector<RdvWork>& works, bool wait);
// One collective-like operation of comm launched outside collEnqueue (a fused operator that
// launches its own kernel): call it before the launch, on every rank.
ncclResult_t rdvArriveOne(ncclComm* comm, const char* api);

}  // namespace mk
