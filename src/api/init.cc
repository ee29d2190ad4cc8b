#include "api/init.h"

#include "api/agreed.h"

#include <cstdint>
#include <vector>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <string>
#include <cuda_runtime.h>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "bootstrap/unique_id.h"
#include "coll/coll.h"
#include "fused/core/clique_block.h"
#include "fused/core/proc_windows.h"
#include "coll/group.h"
#include "coll/redop.h"
#include "base/checks.h"
#include "base/cudawrap.h"
#include "base/param.h"
#include "base/scratch.h"
#include "topo/topo.h"
#include "transport/net_state.h"
#include "transport/peer_mem.h"

namespace mk {
namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

uint64_t hashBytes(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char*)p)[i]) * 1099511628211ull;
  return h;
}

}  // namespace

ncclResult_t commAlloc(int cudaDev, const Config& cfg, int rank, int nRanks, ncclComm** out) {
  ncclComm* comm = new ncclComm();
  comm->config = cfg;
  comm->cudaDev = cudaDev;
  comm->rank = rank;
  comm->nRanks = nRanks;
  ncclResult_t res = ncclSuccess;
  int major = 0, minor = 0;
  CUDACHECKGOTO(cudaDeviceGetAttribute(&comm->smCount, cudaDevAttrMultiProcessorCount, cudaDev),
                res, fail);
  CUDACHECKGOTO(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cudaDev), res,
                fail);
  CUDACHECKGOTO(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, cudaDev), res,
                fail);
  comm->cudaArch = major * 100 + minor * 10;
  CUDACHECKGOTO(cudaSetDevice(cudaDev), res, fail);
  CUDACHECKGOTO(cudaHostAlloc((void**)&comm->abortFlag, 64, cudaHostAllocMapped), res, fail);
  comm->abortFlagPinned = true;
  *comm->abortFlag = 0;
  CUDACHECKGOTO(cudaHostGetDevicePointer((void**)&comm->abortFlagDev, comm->abortFlag, 0), res,
                fail);
  redOpTableInit(comm);
  commRegister(comm);
  *out = comm;
  return ncclSuccess;
fail:
  if (comm->abortFlag) cudaFreeHost(comm->abortFlag);
  delete comm;
  return res;
}

ncclResult_t commSetup(ncclComm* comm) {
  logSetThreadDevice(comm->cudaDev);
  CUDACHECK(cudaSetDevice(comm->cudaDev));
  comm->peerInfo.assign(comm->nRanks, RankInfo{});
  NCCLCHECK(topoLocalInfo(comm, &comm->peerInfo[comm->rank]));
  agreedParamsFill(comm->nRanks, comm->peerInfo[comm->rank].agreed);
  NCCLCHECK(bootstrapAllGather(comm->bootstrap, comm->peerInfo.data(), sizeof(RankInfo)));
  {
    std::string why;
    if (agreedParamsCheck(comm->peerInfo, comm->rank, &why) != ncclSuccess) {
      MK_WARN("ncclCommInitRank: %s", why.c_str());
      return ncclInvalidUsage;
    }
  }
  NCCLCHECK(topoCompute(comm->peerInfo, comm->rank, (int)MK_PARAM_INT(EmulateNodes), &comm->topo));
  topoAffinity(comm->peerInfo[comm->rank].busId, &comm->topo);
  {
    int mps = 0;
    if (cudaDeviceGetAttribute(&mps, cudaDevAttrMpsEnabled, comm->cudaDev) != cudaSuccess) {
      (void)cudaGetLastError();  // an older driver without the attribute: assume no MPS
      mps = 0;
    }
    comm->queueHint =
        topoQueueHint(comm->topo.ranksInMyProcess, mps != 0, getenv("CUDA_DEVICE_MAX_CONNECTIONS"));
    // Advisory: init succeeded, so ncclGetLastError must not return it.
    static std::atomic<bool> warned{false};
    if (!comm->queueHint.empty() && !warned.exchange(true))
      MK_WARN_ADVISORY("ncclCommInitRank: %s", comm->queueHint.c_str());
  }
  NCCLCHECK(peerMemInit(comm));
  NCCLCHECK(netInit(comm));  // no-op unless the comm spans (virtual) nodes
  NCCLCHECK(collInit(comm));
  NCCLCHECK(bootstrapBarrier(comm->bootstrap));
  comm->state.store(CommState::kReady);
  MK_INFO(kInit,
          "comm %p rank %d nRanks %d cudaDev %d busId %lx commHash %016lx node %d/%d localRank "
          "%d/%d ranksOnDevice %d%s - Init COMPLETE",
          (void*)comm, comm->rank, comm->nRanks, comm->cudaDev,
          (long)comm->peerInfo[comm->rank].busId, (unsigned long)comm->commHash, comm->topo.node,
          comm->topo.nNodes, comm->topo.localRank, comm->topo.localRanks,
          comm->topo.ranksOnMyDevice, comm->topo.virtualNodes ? " (virtual nodes)" : "");
  return ncclSuccess;
}

ncclResult_t commStopDeviceWork(ncclComm* comm) {
  __atomic_store_n(comm->abortFlag, 1u, __ATOMIC_RELEASE);
  return collFinalize(comm);
}

ncclResult_t commFree(ncclComm* comm) {
  if (comm->job.joinable()) comm->job.join();
  commUnregister(comm);
  ncclResult_t res = ncclSuccess, r;
  if (comm->cudaDev >= 0) cudaSetDevice(comm->cudaDev);
  // A kernel of the comm that abort's grace period did not see end (e.g. queued behind another
  // comm's kernel that waits for its peers) may still read the comm's device memory, and
  // freeing it would also wait for that kernel: leak instead (the kernel ends at its deadline).
  const bool running = collMayBeRunning(comm);
  if (running)
    MK_WARN(
        "rank %d: kernels of this comm may still be running: leaking its device memory "
        "(fused state, net blocks, peer memory, abort flag) instead of freeing it",
        comm->rank);
  if (!running) {
    mk::fused::cliqueBlocksRelease(comm);
    mk::fused::procWindowsRelease(comm);  // its windows go before the peer memory
  } else {
    mk::fused::procWindowsForget(comm);  // keyed by this address, which a new comm may get
  }
  if ((r = collFini(comm)) != ncclSuccess && res == ncclSuccess) res = r;
  if ((r = netFini(comm, running)) != ncclSuccess && res == ncclSuccess) res = r;
  if (!running && (r = peerMemFini(comm)) != ncclSuccess && res == ncclSuccess) res = r;
  if (comm->bootstrap && (r = bootstrapClose(comm->bootstrap)) != ncclSuccess && res == ncclSuccess)
    res = r;
  comm->bootstrap = nullptr;
  redOpFreeAll(comm);
  if (comm->abortFlagPinned && !running) cudaFreeHost(comm->abortFlag);
  // Unused scratch goes back to the driver with the comm; live comms' calls regrow it.
  if (comm->cudaDev >= 0 && !running) scratchTrim(comm->cudaDev);
  comm->magic = comm->magicEnd = kCommDead;
  delete comm;
  return res;
}

ncclResult_t commInitRank(ncclComm_t* newcomm, int nranks, const ncclUniqueId* ids, int nIds,
                          int rank, const ncclConfig_t* config, const char* api) {
  // Argument checks first: identical with or without a GPU.
  MK_ARGCHECK(newcomm != nullptr, "%s: newcomm is NULL", api);
  // As NCCL: a failed init leaves *newcomm NULL, not what the caller had there.
  *newcomm = nullptr;
  MK_ARGCHECK(nranks >= 1, "%s: invalid nranks %d (must be >= 1)", api, nranks);
  MK_ARGCHECK(rank >= 0 && rank < nranks, "%s: invalid rank %d (nranks %d)", api, rank, nranks);
  MK_ARGCHECK(ids != nullptr && nIds >= 1 && nIds <= nranks,
              "%s: invalid unique ids (%d ids for %d ranks)", api, nIds, nranks);
  for (int i = 0; i < nIds; i++) {
    BootstrapId decoded;
    NCCLCHECK(bootstrapIdDecode(&ids[i], &decoded));
  }
  Config cfg;
  NCCLCHECK(configParse(config, &cfg));
  logVersionBanner();
  if (cudaLibInit() != ncclSuccess) {
    MK_WARN("%s: no usable CUDA device on this machine; mkernel needs a GPU for communicators",
            api);
    return ncclUnhandledCudaError;
  }
  int dev = -1;
  CUDACHECK(cudaGetDevice(&dev));
  ncclComm* comm = nullptr;
  NCCLCHECK(commAlloc(dev, cfg, rank, nranks, &comm));
  *newcomm = comm;
  std::vector<ncclUniqueId> idCopy(ids, ids + nIds);
  comm->commHash = hashBytes(idCopy.data(), sizeof(ncclUniqueId) * nIds);
  ncclResult_t res = commRunJob(comm, [comm, idCopy, nIds, rank, nranks]() -> ncclResult_t {
    CUDACHECK(cudaSetDevice(comm->cudaDev));
    NCCLCHECK(
        bootstrapInit(idCopy.data(), nIds, rank, nranks, &comm->bootstrapAbort, &comm->bootstrap));
    return commSetup(comm);
  });
  // An error here is a blocking init that failed, or a job its group refused (never queued):
  // either way nothing else will free the comm.
  if (res != ncclSuccess && res != ncclInProgress) {
    commFree(comm);
    *newcomm = nullptr;
  }
  return res;
}

ncclResult_t commSplit(ncclComm* parent, int color, int key, ncclComm_t* newcomm,
                       const ncclConfig_t* config) {
  MK_ARGCHECK(newcomm != nullptr, "ncclCommSplit: newcomm is NULL");
  NCCLCHECK(commCheckReady(parent, "ncclCommSplit"));
  *newcomm = nullptr;  // as NCCL: from here on, a failure leaves it NULL
  MK_ARGCHECK(color >= 0 || color == NCCL_SPLIT_NOCOLOR,
              "ncclCommSplit: invalid color %d (must be >= 0 or NCCL_SPLIT_NOCOLOR)", color);
  Config cfg;
  NCCLCHECK(configInherit(config, parent->config, &cfg));
  uint64_t seq = parent->splitCount++;
  ncclComm* child = nullptr;
  if (color != NCCL_SPLIT_NOCOLOR) NCCLCHECK(commAlloc(parent->cudaDev, cfg, -1, 0, &child));
  *newcomm = child;  // written at once, also in nonblocking mode
  auto job = [parent, child, color, key, seq]() -> ncclResult_t {
    struct Entry {
      int color, key;
    };
    std::vector<Entry> all(parent->nRanks);
    all[parent->rank] = {color, key};
    NCCLCHECK(bootstrapAllGather(parent->bootstrap, all.data(), sizeof(Entry)));
    if (child == nullptr) return ncclSuccess;
    std::vector<int> members;
    for (int r = 0; r < parent->nRanks; r++)
      if (all[r].color == color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return all[a].key < all[b].key; });
    int me = (int)(std::find(members.begin(), members.end(), parent->rank) - members.begin());
    child->rank = me;
    child->nRanks = (int)members.size();
    child->commHash = mix(mix(parent->commHash, seq), (uint64_t)color);
    NCCLCHECK(bootstrapSplit(parent->bootstrap, members.data(), child->nRanks, me, child->commHash,
                             &child->bootstrapAbort, &child->bootstrap));
    return commSetup(child);
  };
  ncclResult_t res = commRunJob(child ? child : parent, job);
  if (res != ncclSuccess && res != ncclInProgress && child) {  // as in commInitRank
    commFree(child);
    *newcomm = nullptr;
  }
  return res;
}

ncclResult_t commShrink(ncclComm* parent, const int* exclude, int nExclude, ncclComm_t* newcomm,
                        const ncclConfig_t* config, int flags) {
  const char* api = "ncclCommShrink";
  MK_ARGCHECK(newcomm != nullptr, "%s: newcomm is NULL", api);
  MK_ARGCHECK(flags == NCCL_SHRINK_DEFAULT || flags == NCCL_SHRINK_ABORT, "%s: invalid flags 0x%x",
              api, flags);
  // As NCCL: a shrink excludes at least one rank (a copy of the comm is ncclCommSplit's job).
  MK_ARGCHECK(exclude != nullptr, "%s: excludeRanksList is NULL", api);
  MK_ARGCHECK(nExclude >= 1 && nExclude < parent->nRanks,
              "%s: invalid excludeRanksCount %d (must be in [1, nranks %d))", api, nExclude,
              parent->nRanks);
  std::vector<bool> excluded(parent->nRanks, false);
  for (int i = 0; i < nExclude; i++) {
    MK_ARGCHECK(exclude[i] >= 0 && exclude[i] < parent->nRanks,
                "%s: excluded rank %d out of range (nranks %d)", api, exclude[i], parent->nRanks);
    MK_ARGCHECK(!excluded[exclude[i]], "%s: rank %d listed twice", api, exclude[i]);
    excluded[exclude[i]] = true;
  }
  MK_ARGCHECK(!excluded[parent->rank], "%s: the calling rank %d is in the exclude list", api,
              parent->rank);
  CommState st = parent->state.load();
  if (st != CommState::kReady && st != CommState::kRevoked) NCCLCHECK(commCheckReady(parent, api));
  *newcomm = nullptr;  // as NCCL: from here on, a failure leaves it NULL
  Config cfg;
  NCCLCHECK(configInherit(config, parent->config, &cfg));
  if (flags == NCCL_SHRINK_ABORT) {
    NCCLCHECK(commStopDeviceWork(parent));
    parent->state.store(CommState::kRevoked);
  }
  std::vector<int> members;
  for (int r = 0; r < parent->nRanks; r++)
    if (!excluded[r]) members.push_back(r);
  int me = (int)(std::find(members.begin(), members.end(), parent->rank) - members.begin());
  uint64_t seq = parent->splitCount++;
  ncclComm* child = nullptr;
  NCCLCHECK(commAlloc(parent->cudaDev, cfg, me, (int)members.size(), &child));
  child->commHash = mix(mix(parent->commHash, seq), 0x5368726b /* "Shrk" */);
  *newcomm = child;
  ncclResult_t res = commRunJob(child, [parent, child, members, me]() -> ncclResult_t {
    NCCLCHECK(bootstrapSplit(parent->bootstrap, members.data(), (int)members.size(), me,
                             child->commHash, &child->bootstrapAbort, &child->bootstrap));
    return commSetup(child);
  });
  if (res != ncclSuccess && res != ncclInProgress) {  // as in commInitRank
    commFree(child);
    *newcomm = nullptr;
  }
  return res;
}

}  // namespace mk
