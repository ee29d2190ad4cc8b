// Proxy engine: the CPU thread that turns ring commands into net traffic (sender side)
// and lands incoming data and signals (receiver side). One Proxy per rank, connected to a
// list of remote peers; every peer pair gets one send comm each way.
//
// Wire protocol over any Net backend (two-sided, ordered per comm pair):
//   a batch = one header message (tag kTagHdr: up to kProxyMaxBatch ProxyWireCmd) followed
//   by one data message per put chunk (tag kTagData) in header order.
// The receiver posts the header irecv, then the data irecvs straight into the destination
// window, and applies each signal only after the data of every earlier entry of that
// peer has completed (test() done, then iflush for GPU memory): data always lands before
// its signal, and signals of one peer apply in command order. Signals are 64-bit words in
// host(-mapped) memory, set (monotonic sequence numbers) or added, never reset.
// Over verbs the data messages are RDMA WRITEs and their completion notice a
// WRITE_WITH_IMM on the same RC QP (net_verbs.cc), so the same ordering argument holds.
//
// Errors (peer gone, bad offsets, timeouts) stop the proxy, set the rings' abort flag and
// are kept as one async error record read with proxyGetAsyncError().
#pragma once
#include <nccl.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "transport/net.h"
#include "transport/proxy_ring.h"

namespace mk {

// Out-of-band all-to-all the comm layer provides (bootstrap): sendbuf holds nranks blocks
// of `bytes`, block p destined to rank p; recvbuf gets block p from rank p. Blocks for
// ranks that are not peers are ignored.
using ProxyAllToAll = std::function<ncclResult_t(const void* sendbuf, void* recvbuf, size_t bytes)>;

struct ProxyConfig {
  int rank = 0;
  int nranks = 0;
  std::vector<int> peers;  // remote ranks (other nodes); the same list on both sides of a pair
  Net* net = nullptr;      // not owned; outlives the proxy
  int netDev = 0;
  std::vector<ProxyRing*> rings;  // command sources, drained round-robin (not owned)
  // Local source window (put srcOff) and destination window (peers' dstOff), both
  // registered with the backend. bufType: NCCL_PTR_HOST or NCCL_PTR_CUDA.
  void* sendBuf = nullptr;
  size_t sendBytes = 0;
  void* recvBuf = nullptr;
  size_t recvBytes = 0;
  int bufType = NCCL_PTR_HOST;
  // Signal words incoming signals update (host or host-mapped memory).
  uint64_t* signals = nullptr;
  size_t nSignals = 0;
  ProxyAllToAll alltoall;
  int64_t timeoutMs = 0;  // connection setup bound; 0 = netTimeoutMs()
  // The comm's abort word (may be null): connection set-up gives up once it is set.
  const uint32_t* abortFlag = nullptr;
  int cudaDev = -1;  // for CPU pinning near the GPU (-1: use the NIC, else none)
  bool pinThread = true;
  // This rank among the comm's ranks on this host (real host, not virtual node), and how
  // many there are: they give the proxy its own core (proxyClaimSlot).
  int hostIndex = 0, hostCount = 1;
};

class Proxy;

ncclResult_t proxyCreate(const ProxyConfig& cfg, Proxy** out);
// Stops the thread, closes every comm. Safe after an error.
ncclResult_t proxyDestroy(Proxy* p);
// ncclSuccess, or the first error the proxy hit, with its message (naming the peer).
ncclResult_t proxyGetAsyncError(Proxy* p, std::string* msg);
// Asks the proxy to stop (comm abort): pending work is dropped, rings are aborted.
void proxyAbort(Proxy* p);
// Whether every peer takes small puts inside the batch header (both windows host memory), so
// that producers may push kProxyInline commands.
bool proxyAllInline(Proxy* p);
// Commands of ring i completed so far (same as ring->done()); tests and host waits.
uint64_t proxyCompleted(Proxy* p, int ring);
struct ProxyStats {
  uint64_t cmds = 0, batches = 0, bytesSent = 0, bytesRecv = 0, signalsApplied = 0;
};
ProxyStats proxyStats(Proxy* p);

// Binds the calling thread to the CPUs near the GPU (cudaDev >= 0) or else near the
// NIC at pciPath (sysfs path); with MKERNEL_PROXY_PIN=2 to one core of them, the slot-th
// from the end (slot < 0 or not that many cores: all of them). Best effort: returns
// ncclSuccess with an INFO line when nothing is known. (proxy_affinity.cc, hwloc)
ncclResult_t proxyPinThread(int cudaDev, const std::string& nicPciPath, int slot);
// What proxyPinThread, called on this thread, would bind to for a near set given as a list
// ("0-15"), as a list; "" for none (mode 0, or nothing of the set allowed). For tests.
std::string proxyPinChoice(const std::string& nearList, int slot, int mode);
// A pinning slot no live proxy of this host holds (lock files in MKERNEL_PROXY_SLOT_DIR; of
// this process only without a usable directory): hostIndex, else hostIndex plus a multiple of
// hostCount; and its release.
int proxyClaimSlot(int hostIndex, int hostCount);
void proxyReleaseSlot(int slot);

}  // namespace mk
