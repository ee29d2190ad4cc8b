// Lifetime of the per-comm collective state: init, finalize (bounded wait for the comm's
// kernels), fini, and the translation of device error records into async errors.
#include "coll/coll_state.h"

#include <cstdint>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coll/coll.h"
#include "coll/rendezvous.h"
#include "device/rt/err_host.h"
#include "base/checks.h"
#include "base/cudawrap.h"
#include "comm/comm.h"
#include "base/param.h"
#include "transport/peer_mem.h"

namespace mk {

CommDev collCommDev(ncclComm* comm) {
  CollState* cs = comm->coll;
  CommDev c{};
  c.w.abortFlag = comm->abortFlagDev;
  c.w.hdr = (rt::CtlHdr*)cs->devState;
  c.w.err = cs->errDev;
  c.w.timeoutNs = rt::timeoutNs();
  c.w.rank = comm->rank;
  c.w.op = -1;  // collective kernels name their CollType in every record
  c.peers = comm->peerMem ? (void* const*)comm->peerMem->peersDev : nullptr;
  c.sendCnt = (uint64_t*)((char*)cs->devState + sizeof(rt::CtlHdr));
  c.recvCnt = c.sendCnt + (size_t)kMaxLocalRanks * kMaxLanes;
  c.ws = cs->ws;
  c.me = cs->me;
  c.nLocal = cs->ws.nLocal;
  return c;
}

ncclResult_t collInit(ncclComm* comm) {
  DeviceGuard dg;
  NCCLCHECK(dg.set(comm->cudaDev));
  CollState* cs = new CollState();
  comm->coll = cs;  // collFini releases whatever was built if a later step fails
  const Topo& t = comm->topo;
  cs->me = t.localRank;
  cs->interNode = t.nNodes > 1;
  uint64_t wsBytes = comm->peerMem ? comm->peerMem->bytes : 0;
  NCCLCHECK(wsLayoutCompute(wsBytes, t.localRanks, &cs->ws));
  if (t.localRanks > 1 && (comm->peerMem == nullptr || comm->peerMem->peersDev == nullptr)) {
    MK_WARN("collInit: rank %d has no peer workspace for its %d local peers", comm->rank,
            t.localRanks - 1);
    return ncclInternalError;
  }
  cs->zeroCopy = !cs->interNode && t.localRanks > 1 && MK_PARAM_INT(ZeroCopy) != 0;
  for (int r = 0; r < comm->nRanks && cs->zeroCopy; r++) {
    const RankInfo &a = comm->peerInfo[comm->rank], &b = comm->peerInfo[r];
    cs->zeroCopy = a.hostHash == b.hostHash && a.pidHash == b.pidHash && a.busId == b.busId;
  }
  cs->sepProcs = !cs->interNode && t.localRanks > 1 && MK_PARAM_INT(RegZeroCopy) != 0;
  for (int r = 0; r < comm->nRanks && cs->sepProcs; r++)
    for (int q = r + 1; q < comm->nRanks && cs->sepProcs; q++)
      cs->sepProcs = comm->peerInfo[r].pidHash != comm->peerInfo[q].pidHash ||
                     comm->peerInfo[r].hostHash != comm->peerInfo[q].hostHash;
  cs->budget =
      ctaBudget(comm->smCount, t.ranksOnMyDevice, comm->config.minCTAs, comm->config.maxCTAs,
                (int)MK_PARAM_INT(MinCtas), (int)MK_PARAM_INT(MaxCtas));
  CUDACHECK(cudaStreamCreateWithFlags(&cs->internal, cudaStreamNonBlocking));
  // Stream-ordered allocation: its free (collFini) does not synchronise the device.
  CUDACHECK(cudaMallocAsync(&cs->devState, devStateBytes(), cs->internal));
  CUDACHECK(cudaMemsetAsync(cs->devState, 0, devStateBytes(), cs->internal));
  CUDACHECK(cudaStreamSynchronize(cs->internal));
  NCCLCHECK(rt::recordAlloc(&cs->err, &cs->errDev));
  for (cudaEvent_t* e : {&cs->orderEvent, &cs->doneEvent, &cs->forkEvent, &cs->joinEvent})
    CUDACHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  NCCLCHECK(rdvJoin(comm, &cs->rdv, &cs->rdvSlot));
  MK_INFO(kColl | kInit,
          "collInit: rank %d local %d/%d: %d lanes x %d slots x %llu bytes per peer (copy "
          "engine %d lanes), %d-%d CTAs per kernel (%d SMs, %d ranks on the GPU)%s",
          comm->rank, cs->me, cs->ws.nLocal, cs->ws.lanes, cs->ws.slots,
          (unsigned long long)cs->ws.slotBytes, cs->ws.p2pLanes, cs->budget.lo, cs->budget.hi,
          comm->smCount, t.ranksOnMyDevice,
          cs->interNode ? " - several nodes: inter-node traffic goes through the net layer" : "");
  return ncclSuccess;
}

ncclResult_t collPollAsyncError(ncclComm* comm) {
  CollState* cs = comm->coll;
  if (cs == nullptr) return ncclSuccess;
  const Topo& t = comm->topo;
  rt::ErrNames names;
  names.rank = comm->rank;
  names.setHint(comm->queueHint, comm->topo.inMyProcess);
  if (t.node >= 0 && t.node < (int)t.nodeRanks.size()) {
    names.localRanks = t.nodeRanks[t.node].data();
    names.nLocal = (int)t.nodeRanks[t.node].size();
  }
  ncclResult_t res;
  std::string msg;
  if (rt::poll(cs->err, &cs->errorReported, names, &res, &msg))
    commSetAsyncError(comm, res, msg.c_str());
  return ncclSuccess;
}

ncclResult_t collFinalize(ncclComm* comm) {
  CollState* cs = comm->coll;
  if (cs == nullptr) return ncclSuccess;
  DeviceGuard dg;
  (void)dg.set(comm->cudaDev);  // best effort: the teardown goes on regardless
  ncclResult_t res = ncclSuccess;
  if (cs->haveDone) {
    using Clock = std::chrono::steady_clock;
    bool aborting = comm->abortFlag && __atomic_load_n(comm->abortFlag, __ATOMIC_ACQUIRE) != 0;
    int64_t ms = MK_PARAM_INT(TimeoutMs);
    // Kernels give up by themselves after MKERNEL_TIMEOUT_MS, and within milliseconds of an
    // abort; the host waits a little longer than that, never forever.
    int64_t limitMs = aborting ? 3000 : (ms > 0 ? ms + 5000 : INT64_MAX / 2);
    auto deadline = Clock::now() + std::chrono::milliseconds(limitMs);
    int sleepUs = 20;
    for (;;) {
      cudaError_t r = cudaEventQuery(cs->doneEvent);
      if (r == cudaSuccess) break;
      if (r != cudaErrorNotReady) {
        MK_WARN("rank %d: waiting for the comm's operations failed: %s", comm->rank,
                cudaGetErrorString(r));
        res = ncclUnhandledCudaError;
        break;
      }
      if (Clock::now() > deadline) {
        MK_WARN("rank %d: collective operations still running after %lld ms%s; giving up",
                comm->rank, (long long)limitMs, aborting ? " of abort" : "");
        cs->stuck = true;
        res = aborting ? ncclSuccess : ncclRemoteError;
        break;
      }
      // Re-read the abort flag: an abort from another thread shortens the wait.
      if (!aborting && comm->abortFlag && __atomic_load_n(comm->abortFlag, __ATOMIC_ACQUIRE)) {
        aborting = true;
        deadline = Clock::now() + std::chrono::milliseconds(3000);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(sleepUs));
      if (sleepUs < 2000) sleepUs *= 2;
    }
  }
  collPollAsyncError(comm);
  return res;
}

bool collMayBeRunning(ncclComm* comm) {
  CollState* cs = comm->coll;
  if (cs == nullptr || !cs->haveDone) return false;
  if (cs->stuck) return true;
  DeviceGuard dg;
  (void)dg.set(comm->cudaDev);
  const bool done = cudaEventQuery(cs->doneEvent) == cudaSuccess;
  cudaGetLastError();
  return !done;
}

ncclResult_t collFini(ncclComm* comm) {
  CollState* cs = comm->coll;
  if (cs == nullptr) return ncclSuccess;
  DeviceGuard dg;
  (void)dg.set(comm->cudaDev);     // best effort: the teardown goes on regardless
  rdvLeave(cs->rdv, cs->rdvSlot);  // threads waiting for this rank fail at once
  if (cs->haveDone && !cs->stuck && cudaEventQuery(cs->doneEvent) != cudaSuccess) {
    cudaGetLastError();
    cs->stuck = true;
  }
  if (cs->stuck) {
    // A kernel may still read these: leaking them is better than a fault in another rank.
    MK_WARN("rank %d: kernels of this comm may still be running; leaking its collective state",
            comm->rank);
  } else {
    if (cs->devState) cudaFreeAsync(cs->devState, cs->internal);
    rt::recordFree(cs->err);
  }
  for (cudaEvent_t e : {cs->orderEvent, cs->doneEvent, cs->forkEvent, cs->joinEvent})
    if (e) cudaEventDestroy(e);
  if (cs->internal) cudaStreamDestroy(cs->internal);
  cudaGetLastError();
  delete cs;
  comm->coll = nullptr;
  return ncclSuccess;
}

}  // namespace mk
