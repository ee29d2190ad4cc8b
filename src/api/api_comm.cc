// Communicator lifecycle and query API.
#include <mutex>
#include <chrono>
#include <cuda_runtime.h>
#include <thread>
#include <vector>

#include "coll/coll.h"
#include "coll/group.h"
#include "api/api.h"
#include "base/checks.h"
#include "comm/comm.h"
#include "base/cudawrap.h"
#include "api/init.h"
#include "transport/net_state.h"
#include "transport/peer_mem.h"

using namespace mk;

MK_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t* comm, int nranks, ncclUniqueId commId,
       int rank, ncclConfig_t* config) {
  return groupRecordError(apiGuard("ncclCommInitRankConfig", [&] {
    return commInitRank(comm, nranks, &commId, 1, rank, config, "ncclCommInitRankConfig");
  }));
}

MK_API(ncclResult_t, ncclCommInitRank, ncclComm_t* comm, int nranks, ncclUniqueId commId,
       int rank) {
  return groupRecordError(apiGuard("ncclCommInitRank", [&] {
    return commInitRank(comm, nranks, &commId, 1, rank, nullptr, "ncclCommInitRank");
  }));
}

MK_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t* newcomm, int nranks, int myrank, int nId,
       ncclUniqueId* commIds, ncclConfig_t* config) {
  return groupRecordError(apiGuard("ncclCommInitRankScalable", [&] {
    return commInitRank(newcomm, nranks, commIds, nId, myrank, config, "ncclCommInitRankScalable");
  }));
}

MK_API(ncclResult_t, ncclCommInitAll, ncclComm_t* comms, int ndev, const int* devlist) {
  MK_ARGCHECK(comms != nullptr, "ncclCommInitAll: comms is NULL");
  MK_ARGCHECK(ndev >= 1, "ncclCommInitAll: invalid ndev %d", ndev);
  if (devlist)
    for (int i = 0; i < ndev; i++)
      MK_ARGCHECK(devlist[i] >= 0, "ncclCommInitAll: invalid device %d at index %d", devlist[i], i);
  if (cudaLibInit() != ncclSuccess) {
    MK_WARN("ncclCommInitAll: no usable CUDA device on this machine");
    return ncclUnhandledCudaError;
  }
  int count = 0, saved = 0;
  CUDACHECK(cudaGetDeviceCount(&count));
  for (int i = 0; i < ndev; i++) {
    int d = devlist ? devlist[i] : i;
    // Unlike NCCL, a device may repeat (several ranks sharing one GPU); without a devlist
    // the ranks wrap around the visible devices.
    MK_ARGCHECK(devlist == nullptr || d < count,
                "ncclCommInitAll: device %d at index %d does not exist (%d devices)", d, i, count);
  }
  CUDACHECK(cudaGetDevice(&saved));
  ncclUniqueId id;
  NCCLCHECK(ncclGetUniqueId(&id));
  for (int i = 0; i < ndev; i++) comms[i] = nullptr;
  NCCLCHECK(ncclGroupStart());
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < ndev && res == ncclSuccess; i++) {
    int d = devlist ? devlist[i] : i % count;
    cudaSetDevice(d);
    res = ncclCommInitRank(&comms[i], ndev, id, i);
  }
  ncclResult_t endRes = ncclGroupEnd();
  if (res == ncclSuccess) res = endRes;
  cudaSetDevice(saved);
  if (res != ncclSuccess) {
    for (int i = 0; i < ndev; i++)
      if (comms[i]) {
        ncclCommAbort(comms[i]);
        comms[i] = nullptr;
      }
  }
  return res;
}

namespace {
ncclResult_t commFinalize(ncclComm* comm) {
  const char* api = "ncclCommFinalize";
  NCCLCHECK(commCheck(comm, api));
  NCCLCHECK(commCheckInitDone(comm, api));
  // As NCCL: once only, also while a nonblocking finalize is still running.
  MK_ARGCHECK(!comm->finalizeCalled.load(),
              "ncclCommFinalize: communicator %p was already finalized", (void*)comm);
  NCCLCHECK(commCheckReady(comm, api));
  MK_ARGCHECK(!comm->finalizeCalled.exchange(true),
              "ncclCommFinalize: communicator %p was already finalized", (void*)comm);
  if (!comm->config.blocking) {
    return commRunJob(comm, [comm]() -> ncclResult_t {
      NCCLCHECK(collFinalize(comm));
      comm->state.store(CommState::kFinalized);
      return ncclSuccess;
    });
  }
  NCCLCHECK(collFinalize(comm));
  comm->state.store(CommState::kFinalized);
  return ncclSuccess;
}
}  // namespace

MK_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  // Inside a group its error is the group's too (ncclGroupEnd returns it), as in NCCL.
  return groupRecordError(commFinalize(comm));
}

MK_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  NCCLCHECK(commCheck(comm, "ncclCommDestroy"));
  if (comm->job.joinable()) comm->job.join();
  ncclResult_t res = ncclSuccess;
  // An implicit finalize: operations already issued complete before resources go away.
  if (comm->state.load() == CommState::kReady) res = collFinalize(comm);
  ncclResult_t r = commFree(comm);
  return res != ncclSuccess ? res : r;
}

MK_API(ncclResult_t, ncclCommAbort, ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  NCCLCHECK(commCheck(comm, "ncclCommAbort"));
  // Both flags: device waits and bootstrap sockets return promptly, then the background
  // job (if any) is joined and everything is freed without waiting for peers.
  __atomic_store_n(comm->abortFlag, 1u, __ATOMIC_RELEASE);
  __atomic_store_n(&comm->bootstrapAbort, 1u, __ATOMIC_RELEASE);
  comm->state.store(CommState::kAborted);
  // The proxy drops pending work at once. A background job (nonblocking init) may still be
  // creating comm->net: then abort only after joining it (it sees bootstrapAbort and
  // returns within the bootstrap/net timeouts), so that nobody reads comm->net while the
  // job writes it.
  if (!comm->job.joinable()) netAbort(comm);
  if (comm->job.joinable()) comm->job.join();
  netAbort(comm);
  collFinalize(comm);  // returns at once: kernels see the abort flag
  commFree(comm);
  return ncclSuccess;
}

MK_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags) {
  NCCLCHECK(commCheck(comm, "ncclCommRevoke"));
  MK_ARGCHECK(revokeFlags == NCCL_REVOKE_DEFAULT,
              "ncclCommRevoke: revokeFlags must be NCCL_REVOKE_DEFAULT (0), got %d", revokeFlags);
  CommState st = comm->state.load();
  if (st == CommState::kRevoked) return ncclSuccess;
  NCCLCHECK(commCheckReady(comm, "ncclCommRevoke"));
  ncclResult_t res = commStopDeviceWork(comm);
  comm->state.store(CommState::kRevoked);
  return res;
}

MK_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
       ncclConfig_t* config) {
  NCCLCHECK(groupRecordError(commCheck(comm, "ncclCommSplit")));
  return groupRecordError(
      apiGuard("ncclCommSplit", [&] { return commSplit(comm, color, key, newcomm, config); }));
}

MK_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
       ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  NCCLCHECK(groupRecordError(commCheck(comm, "ncclCommShrink")));
  return groupRecordError(apiGuard("ncclCommShrink", [&] {
    return commShrink(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
  }));
}

MK_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t* asyncError) {
  NCCLCHECK(commCheck(comm, "ncclCommGetAsyncError"));
  MK_ARGCHECK(asyncError != nullptr, "ncclCommGetAsyncError: asyncError is NULL");
  if (comm->state.load() == CommState::kReady) {
    NCCLCHECK(collPollAsyncError(comm));
    NCCLCHECK(netPollAsyncError(comm));
  }
  *asyncError = static_cast<ncclResult_t>(comm->asyncResult.load());
  if (*asyncError != ncclSuccess && *asyncError != ncclInProgress) {
    std::lock_guard<std::mutex> g(comm->asyncMu);
    if (!comm->asyncMsg.empty()) setLastError(comm->asyncMsg.c_str());
  }
  return ncclSuccess;
}

MK_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count) {
  NCCLCHECK(commCheck(comm, "ncclCommCount"));
  MK_ARGCHECK(count != nullptr, "ncclCommCount: count is NULL");
  // The init job writes the attributes (a split child's rank and size): read them after it.
  NCCLCHECK(commCheckInitDone(comm, "ncclCommCount"));
  *count = comm->nRanks;
  return ncclSuccess;
}

MK_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int* device) {
  NCCLCHECK(commCheck(comm, "ncclCommCuDevice"));
  MK_ARGCHECK(device != nullptr, "ncclCommCuDevice: device is NULL");
  NCCLCHECK(commCheckInitDone(comm, "ncclCommCuDevice"));
  *device = comm->cudaDev;
  return ncclSuccess;
}

MK_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int* rank) {
  NCCLCHECK(commCheck(comm, "ncclCommUserRank"));
  MK_ARGCHECK(rank != nullptr, "ncclCommUserRank: rank is NULL");
  NCCLCHECK(commCheckInitDone(comm, "ncclCommUserRank"));
  *rank = comm->rank;
  return ncclSuccess;
}

MK_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void* buff, size_t size,
       void** handle) {
  NCCLCHECK(commCheck(comm, "ncclCommRegister"));
  MK_ARGCHECK(handle != nullptr, "ncclCommRegister: handle is NULL");
  if (buff == nullptr || size == 0) {  // as NCCL: nothing to register is no error
    *handle = nullptr;
    return ncclSuccess;
  }
  return apiGuard("ncclCommRegister", [&] { return peerMemRegister(comm, buff, size, handle); });
}

MK_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void* handle) {
  NCCLCHECK(commCheck(comm, "ncclCommDeregister"));
  if (handle == nullptr) return ncclSuccess;  // as NCCL (and what ncclCommRegister of NULL gives)
  return peerMemDeregister(comm, handle);
}
