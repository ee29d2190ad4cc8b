// Per-comm state of the collective layer (comm->coll): workspace layout, SM budget, the
// device-resident channel counters, the host-mapped error record and the events that
// order the comm's launches and let finalize wait for them.
#pragma once
#include <cstdint>
#include <atomic>
#include <memory>
#include <cuda_runtime.h>
#include <nccl.h>

#include "coll/algo.h"
#include "coll/launch.h"

struct ncclComm;

namespace mk {

struct RdvClique;

struct CollState {
  WsLayout ws{};
  CtaBudget budget{1, 1};
  int me = 0;  // topo.localRank
  bool interNode = false;
  // Every rank of the comm is in this process on this GPU (and MKERNEL_ZERO_COPY allows
  // it): the same value on every rank, so all choose the zero-copy AllReduce alike.
  bool zeroCopy = false;
  // Every local rank is in its own process (single node): registered buffers may be used
  // zero-copy (peerMemLookup, a collective exchange, is then safe to call at enqueue: no
  // thread drives two ranks of this comm).
  bool sepProcs = false;
  void* devState = nullptr;         // comm_dev.h: CtlHdr + counters (device memory)
  rt::ErrRecord* err = nullptr;     // host-pinned, mapped (rt::recordAlloc)
  rt::ErrRecord* errDev = nullptr;  // its device pointer
  // Ordering of consecutive launches of this comm on different streams (NCCL serialises a
  // comm's operations): one event is recorded after every launch (lastEvent; lastStream /
  // lastCapture say where): doneEvent outside stream capture (finalize waits for it too),
  // orderEvent inside one. One record per call: the host cost of a call matters.
  cudaEvent_t orderEvent = nullptr;
  cudaEvent_t doneEvent = nullptr;
  cudaEvent_t lastEvent = nullptr;
  cudaEvent_t forkEvent = nullptr;
  cudaEvent_t joinEvent = nullptr;
  cudaStream_t lastStream = nullptr;
  unsigned long long lastCapture = 0;
  bool haveLast = false;
  bool haveDone = false;
  // Launch stream used instead of the user's when that one cannot run concurrently with
  // the other ranks' streams (legacy default stream, or a stream shared by several comms
  // of one group). Created on first use.
  cudaStream_t internal = nullptr;
  // Host rendezvous with the ranks of this comm that share the GPU in this process
  // (coll/rendezvous.h); null when there are none.
  std::shared_ptr<RdvClique> rdv;
  int rdvSlot = -1;
  std::atomic<bool> errorReported{false};
  bool stuck = false;  // finalize gave up waiting: device memory must not be freed
};

// The CommDev part of the kernel arguments for this comm.
CommDev collCommDev(ncclComm* comm);

}  // namespace mk
