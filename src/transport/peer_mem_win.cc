// Windows: collective registration of a buffer whose every local peer copy is mapped here
// once (transport/peer_mem_win.h).
#define MK_PEER_MEM_INTERNAL 1
#include "transport/peer_mem_win.h"

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/checks.h"
#include "base/cudawrap.h"
#include "bootstrap/bootstrap.h"
#include "comm/comm.h"
#include "transport/peer_mem.h"

namespace mk {
namespace {

// Every live window of the process with its comm and rank, so that a handle of another
// comm (or a stale one) is recognised without dereferencing it.
struct LiveWin {
  ncclComm* comm;
  int rank;
};
std::mutex gLiveMu;
std::map<const void*, LiveWin>& liveWindows() {
  static auto* m = new std::map<const void*, LiveWin>();
  return *m;
}

constexpr int kKnownFlags = NCCL_WIN_DEFAULT | NCCL_WIN_COLL_SYMMETRIC;

// Published by every rank in the first allgather of a registration.
struct WinInfo {
  uint64_t id;  // windows this rank registered on the comm before (identical unless diverged)
  uint64_t size;
  int32_t flags;
  int32_t status;  // this rank's local registration (ncclResult_t)
};

PeerMem::Impl* implOf(ncclComm* comm) {
  return comm && comm->peerMem ? comm->peerMem->impl : nullptr;
}

}  // namespace

ncclResult_t peerMemWinCheck(ncclComm* comm, void* buff, size_t size, int flags) {
  MK_ARGCHECK(comm != nullptr, "ncclCommWindowRegister: comm is NULL");
  MK_ARGCHECK(buff != nullptr, "ncclCommWindowRegister: buff is NULL");
  MK_ARGCHECK(size > 0, "ncclCommWindowRegister: size is 0");
  MK_ARGCHECK((flags & ~kKnownFlags) == 0,
              "ncclCommWindowRegister: unknown winFlags 0x%x (NCCL_WIN_DEFAULT or "
              "NCCL_WIN_COLL_SYMMETRIC)",
              (unsigned)flags);
  MK_ARGCHECK(implOf(comm) != nullptr,
              "ncclCommWindowRegister: the communicator has no peer memory (not initialised, "
              "or destroyed)");
  NCCLCHECK(cudaLibInit());
  DeviceGuard guard;
  NCCLCHECK(guard.set(comm->cudaDev));
  CUdeviceptr p = reinterpret_cast<CUdeviceptr>(buff);
  unsigned int memType = 0, managed = 0;
  CUresult cr = cu.cuPointerGetAttribute(&memType, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
  MK_ARGCHECK(cr == CUDA_SUCCESS,
              "ncclCommWindowRegister: rank %d: %p is not memory known to CUDA (%s); windows "
              "need device memory (ncclMemAlloc, cuMem or cudaMalloc)",
              comm->rank, buff, cuErrorString(cr));
  cu.cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p);
  MK_ARGCHECK(memType == CU_MEMORYTYPE_DEVICE && !managed,
              "ncclCommWindowRegister: rank %d: %p is %s memory; windows need device memory "
              "(ncclMemAlloc, cuMem or cudaMalloc)",
              comm->rank, buff, managed ? "managed" : "host");
  int ordinal = -1;
  cu.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
  MK_ARGCHECK(ordinal == comm->cudaDev,
              "ncclCommWindowRegister: rank %d: %p is memory of device %d, the communicator "
              "uses device %d",
              comm->rank, buff, ordinal, comm->cudaDev);
  return ncclSuccess;
}

ncclResult_t peerMemWinRegister(ncclComm* comm, void* buff, size_t size, int flags,
                                ncclWindow_t* win) {
  MK_ARGCHECK(win != nullptr, "ncclCommWindowRegister: win is NULL");
  NCCLCHECK(peerMemWinCheck(comm, buff, size, flags));
  PeerMem::Impl* im = implOf(comm);
  DeviceGuard guard;
  NCCLCHECK(guard.set(comm->cudaDev));

  // 1. Register locally; a failure still takes part in the exchange, so that every rank
  //    returns instead of waiting for this one.
  void* h = nullptr;
  ncclResult_t local = peerMemRegister(comm, buff, size, &h);
  auto undo = [&](ncclResult_t res) {
    if (h) peerMemDeregister(comm, h);
    return res;
  };
  std::vector<WinInfo> info(comm->nRanks);
  info[comm->rank] = WinInfo{im->windowSeq, size, flags, (int32_t)local};
  if (comm->nRanks > 1) {
    ncclResult_t r = bootstrapAllGather(comm->bootstrap, info.data(), sizeof(WinInfo));
    if (r != ncclSuccess) return undo(r);
  }
  const uint64_t id = im->windowSeq++;
  for (int r = 0; r < comm->nRanks; r++) {
    if (info[r].status != ncclSuccess) {
      if (r != comm->rank)
        MK_WARN("ncclCommWindowRegister: rank %d could not register its buffer (error %d)", r,
                info[r].status);
      return undo(local != ncclSuccess ? local : ncclRemoteError);
    }
    if (info[r].id != id) {
      MK_WARN("ncclCommWindowRegister: rank %d is at its window %" PRIu64 ", rank %d at %" PRIu64
              ": the ranks' window registrations diverged",
              r, info[r].id, comm->rank, id);
      return undo(ncclInvalidUsage);
    }
  }
  bool symmetric = true;
  size_t minSize = size, maxSize = size;
  for (int r = 0; r < comm->nRanks; r++)
    symmetric &= (info[r].flags & NCCL_WIN_COLL_SYMMETRIC) != 0;
  for (int l = 0; l < im->localRanks; l++) {
    minSize = std::min<size_t>(minSize, info[im->localToRank[l]].size);
    maxSize = std::max<size_t>(maxSize, info[im->localToRank[l]].size);
  }
  if (symmetric && minSize != maxSize)
    MK_INFO(kReg,
            "ncclCommWindowRegister: symmetric window %" PRIu64
            " has sizes %zu to %zu on the "
            "local ranks; zero-copy only within the first %zu bytes",
            id, minSize, maxSize, minSize);

  // 2. Map every local peer's window (the lookup exchange: fds, IPC handles, agreement).
  bool ok = false;
  std::vector<void*> ptrs;
  ncclResult_t r = peerMemLookup(comm, buff, size, &ok, &ptrs);
  if (r != ncclSuccess) return undo(r);

  auto w = std::make_unique<pm::Window>();
  w->magic = pm::kWindowMagic;
  w->comm = comm;
  w->id = id;
  w->base = reinterpret_cast<uintptr_t>(buff);
  w->size = size;
  w->flags = flags;
  w->symmetric = symmetric;
  w->minSize = minSize;
  w->reg = static_cast<pm::RegRecord*>(h);
  if (ok && (int)ptrs.size() == im->localRanks) {
    w->mapped = true;
    w->peers = std::move(ptrs);
    // The window keeps its peers mapped whatever happens to the lookup cache later.
    pm::refLookupImports(im, buff, size, &w->imports);
  } else {
    MK_INFO(kReg,
            "ncclCommWindowRegister: rank %d window %" PRIu64
            " (%p, %zu bytes): not every "
            "local peer's window could be mapped; collectives on it stage through the workspace",
            comm->rank, id, buff, size);
  }
  pm::Window* wp = w.get();
  {
    std::lock_guard<std::mutex> g(gLiveMu);
    liveWindows()[wp] = LiveWin{comm, comm->rank};
  }
  im->windows.push_back(std::move(w));
  *win = reinterpret_cast<ncclWindow_t>(wp);
  MK_INFO(kReg,
          "ncclCommWindowRegister: rank %d window %" PRIu64 " %p size %zu flags 0x%x%s%s -> %p",
          comm->rank, id, buff, size, (unsigned)flags, symmetric ? " symmetric" : "",
          wp->mapped ? " mapped" : "", (void*)wp);
  return ncclSuccess;
}

ncclResult_t peerMemWinDeregister(ncclComm* comm, ncclWindow_t win) {
  MK_ARGCHECK(comm != nullptr, "ncclCommWindowDeregister: comm is NULL");
  MK_ARGCHECK(win != nullptr, "ncclCommWindowDeregister: win is NULL");
  PeerMem::Impl* im = implOf(comm);
  MK_ARGCHECK(im != nullptr,
              "ncclCommWindowDeregister: the communicator has no peer memory (not initialised, "
              "or destroyed)");
  const void* key = static_cast<const void*>(win);
  auto it = im->windows.begin();
  for (; it != im->windows.end(); ++it)
    if (it->get() == key) break;
  if (it == im->windows.end()) {
    LiveWin owner{nullptr, -1};
    {
      std::lock_guard<std::mutex> g(gLiveMu);
      auto lw = liveWindows().find(key);
      if (lw != liveWindows().end()) owner = lw->second;
    }
    if (owner.comm)
      MK_WARN(
          "ncclCommWindowDeregister: window %p belongs to another communicator (%p, rank %d), "
          "not to %p (rank %d)",
          key, (void*)owner.comm, owner.rank, (void*)comm, comm->rank);
    else
      MK_WARN(
          "ncclCommWindowDeregister: %p is not a window of this communicator (rank %d): never "
          "registered, or deregistered already",
          key, comm->rank);
    return ncclInvalidArgument;
  }
  {
    std::lock_guard<std::mutex> g(gLiveMu);
    liveWindows().erase(key);
  }
  DeviceGuard guard;
  (void)guard.set(comm->cudaDev);  // best effort: the release goes on regardless
  pm::Window* w = it->get();
  ncclResult_t res = pm::unrefImports(im, w->imports);
  ncclResult_t r = w->reg ? peerMemDeregister(comm, w->reg) : ncclSuccess;
  if (res == ncclSuccess) res = r;
  MK_INFO(kReg, "ncclCommWindowDeregister: rank %d window %" PRIu64 " %p", comm->rank, w->id,
          (void*)w->base);
  w->magic = 0;
  im->windows.erase(it);
  return res;
}

void peerMemWinFini(PeerMem::Impl* im) {
  std::lock_guard<std::mutex> g(gLiveMu);
  for (auto& w : im->windows) {
    liveWindows().erase(w.get());
    w->magic = 0;
  }
  im->windows.clear();
}

bool peerMemWinFind(ncclComm* comm, const void* ptr, size_t bytes, uint64_t* key, uint64_t* off,
                    std::vector<void*>* bases) {
  PeerMem::Impl* im = implOf(comm);
  if (im == nullptr || ptr == nullptr || bytes == 0) return false;
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  for (const auto& w : im->windows) {
    if (!w->mapped || p < w->base || bytes > w->size || p - w->base > w->size - bytes) continue;
    *key = w->id + 1;
    *off = p - w->base;
    *bases = w->peers;
    return true;
  }
  return false;
}

bool peerMemIsRegistered(ncclComm* comm, const void* ptr, size_t bytes) {
  PeerMem::Impl* im = implOf(comm);
  if (im == nullptr || ptr == nullptr || bytes == 0) return false;
  return pm::findRegistration(im, reinterpret_cast<uintptr_t>(ptr), bytes) != nullptr;
}

int peerMemWinCount(ncclComm* comm) {
  PeerMem::Impl* im = implOf(comm);
  return im ? (int)im->windows.size() : 0;
}

}  // namespace mk
