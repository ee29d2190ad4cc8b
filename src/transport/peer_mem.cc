// The per-comm symmetric workspace: allocation, exchange with intra-node peers, teardown.
#define MK_PEER_MEM_INTERNAL 1
#include <cstdint>
#include <utility>
#include <vector>
#include <map>
#include <mutex>

#include "transport/peer_mem.h"

#include <cinttypes>
#include <cstring>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "base/checks.h"
#include "comm/comm.h"
#include "base/cudawrap.h"
#include "base/param.h"

namespace mk {
namespace {

// What every rank publishes in the first allgather of peerMemInit.
struct InitInfo {
  int32_t status;  // ncclResult_t of this rank's local steps
  int32_t dev;
  int32_t exportable;  // the workspace has a POSIX-fd handle
  int32_t pad;
  uint64_t bytes;
  uint64_t ptr;
  char sockName[kIpcNameLen];  // empty: no IPC socket
};

// The payload that accompanies a workspace fd (a sender that failed to export still sends
// it, without an fd, so that the receiver fails fast instead of timing out).
struct FdMsg {
  int32_t status;
  int32_t pad;
  uint64_t bytes;
};

bool sameProcess(const ncclComm* comm, int rank) {
  const RankInfo& a = comm->peerInfo[comm->rank];
  const RankInfo& b = comm->peerInfo[rank];
  return a.hostHash == b.hostHash && a.pidHash == b.pidHash;
}

ncclResult_t allGather(ncclComm* comm, void* data, size_t bytesPerRank) {
  if (comm->nRanks == 1) return ncclSuccess;
  return bootstrapAllGather(comm->bootstrap, data, bytesPerRank);
}

// Fills the local-peer tables of im from comm->topo / comm->peerInfo.
ncclResult_t localPeers(ncclComm* comm, PeerMem::Impl* im) {
  const Topo& t = comm->topo;
  MK_ARGCHECK(t.node >= 0 && t.node < (int)t.nodeRanks.size(),
              "peerMemInit: topo.node %d out of range (%zu nodes)", t.node, t.nodeRanks.size());
  MK_ARGCHECK((int)comm->peerInfo.size() == comm->nRanks,
              "peerMemInit: peerInfo has %zu entries for %d ranks", comm->peerInfo.size(),
              comm->nRanks);
  im->localToRank = t.nodeRanks[t.node];
  im->localRanks = (int)im->localToRank.size();
  im->localRank = -1;
  for (int l = 0; l < im->localRanks; l++) {
    int r = im->localToRank[l];
    MK_ARGCHECK(r >= 0 && r < comm->nRanks, "peerMemInit: bad rank %d in topo.nodeRanks", r);
    if (r == comm->rank) im->localRank = l;
  }
  MK_ARGCHECK(im->localRank >= 0 && im->localRank == t.localRank && im->localRanks == t.localRanks,
              "peerMemInit: rank %d is not at topo.localRank %d of its node (%d ranks)", comm->rank,
              t.localRank, t.localRanks);
  im->sameProc.assign(im->localRanks, 0);
  im->peerDev.assign(im->localRanks, -1);
  for (int l = 0; l < im->localRanks; l++) {
    int r = im->localToRank[l];
    im->sameProc[l] = sameProcess(comm, r) ? 1 : 0;
    im->peerDev[l] = comm->peerInfo[r].cudaDev;
    if (!im->sameProc[l]) im->anyOtherProc = true;
  }
  return ncclSuccess;
}

// Allocates, maps and zero-fills this rank's workspace.
ncclResult_t allocWorkspace(ncclComm* comm, PeerMem::Impl* im, size_t bytes) {
  int dev = im->dev;
  // Devices of in-process peers read and write this mapping through our pointer.
  std::vector<int> devs{dev};
  for (int l = 0; l < im->localRanks; l++) {
    int d = im->peerDev[l];
    if (!im->sameProc[l] || d == dev || d < 0) continue;
    bool seen = false;
    for (int x : devs) seen |= (x == d);
    if (seen) continue;
    if (!pm::canAccessPeer(d, dev)) {
      MK_WARN(
          "peerMemInit: rank %d (GPU %d) cannot access GPU %d of rank %d peer-to-peer; "
          "intra-node peers need P2P (MKERNEL_EMULATE_NODES can put them in different nodes)",
          im->localToRank[l], d, dev, comm->rank);
      return ncclSystemError;
    }
    devs.push_back(d);
  }
  if (!pm::vmmSupported(dev)) {
    if (im->anyOtherProc) {
      MK_WARN(
          "peerMemInit: GPU %d has no CUDA VMM support; cannot share memory with local "
          "peers of other processes",
          dev);
      return ncclSystemError;
    }
    void* p = nullptr;
    CUDACHECK(cudaMalloc(&p, bytes));
    im->ws.kind = pm::Mapping::kCudaMalloc;
    im->ws.ptr = p;
    im->ws.size = bytes;
    im->ws.dev = dev;
    for (int d : devs) {
      if (d == dev) continue;
      pm::DeviceGuard g;
      NCCLCHECK(g.set(d));
      NCCLCHECK(pm::enablePeerAccess(dev));
    }
  } else {
    bool fd = pm::fdHandleSupported(dev);
    ncclResult_t r = ncclSystemError;
    if (fd) r = pm::mapCreate(dev, bytes, true, devs, /*quiet=*/!im->anyOtherProc, &im->ws);
    if (r != ncclSuccess) {
      if (im->anyOtherProc) {
        MK_WARN(
            "peerMemInit: no exportable (POSIX fd) cuMem allocation on GPU %d%s; local "
            "peers in other processes cannot map the workspace",
            dev, fd ? "" : " (driver does not support POSIX fd handles)");
        return r == ncclSystemError ? ncclSystemError : r;
      }
      MK_INFO(kAlloc, "peerMemInit: using a non-exportable workspace (all local peers in-process)");
      NCCLCHECK(pm::mapCreate(dev, bytes, false, devs, false, &im->ws));
    }
  }
  // Zero-fill on a private stream and wait: peers see the pointer only after this.
  cudaStream_t s;
  CUDACHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaError_t e1 = cudaMemsetAsync(im->ws.ptr, 0, im->ws.size, s);
  cudaError_t e2 = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  CUDACHECK(e1);
  CUDACHECK(e2);
  return ncclSuccess;
}

// Sends the workspace fd to every local peer of another process, and imports theirs.
ncclResult_t exchangeFds(ncclComm* comm, PeerMem::Impl* im, const std::vector<InitInfo>& info,
                         size_t bytes) {
  ncclResult_t res = ncclSuccess;
  int fd = -1;
  FdMsg msg = {ncclSuccess, 0, (uint64_t)bytes};
  if (im->ws.kind != pm::Mapping::kCuMem || !im->ws.exportable) {
    msg.status = ncclInternalError;
  } else if (pm::exportFd(im->ws.handle, &fd) != ncclSuccess) {
    msg.status = ncclUnhandledCudaError;
  }
  if (msg.status != ncclSuccess) res = (ncclResult_t)msg.status;
  // Send to everyone first (sends never wait for the receiver to call recv), then receive.
  for (int l = 0; l < im->localRanks; l++) {
    if (im->sameProc[l]) continue;
    ncclResult_t r = ipcSocketSend(&im->sock, im->peerSockNames[l].data(), kIpcTagWorkspace,
                                   msg.status == ncclSuccess ? fd : -1, &msg, sizeof(msg));
    if (r != ncclSuccess && res == ncclSuccess) res = r;
  }
  if (fd >= 0) close(fd);
  for (int l = 0; l < im->localRanks; l++) {
    if (im->sameProc[l]) continue;
    int peer = im->localToRank[l];
    FdMsg in = {};
    int pfd = -1;
    ncclResult_t r = ipcSocketRecv(&im->sock, peer, kIpcTagWorkspace, &pfd, &in, sizeof(in));
    if (r == ncclSuccess && (in.status != ncclSuccess || pfd < 0)) {
      MK_WARN("peerMemInit: rank %d could not export its workspace", peer);
      r = ncclRemoteError;
    }
    if (r == ncclSuccess && in.bytes != bytes) {
      MK_WARN("peerMemInit: rank %d sent a workspace of %" PRIu64 " bytes, expected %zu", peer,
              in.bytes, bytes);
      r = ncclInternalError;
    }
    // Device ordinals of other processes mean nothing here (CUDA_VISIBLE_DEVICES may
    // differ): the driver checks that this GPU can reach the memory (cuMemSetAccess).
    if (r == ncclSuccess) {
      r = pm::mapImportFd(pfd, bytes, im->dev, &im->wsImports[l]);
      if (r != ncclSuccess)
        MK_WARN(
            "peerMemInit: rank %d (GPU %d) could not map the workspace of rank %d "
            "(another process; GPU %d there)",
            comm->rank, im->dev, peer, info[peer].dev);
    }
    if (pfd >= 0) close(pfd);
    if (r != ncclSuccess && res == ncclSuccess) res = r;
  }
  return res;
}

// peersDev comes from the stream-ordered allocator on a private non-blocking stream:
// cudaMalloc/cudaFree and copies on the legacy default stream would wait for the kernels of
// every other comm in this process (a persistent kernel of another comm may wait for a rank
// that is in here: deadlock).
ncclResult_t uploadPeers(PeerMem* pmem, int n) {
  cudaStream_t s;
  CUDACHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaError_t e = cudaMallocAsync(&pmem->peersDev, sizeof(void*) * n, s);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(pmem->peersDev, pmem->peers.data(), sizeof(void*) * n,
                        cudaMemcpyHostToDevice, s);
  cudaError_t e2 = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  CUDACHECK(e);
  CUDACHECK(e2);
  return ncclSuccess;
}

ncclResult_t freePeersDev(PeerMem* pmem) {
  if (!pmem->peersDev) return ncclSuccess;
  cudaStream_t s;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) {
    e = cudaFreeAsync(pmem->peersDev, s);
    cudaError_t e2 = cudaStreamSynchronize(s);
    if (e == cudaSuccess) e = e2;
    cudaStreamDestroy(s);
  }
  pmem->peersDev = nullptr;
  if (e != cudaSuccess) {
    cudaGetLastError();
    MK_WARN("peerMemFini: freeing the peer table failed: %s", cudaGetErrorString(e));
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

// Ranks of one process share workspace pointers without a mapping of their own, so a
// rank's destroy must not free its workspace while a same-process peer's kernel may still
// read it (destroy is local: nccl-tests destroys the comms of a clique one after another).
// The workspaces of such a clique are parked here and freed together when its last
// same-process rank finishes. Other processes map the memory themselves, and the driver keeps
// physical memory alive until their mappings go, so they need nothing of this.
struct Parked {
  int remaining = 0;
  std::vector<pm::Mapping> maps;
};
std::mutex& parkedMu() {
  static std::mutex* m = new std::mutex();
  return *m;
}
std::map<uint64_t, Parked>& parked() {
  static auto* p = new std::map<uint64_t, Parked>();
  return *p;
}

// commHash 0: free at once (a failed init, where peers never got our pointer).
void freeImpl(PeerMem::Impl* im, uint64_t commHash, ncclResult_t* res) {
  auto keep = [&](ncclResult_t r) {
    if (r != ncclSuccess && *res == ncclSuccess) *res = r;
  };
  keep(peerMemRegFini(im));
  for (pm::Mapping& m : im->wsImports) keep(pm::mapRelease(&m));
  int sameProc = 0;
  for (char c : im->sameProc) sameProc += c ? 1 : 0;
  std::vector<pm::Mapping> toFree;
  if (sameProc <= 1 || commHash == 0) {
    toFree.push_back(im->ws);
  } else {
    std::lock_guard<std::mutex> g(parkedMu());
    Parked& p = parked()[commHash];
    if (p.maps.empty() && p.remaining == 0) p.remaining = sameProc;
    p.maps.push_back(im->ws);
    if (--p.remaining == 0) {
      toFree = std::move(p.maps);
      parked().erase(commHash);
    }
  }
  im->ws = pm::Mapping{};
  // Every rank of the clique waited for its own kernels before its fini (collFinalize),
  // so once the last one is here nothing reads these workspaces any more.
  for (pm::Mapping& m : toFree) keep(pm::mapRelease(&m));
  keep(ipcSocketClose(&im->sock));
}

}  // namespace

ncclResult_t peerMemInit(ncclComm* comm) {
  MK_ARGCHECK(comm != nullptr, "peerMemInit: comm is NULL");
  MK_ARGCHECK(comm->peerMem == nullptr, "peerMemInit: peer memory already initialised");
  MK_ARGCHECK(comm->nRanks == 1 || comm->bootstrap != nullptr, "peerMemInit: no bootstrap");
  NCCLCHECK(cudaLibInit());
  pm::DeviceGuard guard;
  NCCLCHECK(guard.set(comm->cudaDev));

  PeerMem* pmem = new PeerMem();
  PeerMem::Impl* im = new PeerMem::Impl();
  pmem->impl = im;
  im->dev = comm->cudaDev;
  ncclResult_t res = ncclSuccess;
  ncclResult_t local = ncclSuccess;  // result of the steps before the first exchange
  std::vector<InitInfo> info(comm->nRanks);
  InitInfo& mine = info[comm->rank];
  int64_t req = MK_PARAM_INT(WorkspaceBytes);
  size_t gran = 0, bytes = 0;

  // 1. Local steps; a failure is published (status) so that every rank stops together.
  memset(&mine, 0, sizeof(mine));
  local = localPeers(comm, im);
  if (local == ncclSuccess) {
    im->wsImports.assign(im->localRanks, pm::Mapping{});
    im->peerSockNames.assign(im->localRanks, std::vector<char>(kIpcNameLen, 0));
  }
  if (local == ncclSuccess && req <= 0) {
    MK_WARN("peerMemInit: MKERNEL_WORKSPACE_BYTES must be positive (got %" PRId64 ")", req);
    local = ncclInvalidUsage;
  }
  if (local == ncclSuccess) local = pm::allocGranularity(im->dev, true, &gran);
  if (local == ncclSuccess) {
    bytes = ((size_t)req + gran - 1) / gran * gran;
    local = allocWorkspace(comm, im, bytes);
  }
  if (local == ncclSuccess && im->anyOtherProc) {
    char name[kIpcNameLen];
    ipcSocketName(name, comm->rank, ipcSocketNonce());
    local = ipcSocketInit(&im->sock, name, comm->rank, comm->commHash, comm->abortFlag, 0);
    if (local == ncclSuccess) memcpy(mine.sockName, im->sock.name, kIpcNameLen);
  }
  mine.status = local;
  mine.dev = im->dev;
  mine.exportable = im->ws.exportable ? 1 : 0;
  mine.bytes = im->ws.size;
  mine.ptr = (uint64_t)(uintptr_t)im->ws.ptr;
  NCCLCHECKGOTO(allGather(comm, info.data(), sizeof(InitInfo)), res, fail);
  if (local != ncclSuccess) {
    res = local;
    goto fail;
  }
  for (int r = 0; r < comm->nRanks; r++) {
    if (info[r].status != ncclSuccess) {
      MK_WARN("peerMemInit: rank %d failed to set up its workspace (error %d)", r, info[r].status);
      res = ncclRemoteError;
      goto fail;
    }
    if (info[r].bytes != bytes) {
      MK_WARN("peerMemInit: workspace of rank %d is %" PRIu64
              " bytes, %zu here; set the same "
              "MKERNEL_WORKSPACE_BYTES on every rank",
              r, info[r].bytes, bytes);
      res = ncclInvalidUsage;
      goto fail;
    }
  }
  // Every rank checks every rank (peerInfo is the same everywhere): all stop together.
  for (int r = 0; r < comm->nRanks; r++) {
    if (info[r].dev != comm->peerInfo[r].cudaDev) {
      MK_WARN("peerMemInit: rank %d reports GPU %d, peerInfo says %d", r, info[r].dev,
              comm->peerInfo[r].cudaDev);
      res = ncclInternalError;
      goto fail;
    }
  }
  for (int l = 0; l < im->localRanks; l++) {
    const InitInfo& pi = info[im->localToRank[l]];
    if (!im->sameProc[l]) {
      memcpy(im->peerSockNames[l].data(), pi.sockName, kIpcNameLen);
      im->peerSockNames[l][kIpcNameLen - 1] = '\0';
    }
  }

  // 2. fds to and from the local peers of other processes, then agree on the outcome.
  {
    if (im->anyOtherProc) local = exchangeFds(comm, im, info, bytes);
    std::vector<int32_t> status(comm->nRanks, 0);
    status[comm->rank] = local;
    NCCLCHECKGOTO(allGather(comm, status.data(), sizeof(int32_t)), res, fail);
    if (local != ncclSuccess) {
      res = local;
      goto fail;
    }
    for (int r = 0; r < comm->nRanks; r++) {
      if (status[r] != ncclSuccess) {
        MK_WARN("peerMemInit: rank %d failed to map its peers' workspaces (error %d)", r,
                status[r]);
        res = ncclRemoteError;
        goto fail;
      }
    }
  }

  // 3. The pointer table, on the host and on the device.
  pmem->bytes = bytes;
  pmem->local = im->ws.ptr;
  pmem->peers.assign(im->localRanks, nullptr);
  for (int l = 0; l < im->localRanks; l++) {
    pmem->peers[l] = l == im->localRank ? im->ws.ptr
                     : im->sameProc[l]  ? (void*)(uintptr_t)info[im->localToRank[l]].ptr
                                        : im->wsImports[l].ptr;
  }
  NCCLCHECKGOTO(uploadPeers(pmem, im->localRanks), res, fail);
  // The socket stays open: peerMemLookup passes registered buffers' fds through it.
  comm->peerMem = pmem;
  MK_INFO(kInit | kP2p,
          "peerMemInit: rank %d workspace %p (%zu bytes, GPU %d), %d local ranks (%s)", comm->rank,
          im->ws.ptr, bytes, im->dev, im->localRanks,
          im->anyOtherProc ? "some in other processes" : "all in this process");
  return ncclSuccess;

fail : {
  ncclResult_t ignored = ncclSuccess;
  freePeersDev(pmem);
  freeImpl(im, 0, &ignored);
  delete im;
  delete pmem;
  return res;
}
}

ncclResult_t peerMemFini(ncclComm* comm) {
  if (comm == nullptr || comm->peerMem == nullptr) return ncclSuccess;
  PeerMem* pmem = comm->peerMem;
  comm->peerMem = nullptr;
  ncclResult_t res = ncclSuccess;
  pm::DeviceGuard guard;
  if (guard.set(comm->cudaDev) != ncclSuccess) res = ncclUnhandledCudaError;
  if (freePeersDev(pmem) != ncclSuccess && res == ncclSuccess) res = ncclUnhandledCudaError;
  if (pmem->impl) {
    freeImpl(pmem->impl, comm->commHash, &res);
    delete pmem->impl;
  }
  delete pmem;
  MK_INFO(kInit | kP2p, "peerMemFini: rank %d released its peer memory (result %d)", comm->rank,
          (int)res);
  return res;
}

}  // namespace mk
