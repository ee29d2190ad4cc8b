// Inter-node state of a communicator (comm->net) and the device view its kernels receive.
//
// netInit (called by api/init.cc after peerMemInit, for every comm) builds, when the
// comm spans several (virtual) nodes:
//   - a Net backend (MKERNEL_NET; under MKERNEL_EMULATE_NODES with MKERNEL_NET and
//     NCCL_NET_PLUGIN unset: socket, the test transport);
//   - the proxy's windows, registered with the backend: a source window (a user part that
//     kernels may fill and put from without a copy, then a staging part) and a receive
//     window where remote peers' puts land. Device memory when the backend can reach GPU
//     memory (GPUDirect RDMA), otherwise host-pinned memory mapped for the GPU;
//   - a P2P window per rank (signal words, then data) allocated with ncclMemAlloc and
//     mapped by every local peer through peerMemRegister/peerMemLookup: local peers'
//     puts land there with direct stores;
//   - the proxy's signal words (host-pinned, mapped, 64-bit, monotonic, never reset);
//   - one GPU->CPU command ring (MKERNEL_PROXY_RING_SLOTS) and a Proxy thread connected to
//     every rank of the other nodes (and to local ranks when their P2P windows could not
//     be mapped), pinned near the GPU.
// Kernels use it through src/device/net/devcomm.cuh with a NetDev built by netDevView.
// A single-node comm has no NetState (comm->net stays null).
#pragma once
#include <cstdint>
#include <nccl.h>

#include "device/rt/err.h"
#include "transport/proxy_ring.h"

struct ncclComm;

namespace mk {

// Signal slots of every rank (indices 0 .. kNetSignals-1). A slot's value, as
// wait_signal sees it, is the sum of the word local peers write and the word the proxy
// writes for remote peers: "set" slots need one writer, "add" slots may have many.
constexpr uint32_t kNetSignals = 4096;

// What a kernel needs (passed by value; every pointer is a device pointer).
struct NetDev {
  // The net layer's own failure domain: the comm's abort flag, its control header and
  // error record (rt::kOpPut.. records; ring back-pressure is bounded by it too).
  rt::WaitCtx w;
  ProxyRingView ring;
  int rank, nRanks;
  int localRank, nLocal;
  const int* peerLocal;    // [nRanks] local index of a rank reached by P2P stores, else -1
  void* const* localWins;  // [nLocal] P2P window of every local rank: signals, then data
  uint64_t localDataOff;   // offset of the data in a P2P window
  uint64_t* sigLocal;      // [kNetSignals] my P2P window's signal words
  uint64_t* sigRemote;     // [kNetSignals] signal words the proxy updates (host-mapped)
  char* localData;         // my P2P window's data: where local peers' puts land
  char* recvData;          // where remote peers' puts land
  uint64_t windowBytes;    // every destination window: dst_offset + bytes <= windowBytes
  char* sendBase;          // the proxy's source window: [0, sendUser) for kernels, then staging
  uint64_t sendUser;
  char* stage;          // sendBase + sendUser
  uint64_t stageChunk;  // bytes per staging slot (commands of a staged put are this size)
  uint32_t stageSlots;
  uint32_t nSignals;
  uint64_t* stageNext;    // staging slots taken (monotonic)
  uint64_t* stagePub;     // [stageSlots] laps published per slot
  uint64_t* stageTicket;  // [stageSlots] ring tail after the slot's command was pushed
  // Puts of at most kProxyInlineMax bytes may carry their data in the command (kProxyInline):
  // every remote peer takes small puts inside the batch header (proxyAllInline). 0: off;
  // 1: <= kProxyInlineMax bytes; 2: <= kProxyInlineExtMax bytes (header + continuation slots,
  // MKERNEL_PROXY_INLINE_CMD=2, only on a ring of at least kProxyGroupMaxSlots slots).
  int inlineCmd;
  // Bit j: local index j runs on my GPU (ranks sharing a GPU, as threads or processes under
  // MPS; always my own bit). Puts and signals to those peers and waits on their words need
  // only the .gpu scope: one GPU's memory system orders them. A system-scope fence there
  // waits for every outstanding write of the thread to reach the host (measured on the H200
  // with 2 x 2 processes: ~4 us per fence). Local indices >= 64 keep the system scope.
  uint64_t localSameDev;
};

// Window sizes of a comm, a pure function of the window size (identical on every rank).
struct NetLayout {
  uint64_t windowBytes;  // destination windows (P2P data, proxy receive window)
  uint64_t sendUser;     // user part of the source window
  uint64_t stageChunk;   // staging slot size
  uint32_t stageSlots;
  uint64_t sendBytes;   // sendUser + stageChunk * stageSlots
  uint64_t sigBytes;    // signal words at the start of a P2P window (4 KiB aligned)
  uint64_t localBytes;  // sigBytes + windowBytes
};
// ncclInvalidArgument when windowBytes is too small (< 64 KiB) or not a multiple of 4 KiB.
ncclResult_t netLayout(uint64_t windowBytes, NetLayout* out);
// MKERNEL_WORKSPACE_BYTES for now (a dedicated parameter is requested).
uint64_t netWindowBytes();

struct NetState;  // net_state_impl.h

// Called by the comm layer for every comm (collective over all ranks when nNodes > 1).
ncclResult_t netInit(ncclComm* comm);
// Local: stops the proxy, releases everything. Idempotent; safe after a failed init and
// after netAbort. Kernels using the comm's NetDev must have finished, unless leakMemory: then
// the device-visible blocks (windows, signals, ring) are leaked, not returned to the pool
// that the next comm takes them from.
ncclResult_t netFini(ncclComm* comm, bool leakMemory = false);
// Stops the proxy promptly (ring producers fail instead of waiting). No-op without net.
void netAbort(ncclComm* comm);
// Non-blocking: the proxy's error or a device-side error record -> commSetAsyncError.
ncclResult_t netPollAsyncError(ncclComm* comm);

// The device view for kernels. ncclInvalidUsage (with a message) when comm->net is null.
ncclResult_t netDevView(ncclComm* comm, NetDev* out);
// Host pointers for tests and benchmarks: the proxy's signal words, and the user part of
// the source window (host memory when the windows are host-pinned, else device memory).
struct NetHostView {
  uint64_t* sigRemote;
  void* sendUser;
  bool windowsOnHost;
  int netDev;
  const char* backend;
  int nProxyPeers;
};
ncclResult_t netHostView(ncclComm* comm, NetHostView* out);
struct NetStats {
  uint64_t cmds, bytesSent, bytesRecv, signalsApplied;
};
ncclResult_t netStats(ncclComm* comm, NetStats* out);

}  // namespace mk
