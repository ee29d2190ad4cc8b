// Peer memory: each comm's symmetric workspace, mapped by every intra-node peer, and
// user-buffer registration (ncclCommRegister) / ncclMemAlloc.
//
// Workspace. Every rank allocates MKERNEL_WORKSPACE_BYTES (rounded up to the recommended
// cuMem granularity; the rounded size must be the same on every rank) on comm->cudaDev
// with cuMemCreate, requesting a POSIX-fd shareable handle, maps it for its own device and
// zero-fills it. The local peers of a rank are the ranks of its (virtual) node,
// comm->topo.nodeRanks[comm->topo.node]; ranks of other nodes are never mapped.
//   - Local peers in this process (same hostHash and pidHash) use the owner's pointer as is
//     (the pointer value travels through the bootstrap allgather). The owner grants its own
//     mapping access for the devices of those peers (P2P is required between them).
//   - Local peers in other processes receive an fd of the allocation over a Unix-domain
//     datagram socket (transport/ipc_socket.h, SCM_RIGHTS) and import it
//     (cuMemImportFromShareableHandle + map + access for their device). Every fd is closed
//     right after the import; ranks that share a GPU import on that same GPU.
// Without a POSIX-fd-capable driver the workspace falls back to a non-exportable cuMem
// allocation (or cudaMalloc where VMM is missing) only when all local peers share this
// process; otherwise init fails with a message.
//
// Allocation, registration and lookup records are per comm (PeerMem::Impl) and per process
// (the ncclMemAlloc registry, guarded by a mutex). Functions of one comm must not be called
// concurrently (NCCL's rule: one thread uses a comm at a time); different comms may be used
// from different threads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <nccl.h>
#include <vector>

struct ncclComm;

namespace mk {

struct PeerMem {
  size_t bytes = 0;       // per-rank workspace size (MKERNEL_WORKSPACE_BYTES, granularity-rounded)
  void* local = nullptr;  // this rank's workspace (device memory of comm->cudaDev)
  // [topo.localRanks] pointers, valid in this process, to every local peer's workspace
  // (peers[topo.localRank] == local). Ranks in one process share pointers directly;
  // other processes' workspaces are imported from POSIX fds passed over Unix sockets.
  // Zero-filled at init; nothing here ever resets it again (flags are monotonic).
  std::vector<void*> peers;
  void* peersDev = nullptr;  // the same array in device memory (void*[localRanks])
  struct Impl;
  Impl* impl = nullptr;
};

// Collective over ALL ranks of the comm (two bootstrap allgathers; every rank must call
// it, also ranks alone in their virtual node); needs comm->rank/nRanks/cudaDev/commHash,
// comm->topo and comm->peerInfo filled and comm->bootstrap connected (nRanks > 1).
// Polls *comm->abortFlag (may be null) while it waits for fds; every wait is bounded by
// MKERNEL_BOOTSTRAP_TIMEOUT_S. When any rank fails, every rank returns an error (the
// failing rank its own code, the others ncclRemoteError naming it), and on error this rank
// has already released everything it built (comm->peerMem stays null).
// Sets comm->peerMem. Restores the calling thread's current device.
ncclResult_t peerMemInit(ncclComm* comm);
// Local (no communication): unmaps and releases everything of this comm: imported peer
// workspaces and registered buffers, its own workspace, peersDev, registrations, the IPC
// socket. Safe after abort, after a failed init and when comm->peerMem is null.
// The caller must make sure that no kernel still touches the workspace of this rank
// or of its peers: in-process peers use this rank's pointer directly, so a normal
// destroy needs a barrier (or device synchronisation) of all local ranks before fini.
ncclResult_t peerMemFini(ncclComm* comm);

// ncclMemAlloc / ncclMemFree: cuMem memory on the current device with a POSIX-fd handle
// (recommended granularity, size rounded up), mapped read/write for the current device and
// for every other device that can access it peer-to-peer. size 0 gives *ptr = nullptr.
// Without VMM support it falls back to cudaMalloc. memFree(nullptr) is a no-op; any
// pointer that is not the start of a live memAlloc allocation -> ncclInvalidArgument.
ncclResult_t memAlloc(void** ptr, size_t size);
ncclResult_t memFree(void* ptr);

// ncclCommRegister / ncclCommDeregister: local calls (no communication) that record a
// buffer. The buffer's kind is detected: cuMem (cuMemRetainAllocationHandle succeeds and
// the allocation has a POSIX-fd handle: the fd is exported at lookup), cudaMalloc (a CUDA
// IPC handle of the enclosing allocation plus the offset into it), or "local only" (host
// or managed memory, cudaMallocAsync pools, regions spanning several allocations, cuMem
// without an fd handle): usable by in-process peers only. Null buffer/handle, size 0,
// memory unknown to CUDA, or a handle not from this comm -> ncclInvalidArgument.
// A buffer may be registered several times (several handles).
ncclResult_t peerMemRegister(ncclComm* comm, void* buff, size_t size, void** handle);
ncclResult_t peerMemDeregister(ncclComm* comm, void* handle);

// BLOCKING COLLECTIVE. Called at enqueue time of a collective by EVERY rank of the comm
// (all nodes; the exchange is a bootstrap allgather over the whole comm), in the same call
// order, each with its own buffer [ptr, ptr+bytes). The caller must therefore only use it
// where each rank runs in its own thread or process (never from one thread that drives
// several ranks, e.g. inside ncclGroupStart/End over several comms of one thread, which
// would deadlock).
//
// If every local rank (ranks of this node) has a registration covering its buffer, and
// every cross-process peer's buffer is exportable (cuMem with fd, or cudaMalloc), fills
// peerPtrs[localRanks] with each local peer's buffer mapped here (peerPtrs[localRank] ==
// ptr) and sets *ok = true; otherwise *ok = false (the collective uses the staging
// workspace). A rank whose import fails sets *ok = false on every local rank (the ranks
// agree through a second allgather), with a warning; it is not an error.
//
// Caching: a successful exchange is cached per (ptr, bytes) of this rank. Every lookup
// still makes one small allgather, so ranks never diverge: the cached pointers are used
// only when every rank has an entry made by the same exchange (each then uses the buffer
// it used then); otherwise the exchange runs again. Imported peer buffers stay mapped
// until the registration of this rank that used them is deregistered, or until fini.
ncclResult_t peerMemLookup(ncclComm* comm, const void* ptr, size_t bytes, bool* ok,
                           std::vector<void*>* peerPtrs);

}  // namespace mk

// ---------------------------------------------------------------------------------------
// Internals shared by transport/peer_mem*.cc only (they define MK_PEER_MEM_INTERNAL).
#ifdef MK_PEER_MEM_INTERNAL
#include <cuda.h>
#include <cuda_runtime.h>
#include <map>
#include <memory>
#include <utility>

#include "base/cudawrap.h"
#include "transport/ipc_socket.h"

namespace mk {
namespace pm {

using DeviceGuard = ::mk::DeviceGuard;  // base/cudawrap.h

// One range of device memory this process maps: allocated here (cuMem or cudaMalloc),
// imported from an fd (cuMem), or opened from a CUDA IPC handle.
struct Mapping {
  enum Kind : int { kNone = 0, kCuMem, kCudaMalloc, kIpcOpen };
  Kind kind = kNone;
  void* ptr = nullptr;
  size_t size = 0;
  int dev = -1;                             // device the memory lives on (-1 unknown)
  CUmemGenericAllocationHandle handle = 0;  // kCuMem
  bool haveHandle = false, reserved = false, mapped = false;
  bool exportable = false;  // kCuMem with a POSIX-fd handle
};

// Devices that can map memory of `dev` (P2P), `dev` first.
std::vector<int> accessibleFrom(int dev);
bool canAccessPeer(int dev, int peerDev);
// Makes peerDev's cudaMalloc memory accessible from the current device (idempotent).
ncclResult_t enablePeerAccess(int peerDev);
// Device capabilities (false when unknown).
bool vmmSupported(int dev);
bool fdHandleSupported(int dev);
// Recommended granularity of an allocation with these properties.
ncclResult_t allocGranularity(int dev, bool exportable, size_t* gran);
// cuMemCreate (POSIX-fd handle if exportable) + reserve + map + read/write access for
// every device of accessDevs (which must include dev). size is rounded up to the recommended
// granularity (m->size is the rounded size). On failure nothing stays allocated; with
// quiet, a failing cuMemCreate is logged at INFO only (the caller will try something else).
ncclResult_t mapCreate(int dev, size_t size, bool exportable, const std::vector<int>& accessDevs,
                       bool quiet, Mapping* m);
// Grants read/write access to the devices in devs on an existing cuMem mapping.
ncclResult_t setAccess(void* ptr, size_t size, const std::vector<int>& devs);
// A new POSIX fd for the allocation (the caller closes it).
ncclResult_t exportFd(CUmemGenericAllocationHandle handle, int* fd);
// Imports an fd (does NOT close it) and maps `size` bytes of it for device `dev`.
ncclResult_t mapImportFd(int fd, size_t size, int dev, Mapping* m);
// Unmaps and releases whatever m holds (safe on partial and empty mappings). Keeps going
// after a failure and returns the first error.
ncclResult_t mapRelease(Mapping* m);

// A buffer given to peerMemRegister.
struct RegRecord {
  enum Kind : int32_t { kLocalOnly = 0, kCuMem = 1, kCudaMalloc = 2 };
  uint64_t id = 0;  // unique in this process
  uintptr_t buff = 0;
  size_t size = 0;
  Kind kind = kLocalOnly;
  uintptr_t base = 0;  // enclosing allocation (kCuMem, kCudaMalloc)
  size_t allocSize = 0;
  int dev = -1;
  CUmemGenericAllocationHandle handle = 0;  // retained (kCuMem)
  bool haveHandle = false;
  cudaIpcMemHandle_t ipc{};  // kCudaMalloc
};

// A peer's registered allocation mapped here (from another process).
struct PeerImport {
  Mapping map;   // kCuMem (imported fd) or kIpcOpen
  int refs = 0;  // lookup-cache entries using it
};
using ImportKey = std::pair<int, uint64_t>;  // (peer rank, peer's RegRecord id)

struct LookupEntry {
  std::vector<void*> ptrs;   // [localRanks]
  uint64_t seq = 0;          // the exchange that made it
  RegRecord* reg = nullptr;  // this rank's registration that covered the buffer
  std::vector<ImportKey> imports;
};

// A window (ncclCommWindowRegister, transport/peer_mem_win.h): a registration of its own
// plus every local peer's window mapped here, looked up once at registration.
struct Window {
  uint64_t magic = 0;  // kWindowMagic while registered
  ncclComm* comm = nullptr;
  uint64_t id = 0;  // window registrations of the comm before this one (same on every rank)
  uintptr_t base = 0;
  size_t size = 0;
  int flags = 0;           // this rank's NCCL_WIN_* flags
  bool symmetric = false;  // every rank asked for NCCL_WIN_COLL_SYMMETRIC
  bool mapped = false;     // peers[] valid: every local rank mapped every local peer's window
  size_t minSize = 0;      // smallest window of the local ranks
  RegRecord* reg = nullptr;
  std::vector<void*> peers;        // [localRanks] each local rank's window base, valid here
  std::vector<ImportKey> imports;  // references this window holds on regImports
};
constexpr uint64_t kWindowMagic = 0x6d6b77696e646f77ull;  // "mkwindow"

// peer_mem_reg.cc, for peer_mem_win.cc: the registration covering [p, p + bytes) (or null);
// one more reference on every peer import of the lookup-cache entry of (ptr, bytes) (keys
// returned); one reference less on each of keys (unmapping at zero).
RegRecord* findRegistration(PeerMem::Impl* im, uintptr_t p, size_t bytes);
void refLookupImports(PeerMem::Impl* im, const void* ptr, size_t bytes,
                      std::vector<ImportKey>* keys);
ncclResult_t unrefImports(PeerMem::Impl* im, const std::vector<ImportKey>& keys);

}  // namespace pm

struct PeerMem::Impl {
  int dev = -1;
  int localRank = 0, localRanks = 1;
  std::vector<int> localToRank;  // [localRanks] global ranks of my node
  std::vector<char> sameProc;    // [localRanks] peer lives in this process
  std::vector<int> peerDev;      // [localRanks] CUDA device of each local peer
  bool anyOtherProc = false;

  pm::Mapping ws;                      // own workspace
  std::vector<pm::Mapping> wsImports;  // [localRanks] imported workspaces (other processes)

  IpcSocket sock;                                // open when anyOtherProc
  std::vector<std::vector<char>> peerSockNames;  // [localRanks]

  std::map<pm::RegRecord*, std::unique_ptr<pm::RegRecord>> regs;
  std::map<std::pair<uintptr_t, size_t>, pm::LookupEntry> lookupCache;
  std::map<pm::ImportKey, pm::PeerImport> regImports;
  uint64_t lookupSeq = 0;  // exchanges done (identical on every rank)

  std::vector<std::unique_ptr<pm::Window>> windows;  // registration order
  uint64_t windowSeq = 0;  // window registrations made (identical on every rank)
};

// peer_mem_reg.cc: releases every window, registration, cached lookup and imported peer
// buffer.
ncclResult_t peerMemRegFini(PeerMem::Impl* im);
// peer_mem_win.cc: forgets every window (their registrations and imports are released by
// peerMemRegFini right after).
void peerMemWinFini(PeerMem::Impl* im);

// IPC socket tags.
constexpr uint32_t kIpcTagWorkspace = 1;
constexpr uint32_t kIpcTagLookupBase = 16;  // + exchange sequence number

}  // namespace mk
#endif  // MK_PEER_MEM_INTERNAL
