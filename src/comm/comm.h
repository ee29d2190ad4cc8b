// The communicator object behind ncclComm_t. Each subsystem keeps its own state
// behind one pointer here and has init/fini functions called by api/init.cc in a
// fixed order (topo -> peer memory -> collectives -> net/proxy), fini in reverse.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <nccl.h>
#include <string>
#include <thread>
#include <vector>

#include "comm/config.h"

namespace mk {
struct Bootstrap;
struct PeerMem;    // transport/peer_mem.h
struct CollState;  // coll/coll_state.h
struct NetState;   // transport/net_state_impl.h (inter-node)

constexpr uint64_t kCommMagic = 0x6d6b65726e656c31ull;  // "mkernel1"
constexpr uint64_t kCommDead = 0xdeadc0de0badc0deull;

constexpr int kAgreedParams = 8;  // api/agreed.cc lists them

// Where every rank lives; filled by topo/topo.cc from the bootstrap allgather.
struct RankInfo {
  uint64_t hostHash;  // same host <=> same hash
  uint64_t pidHash;   // same process <=> same hostHash and pidHash
  int pid;
  int cudaDev;
  int64_t busId;
  int smCount;
  // The parameters every rank of a comm must share (api/agreed.h), as this rank read them:
  // compared at init, so that a mismatch fails there with a message instead of as a hang or
  // a timeout in the first call that depends on it.
  int64_t agreed[kAgreedParams];
};

struct Topo {
  int node = 0, nNodes = 1;                 // (virtual) node of this rank
  int localRank = 0, localRanks = 1;        // index and count inside the node
  std::vector<int> rankToNode;              // [nRanks]
  std::vector<int> rankToLocalRank;         // [nRanks]
  std::vector<std::vector<int>> nodeRanks;  // [nNodes][localRanks of that node]
  int ranksOnMyDevice = 1;                  // ranks of this comm (any process) on my GPU
  int indexOnMyDevice = 0;                  // my position among them
  int ranksInMyProcess = 1;                 // ranks of this comm on my GPU in this process
  std::vector<uint8_t> inMyProcess;         // [nRanks] 1: on my GPU in this process (me too)
  // The least share of a GPU any rank of the comm has: min over the comm's GPUs of their SMs /
  // the comm's ranks on them. Every rank computes the same from the allgathered RankInfo, so
  // verdicts every rank must share read this, not their own GPU's share (0: not computed).
  int leastShare = 0;
  int numaNode = -1;          // NUMA node of the GPU (hwloc), -1 unknown
  std::string nics;           // nearest NICs (hwloc), for logs and net selection
  bool virtualNodes = false;  // MKERNEL_EMULATE_NODES in effect
};

// kFailed: the init (or split/shrink) job failed; asyncResult holds its error.
enum class CommState : int { kInitializing, kReady, kFinalized, kRevoked, kAborted, kFailed };

}  // namespace mk

struct ncclComm {
  uint64_t magic = mk::kCommMagic;
  int rank = -1, nRanks = 0;
  int cudaDev = -1;
  int smCount = 0;        // multiprocessors of cudaDev (read at runtime)
  int cudaArch = 0;       // e.g. 900
  uint64_t commHash = 0;  // identical on every rank of this comm
  mk::Config config;
  mk::Topo topo;
  // topoQueueHint at init (what to change when this process's rank streams may share hardware
  // queues; "" when none is known): logged once, and appended to the comm's timeout messages.
  std::string queueHint;
  std::vector<mk::RankInfo> peerInfo;  // [nRanks]

  mk::Bootstrap* bootstrap = nullptr;
  // Abort: one word in host-pinned memory, mapped for the GPU (abortFlagDev) so kernels
  // can poll it; bootstrapAbort is a separate word so that NCCL_SHRINK_ABORT can stop
  // device work while the bootstrap keeps talking to the survivors.
  uint32_t* abortFlag = nullptr;
  uint32_t* abortFlagDev = nullptr;
  bool abortFlagPinned = false;
  uint32_t bootstrapAbort = 0;

  std::atomic<mk::CommState> state{mk::CommState::kInitializing};
  std::atomic<int> asyncResult{ncclSuccess};  // ncclInProgress while a background job runs
  std::mutex asyncMu;
  std::string asyncMsg;

  std::thread job;                          // nonblocking init/split in the background
  std::atomic<bool> finalizeCalled{false};  // a second ncclCommFinalize is refused
  // Split/shrink sequence: every member calls them in the same order, so the value is the
  // same on all ranks and tells concurrent splits apart.
  std::atomic<uint64_t> splitCount{0};

  mk::PeerMem* peerMem = nullptr;
  mk::CollState* coll = nullptr;
  mk::NetState* net = nullptr;

  // Custom reduction ops (ncclRedOpCreatePreMulSum); see coll/redop.h.
  void* redOps = nullptr;
  // Holds a reference on the fused GEMM + collective clique block (fused/ops/gemm_coll).
  uint32_t fusedCliqueRefs = 0;  // fused clique blocks held, one bit per fused::CliqueTag

  uint64_t magicEnd = mk::kCommMagic;
};

namespace mk {

// Validates a comm handle without dereferencing a freed pointer: live comms are kept in a
// registry. Returns ncclInvalidArgument with a message naming `api` otherwise.
ncclResult_t commCheck(const ncclComm* comm, const char* api);
void commRegister(ncclComm* comm);
void commUnregister(ncclComm* comm);
// The most ranks any live, initialised comm of this process has on the GPU `busId`
// (topo.ranksOnMyDevice; 0: none). A comm split from a larger one counts only its own ranks on
// the GPU, while the parent's other ranks may run kernels there at the same time (the other
// halves of the split): persistent kernels that wait for their peers size their grids by it.
int commMostRanksOnDevice(int64_t busId);
// Records an asynchronous error (first one wins), for ncclCommGetAsyncError.
void commSetAsyncError(ncclComm* comm, ncclResult_t res, const char* msg);
// Its init finished and succeeded (NCCL's ncclCommEnsureReady): still initializing ->
// ncclInvalidArgument; init failed -> that error. Later states (finalized, revoked) pass:
// the comm's attributes are valid to read.
ncclResult_t commCheckInitDone(ncclComm* comm, const char* api);
// Ready for collectives: commCheckInitDone, and not revoked, finalized or aborted
// (ncclInvalidUsage).
ncclResult_t commCheckReady(ncclComm* comm, const char* api);

}  // namespace mk
