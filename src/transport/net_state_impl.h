// Internals of the inter-node state (transport/net_state*.cc and their unit tests).
#pragma once
#include <atomic>
#include <cstdint>
#include <cuda_runtime.h>
#include <nccl.h>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "transport/net_state.h"

namespace mk {

class Net;
class Proxy;
class ProxyRing;
struct Bootstrap;

// ---- memory (net_state_mem.cc) --------------------------------------------------------
// Every block a NetState uses comes from a process-wide pool and goes back to it, zeroed
// again before its next use, instead of being freed: cudaFree/cudaFreeHost synchronise the
// whole device, and a comm torn down (abort) while another comm's kernel still waits on
// the same GPU must not block until that kernel's deadline.
enum class NetMem : int {
  kHostMapped = 0,  // cudaHostAlloc(mapped | portable): host pointer + device pointer
  kDevice = 1,      // cudaMalloc (registrable for GPUDirect RDMA)
  kShared = 2,      // ncclMemAlloc (cuMem with a POSIX-fd handle): mappable by local peers
};
struct NetBlock {
  NetMem kind = NetMem::kDevice;
  int cudaDev = -1;
  size_t bytes = 0;
  void* host = nullptr;  // kHostMapped only
  void* dev = nullptr;   // device pointer (every kind)
};
// Zero-filled block of at least `bytes` on cudaDev (current device must be cudaDev).
ncclResult_t netMemGet(NetMem kind, int cudaDev, size_t bytes, cudaStream_t s, NetBlock* out);
void netMemPut(NetBlock* b);  // back to the pool; *b is cleared; no-op when empty
// Proxy rings (kCudaMapped) are pooled the same way. netRingPut recycles a ring only
// when it is clean (not aborted; every ticket the device handed out was consumed and
// completed), else leaks it with an INFO line.
ncclResult_t netRingGet(int cudaDev, uint64_t nslots, ProxyRing** out);
void netRingPut(int cudaDev, ProxyRing* r, cudaStream_t s);

// ---- pure helpers (net_state_util.cc, unit-tested) ------------------------------------
// Ranks the proxy connects to: every rank of another node, plus the other ranks of this
// node when their P2P windows are not mapped (p2pOk false). Symmetric by construction.
std::vector<int> netProxyPeers(const Topo& topo, int rank, int nRanks, bool p2pOk);
// [nRanks] local index of every rank reached with P2P stores (-1: through the proxy).
std::vector<int> netPeerLocal(const Topo& topo, int rank, int nRanks, bool p2pOk);
// Out-of-band all-to-all over the comm's bootstrap with one tag (ProxyConfig::alltoall):
// blocks go to and come from `peers` only.
ncclResult_t netBootstrapAllToAll(Bootstrap* b, const std::vector<int>& peers, int tag,
                                  const void* sendbuf, void* recvbuf, size_t bytes);
constexpr int kNetBootstrapTag = 0x4e455430;  // "NET0"

// Device control block layout (one kDevice block): rt::CtlHdr, stage state, tables.
struct NetCtlLayout {
  size_t hdrOff, stageNextOff, stagePubOff, stageTicketOff, peerLocalOff, localWinsOff, bytes;
};
NetCtlLayout netCtlLayout(uint32_t stageSlots, int nRanks, int nLocal);

// ---- the state ------------------------------------------------------------------------
struct NetState {
  Net* net = nullptr;  // owned (deleted by netFini)
  int netDev = 0;
  bool gdr = false;  // windows in device memory (the backend reaches GPU memory)
  NetLayout lay{};
  Proxy* proxy = nullptr;
  ProxyRing* ring = nullptr;
  cudaStream_t stream = nullptr;  // internal, non-blocking: zero-fills and table uploads
  NetBlock send, recv, sig, err, ctl, local;
  void* localReg = nullptr;      // peerMemRegister handle of `local`
  bool p2pOk = false;            // local peers' P2P windows are mapped
  std::vector<int> peers;        // the proxy's peers
  std::vector<int> peerLocal;    // host copy of NetDev::peerLocal
  std::vector<void*> localWins;  // host copy of NetDev::localWins
  NetDev dev{};                  // prebuilt device view
  std::atomic<bool> proxyReported{false};
  std::atomic<bool> recordReported{false};
  std::atomic<bool> aborted{false};
};

}  // namespace mk
