// User-buffer registration (ncclCommRegister) and the collective lookup that maps every
// local peer's registered buffer here.
#define MK_PEER_MEM_INTERNAL 1
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "base/checks.h"
#include "comm/comm.h"
#include "base/cudawrap.h"
#include "transport/peer_mem.h"

namespace mk {
namespace {

std::atomic<uint64_t> gNextRegId{1};

// Published by every rank in the first allgather of an exchange.
struct LookupInfo {
  uint64_t seq;        // exchange number: identical on all ranks unless calls diverged
  int32_t registered;  // a registration covers [ptr, ptr+bytes)
  int32_t kind;        // pm::RegRecord::Kind
  uint64_t regId;
  uint64_t ptr;
  uint64_t base;
  uint64_t allocSize;
  uint64_t bytes;
  int32_t dev;
  int32_t pid;
  uint64_t hitSeq;  // exchange that made this rank's cache entry for (ptr, bytes); ~0: none
  cudaIpcMemHandle_t ipc;
};

// Accompanies a registered cuMem buffer's fd (also sent, without fd, when export failed).
struct RegFdMsg {
  int32_t status;
  int32_t pad;
  uint64_t regId;
};

const char* kindName(int k) {
  switch (k) {
    case pm::RegRecord::kCuMem:
      return "cuMem";
    case pm::RegRecord::kCudaMalloc:
      return "cudaMalloc";
    default:
      return "local-only";
  }
}

ncclResult_t checkComm(ncclComm* comm, const char* api) {
  MK_ARGCHECK(comm != nullptr, "%s: comm is NULL", api);
  MK_ARGCHECK(comm->peerMem != nullptr && comm->peerMem->impl != nullptr,
              "%s: the communicator has no peer memory (not initialised, or destroyed)", api);
  return ncclSuccess;
}

// Classifies buff (see peer_mem.h) and fills r.
ncclResult_t classify(void* buff, size_t size, pm::RegRecord* r) {
  CUdeviceptr p = reinterpret_cast<CUdeviceptr>(buff);
  unsigned int memType = 0;
  CUresult cr = cu.cuPointerGetAttribute(&memType, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
  if (cr != CUDA_SUCCESS) {
    MK_WARN("ncclCommRegister: %p is not memory known to CUDA (%s)", buff, cuErrorString(cr));
    return ncclInvalidArgument;
  }
  r->kind = pm::RegRecord::kLocalOnly;
  r->base = reinterpret_cast<uintptr_t>(buff);
  r->allocSize = size;
  int ordinal = -1;
  if (cu.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) == CUDA_SUCCESS)
    r->dev = ordinal;
  unsigned int managed = 0;
  cu.cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p);
  if (memType != CU_MEMORYTYPE_DEVICE || managed) {
    MK_INFO(kReg, "ncclCommRegister: %p is %s memory: in-process peers only", buff,
            managed ? "managed" : "host");
    return ncclSuccess;
  }
  CUdeviceptr base = 0;
  size_t allocSize = 0;
  cr = cu.cuMemGetAddressRange(&base, &allocSize, p);
  if (cr != CUDA_SUCCESS) {
    MK_INFO(kReg, "ncclCommRegister: cuMemGetAddressRange(%p) failed (%s): in-process peers only",
            buff, cuErrorString(cr));
    return ncclSuccess;
  }
  if (p + size > base + allocSize) {
    MK_INFO(kReg,
            "ncclCommRegister: [%p, +%zu) extends past its allocation [%p, +%zu): "
            "in-process peers only",
            buff, size, (void*)base, allocSize);
    return ncclSuccess;
  }
  CUmemGenericAllocationHandle h;
  if (cu.cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(base)) == CUDA_SUCCESS) {
    CUmemAllocationProp prop = {};
    bool fd = cu.cuMemGetAllocationPropertiesFromHandle(&prop, h) == CUDA_SUCCESS &&
              (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (!fd) {
      cu.cuMemRelease(h);
      MK_INFO(kReg,
              "ncclCommRegister: cuMem buffer %p has no POSIX-fd handle: in-process "
              "peers only",
              buff);
      return ncclSuccess;
    }
    r->kind = pm::RegRecord::kCuMem;
    r->handle = h;
    r->haveHandle = true;
  } else {
    cudaError_t e = cudaIpcGetMemHandle(&r->ipc, reinterpret_cast<void*>(base));
    if (e != cudaSuccess) {
      cudaGetLastError();
      MK_INFO(kReg, "ncclCommRegister: no CUDA IPC handle for %p (%s): in-process peers only", buff,
              cudaGetErrorString(e));
      return ncclSuccess;
    }
    r->kind = pm::RegRecord::kCudaMalloc;
  }
  r->base = base;
  r->allocSize = allocSize;
  return ncclSuccess;
}

// Drops one reference of an imported peer buffer; unmaps it at zero.
ncclResult_t unrefImport(PeerMem::Impl* im, const pm::ImportKey& key) {
  auto it = im->regImports.find(key);
  if (it == im->regImports.end()) return ncclSuccess;
  if (--it->second.refs > 0) return ncclSuccess;
  ncclResult_t r = pm::mapRelease(&it->second.map);
  im->regImports.erase(it);
  return r;
}

ncclResult_t dropEntriesOf(PeerMem::Impl* im, pm::RegRecord* reg) {
  ncclResult_t res = ncclSuccess;
  for (auto it = im->lookupCache.begin(); it != im->lookupCache.end();) {
    if (it->second.reg != reg) {
      ++it;
      continue;
    }
    for (const pm::ImportKey& k : it->second.imports) {
      ncclResult_t r = unrefImport(im, k);
      if (r != ncclSuccess && res == ncclSuccess) res = r;
    }
    it = im->lookupCache.erase(it);
  }
  return res;
}

ncclResult_t freeRecord(pm::RegRecord* r) {
  if (r->haveHandle) {
    CUresult cr = cu.cuMemRelease(r->handle);
    r->haveHandle = false;
    if (cr != CUDA_SUCCESS) {
      MK_WARN("cuMemRelease of registered buffer %p failed: %s", (void*)r->buff, cuErrorString(cr));
      return ncclUnhandledCudaError;
    }
  }
  return ncclSuccess;
}

// Maps peer l's registered buffer (info) here, or reuses an earlier import of it.
// For cuMem buffers the fd message is always consumed (the sender always sends).
ncclResult_t importPeer(ncclComm* comm, PeerMem::Impl* im, int l, const LookupInfo& info,
                        uint32_t tag, void** out, pm::ImportKey* key) {
  int peer = im->localToRank[l];
  *key = {peer, info.regId};
  auto it = im->regImports.find(*key);
  ncclResult_t res = ncclSuccess;
  if (info.kind == pm::RegRecord::kCuMem) {
    RegFdMsg msg = {};
    int fd = -1;
    NCCLCHECK(ipcSocketRecv(&im->sock, peer, tag, &fd, &msg, sizeof(msg)));
    if (msg.status != ncclSuccess || fd < 0 || msg.regId != info.regId) {
      if (fd >= 0) close(fd);
      MK_WARN("peerMemLookup: rank %d could not export its buffer %p", peer, (void*)info.ptr);
      return ncclRemoteError;
    }
    if (it == im->regImports.end()) {
      pm::PeerImport imp;
      res = pm::mapImportFd(fd, info.allocSize, im->dev, &imp.map);
      if (res == ncclSuccess) it = im->regImports.emplace(*key, imp).first;
    }
    close(fd);
    NCCLCHECK(res);
  } else if (it == im->regImports.end()) {  // kCudaMalloc
    void* p = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&p, info.ipc, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      cudaGetLastError();
      MK_WARN("peerMemLookup: cudaIpcOpenMemHandle of rank %d's buffer %p failed: %s", peer,
              (void*)info.ptr, cudaGetErrorString(e));
      return ncclUnhandledCudaError;
    }
    pm::PeerImport imp;
    imp.map.kind = pm::Mapping::kIpcOpen;
    imp.map.ptr = p;
    imp.map.size = info.allocSize;
    imp.map.dev = -1;
    it = im->regImports.emplace(*key, imp).first;
    MK_INFO(kReg, "peerMemLookup: opened rank %d's cudaMalloc buffer at %p", peer, p);
  }
  *out = static_cast<char*>(it->second.map.ptr) + (info.ptr - info.base);
  return ncclSuccess;
}

}  // namespace

namespace pm {

RegRecord* findRegistration(PeerMem::Impl* im, uintptr_t p, size_t bytes) {
  for (auto& kv : im->regs) {
    RegRecord* r = kv.first;
    if (p >= r->buff && p + bytes <= r->buff + r->size) return r;
  }
  return nullptr;
}

void refLookupImports(PeerMem::Impl* im, const void* ptr, size_t bytes,
                      std::vector<ImportKey>* keys) {
  keys->clear();
  auto it = im->lookupCache.find({reinterpret_cast<uintptr_t>(ptr), bytes});
  if (it == im->lookupCache.end()) return;
  for (const ImportKey& k : it->second.imports) {
    auto imp = im->regImports.find(k);
    if (imp == im->regImports.end()) continue;
    imp->second.refs++;
    keys->push_back(k);
  }
}

ncclResult_t unrefImports(PeerMem::Impl* im, const std::vector<ImportKey>& keys) {
  ncclResult_t res = ncclSuccess;
  for (const ImportKey& k : keys) {
    ncclResult_t r = unrefImport(im, k);
    if (r != ncclSuccess && res == ncclSuccess) res = r;
  }
  return res;
}

}  // namespace pm

ncclResult_t peerMemRegister(ncclComm* comm, void* buff, size_t size, void** handle) {
  NCCLCHECK(checkComm(comm, "ncclCommRegister"));
  MK_ARGCHECK(handle != nullptr, "ncclCommRegister: handle is NULL");
  *handle = nullptr;
  MK_ARGCHECK(buff != nullptr, "ncclCommRegister: buff is NULL");
  MK_ARGCHECK(size > 0, "ncclCommRegister: size is 0");
  NCCLCHECK(cudaLibInit());
  pm::DeviceGuard guard;
  NCCLCHECK(guard.set(comm->cudaDev));
  auto rec = std::make_unique<pm::RegRecord>();
  rec->id = gNextRegId.fetch_add(1);
  rec->buff = reinterpret_cast<uintptr_t>(buff);
  rec->size = size;
  NCCLCHECK(classify(buff, size, rec.get()));
  pm::RegRecord* r = rec.get();
  comm->peerMem->impl->regs.emplace(r, std::move(rec));
  *handle = r;
  MK_INFO(kReg, "ncclCommRegister: rank %d buffer %p size %zu kind %s (allocation %p +%zu) -> %p",
          comm->rank, buff, size, kindName(r->kind), (void*)r->base, r->allocSize, (void*)r);
  return ncclSuccess;
}

ncclResult_t peerMemDeregister(ncclComm* comm, void* handle) {
  NCCLCHECK(checkComm(comm, "ncclCommDeregister"));
  MK_ARGCHECK(handle != nullptr, "ncclCommDeregister: handle is NULL");
  PeerMem::Impl* im = comm->peerMem->impl;
  auto it = im->regs.find(static_cast<pm::RegRecord*>(handle));
  MK_ARGCHECK(it != im->regs.end(),
              "ncclCommDeregister: handle %p was not returned by ncclCommRegister on this "
              "communicator (or was deregistered already)",
              handle);
  pm::DeviceGuard guard;
  NCCLCHECK(guard.set(comm->cudaDev));
  pm::RegRecord* r = it->first;
  ncclResult_t res = dropEntriesOf(im, r);
  ncclResult_t r2 = freeRecord(r);
  if (res == ncclSuccess) res = r2;
  MK_INFO(kReg, "ncclCommDeregister: rank %d buffer %p size %zu", comm->rank, (void*)r->buff,
          r->size);
  im->regs.erase(it);
  return res;
}

ncclResult_t peerMemLookup(ncclComm* comm, const void* ptr, size_t bytes, bool* ok,
                           std::vector<void*>* peerPtrs) {
  NCCLCHECK(checkComm(comm, "peerMemLookup"));
  MK_ARGCHECK(ok != nullptr && peerPtrs != nullptr, "peerMemLookup: null output");
  *ok = false;
  PeerMem::Impl* im = comm->peerMem->impl;
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto hit = im->lookupCache.find({p, bytes});
  pm::DeviceGuard guard;
  NCCLCHECK(guard.set(comm->cudaDev));

  // 1. Everyone publishes its buffer.
  pm::RegRecord* reg = (ptr != nullptr && bytes > 0) ? pm::findRegistration(im, p, bytes) : nullptr;
  std::vector<LookupInfo> info(comm->nRanks);
  LookupInfo& mine = info[comm->rank];
  memset(&mine, 0, sizeof(mine));
  mine.seq = im->lookupSeq;
  mine.registered = reg ? 1 : 0;
  mine.kind = reg ? reg->kind : pm::RegRecord::kLocalOnly;
  mine.regId = reg ? reg->id : 0;
  mine.ptr = p;
  mine.base = reg ? reg->base : p;
  mine.allocSize = reg ? reg->allocSize : 0;
  mine.bytes = bytes;
  mine.dev = im->dev;
  mine.pid = getpid();
  if (reg && reg->kind == pm::RegRecord::kCudaMalloc) mine.ipc = reg->ipc;
  mine.hitSeq = hit != im->lookupCache.end() ? hit->second.seq : ~0ull;
  if (comm->nRanks > 1)
    NCCLCHECK(bootstrapAllGather(comm->bootstrap, info.data(), sizeof(LookupInfo)));
  uint64_t seq = im->lookupSeq++;
  uint32_t tag = kIpcTagLookupBase + (uint32_t)seq;
  for (int r = 0; r < comm->nRanks; r++) {
    if (info[r].seq != seq) {
      MK_WARN("peerMemLookup: rank %d is at exchange %" PRIu64 ", this rank (%d) at %" PRIu64
              ": lookups diverged (a rank hit its cache while another did not)",
              r, info[r].seq, comm->rank, seq);
      return ncclInternalError;
    }
  }
  // The cache is used only when every rank hits an entry made by the same exchange: then
  // every rank uses the buffer it used then, and the cached peer pointers are right. A
  // rank whose allocator handed it the same address for a new buffer, while a peer's did
  // not, must not skip the exchange. One small allgather per lookup is the price; the
  // mappings themselves stay cached (regImports).
  bool allHit = mine.hitSeq != ~0ull;
  for (int r = 0; r < comm->nRanks; r++) allHit &= info[r].hitSeq == mine.hitSeq;
  if (allHit) {
    *peerPtrs = hit->second.ptrs;
    *ok = true;
    return ncclSuccess;
  }
  if (hit != im->lookupCache.end()) {  // stale for this exchange: rebuilt below
    for (const pm::ImportKey& k : hit->second.imports) unrefImport(im, k);
    im->lookupCache.erase(hit);
  }
  // Usable only if every local rank registered, and buffers of other processes can travel.
  for (int l = 0; l < im->localRanks; l++) {
    const LookupInfo& pi = info[im->localToRank[l]];
    if (!pi.registered || (!im->sameProc[l] && pi.kind == pm::RegRecord::kLocalOnly)) {
      MK_INFO(kReg,
              "peerMemLookup: rank %d buffer %p (%zu bytes): rank %d's buffer is %s; "
              "using the workspace",
              comm->rank, ptr, bytes, im->localToRank[l],
              pi.registered ? "not exportable" : "not registered");
      return ncclSuccess;
    }
  }

  // 2. fds of cuMem buffers to every local peer of another process; same-process peers of
  //    another GPU get access to our mapping (cuMem) before anyone uses the pointers.
  ncclResult_t local = ncclSuccess;
  if (reg->kind == pm::RegRecord::kCuMem) {
    std::vector<int> devs;
    for (int l = 0; l < im->localRanks; l++)
      if (im->sameProc[l] && im->peerDev[l] != reg->dev && im->peerDev[l] >= 0)
        devs.push_back(im->peerDev[l]);
    if (!devs.empty()) local = pm::setAccess((void*)reg->base, reg->allocSize, devs);
    if (im->anyOtherProc) {
      int fd = -1;
      RegFdMsg msg = {ncclSuccess, 0, reg->id};
      if (pm::exportFd(reg->handle, &fd) != ncclSuccess) msg.status = ncclUnhandledCudaError;
      for (int l = 0; l < im->localRanks; l++) {
        if (im->sameProc[l]) continue;
        ncclResult_t r =
            ipcSocketSend(&im->sock, im->peerSockNames[l].data(), tag, fd, &msg, sizeof(msg));
        if (r != ncclSuccess && local == ncclSuccess) local = r;
      }
      if (fd >= 0) close(fd);
      if (msg.status != ncclSuccess && local == ncclSuccess) local = (ncclResult_t)msg.status;
    }
  }

  // 3. Map every peer's buffer here.
  std::vector<void*> ptrs(im->localRanks, nullptr);
  std::vector<pm::ImportKey> keys;
  for (int l = 0; l < im->localRanks; l++) {
    const LookupInfo& pi = info[im->localToRank[l]];
    if (l == im->localRank) {
      ptrs[l] = const_cast<void*>(ptr);
    } else if (im->sameProc[l]) {
      ptrs[l] = (void*)(uintptr_t)pi.ptr;
      // cudaMalloc memory of another GPU: this GPU needs peer access to it.
      if (pi.kind != pm::RegRecord::kCuMem && pi.dev != im->dev && pi.dev >= 0) {
        ncclResult_t r =
            pm::canAccessPeer(im->dev, pi.dev) ? pm::enablePeerAccess(pi.dev) : ncclSystemError;
        if (r != ncclSuccess && local == ncclSuccess) local = r;
      }
    } else if (pi.kind == pm::RegRecord::kCuMem || local == ncclSuccess) {
      // (cuMem: always receive the message the peer sent, even after a local failure.)
      pm::ImportKey key;
      ncclResult_t r = importPeer(comm, im, l, pi, tag, &ptrs[l], &key);
      if (r == ncclSuccess) keys.push_back(key);
      if (r != ncclSuccess && local == ncclSuccess) local = r;
    }
  }

  // 4. Agree: the buffers are used only if every local rank mapped every peer.
  std::vector<int32_t> status(comm->nRanks, 0);
  status[comm->rank] = local;
  if (comm->nRanks > 1)
    NCCLCHECK(bootstrapAllGather(comm->bootstrap, status.data(), sizeof(int32_t)));
  bool allOk = true;
  for (int l = 0; l < im->localRanks; l++) allOk &= status[im->localToRank[l]] == ncclSuccess;
  // Imports are referenced by the cache entry; on failure, drop the ones nobody uses.
  pm::LookupEntry entry;
  for (const pm::ImportKey& k : keys) im->regImports[k].refs++;
  if (!allOk) {
    for (const pm::ImportKey& k : keys) unrefImport(im, k);
    MK_WARN(
        "peerMemLookup: rank %d buffer %p (%zu bytes): a local rank could not map its "
        "peers' buffers (this rank: error %d); using the workspace",
        comm->rank, ptr, bytes, (int)local);
    return ncclSuccess;
  }
  entry.ptrs = ptrs;
  entry.seq = seq;
  entry.reg = reg;
  entry.imports = std::move(keys);
  im->lookupCache[{p, bytes}] = std::move(entry);
  *peerPtrs = std::move(ptrs);
  *ok = true;
  MK_INFO(kReg, "peerMemLookup: rank %d buffer %p (%zu bytes) mapped for %d local ranks",
          comm->rank, ptr, bytes, im->localRanks);
  return ncclSuccess;
}

ncclResult_t peerMemRegFini(PeerMem::Impl* im) {
  ncclResult_t res = ncclSuccess;
  auto keep = [&](ncclResult_t r) {
    if (r != ncclSuccess && res == ncclSuccess) res = r;
  };
  peerMemWinFini(im);
  im->lookupCache.clear();
  for (auto& kv : im->regImports) keep(pm::mapRelease(&kv.second.map));
  im->regImports.clear();
  for (auto& kv : im->regs) keep(freeRecord(kv.first));
  im->regs.clear();
  return res;
}

}  // namespace mk
