// Lifetime of the inter-node state: init (backend, windows, P2P windows of local peers,
// ring, proxy), fini, abort, async errors and the device view. See net_state.h.
#include "transport/net_state.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "base/checks.h"
#include "base/param.h"
#include "transport/net.h"
#include "device/rt/err_host.h"
#include "transport/net_state_impl.h"
#include "transport/peer_mem.h"
#include "transport/proxy.h"
#include "transport/proxy_ring.h"

namespace mk {
namespace {

struct DevGuard {
  int saved = -1;
  explicit DevGuard(int dev) {
    if (cudaGetDevice(&saved) != cudaSuccess) saved = -1;
    if (dev >= 0) cudaSetDevice(dev);
  }
  ~DevGuard() {
    if (saved >= 0) cudaSetDevice(saved);
  }
};

// Virtual nodes are the test setup: their traffic takes the socket path unless a backend
// is asked for explicitly (MKERNEL_NET, NCCL_NET_PLUGIN).
ncclResult_t createBackend(ncclComm* comm, std::unique_ptr<Net>* out) {
  if (comm->topo.virtualNodes && MK_PARAM_STR(Net)[0] == '\0' &&
      MK_PARAM_STR(NetPlugin)[0] == '\0') {
    MK_INFO(kNet, "net: virtual nodes use the socket backend (MKERNEL_NET selects another)");
    return netCreateSocket(out);
  }
  return netCreate(out);
}

// The NIC hwloc found nearest to the GPU when the backend has several, else spread the
// local ranks over the devices.
ncclResult_t chooseDevice(ncclComm* comm, Net* net, int* dev, NetProperties* props) {
  int ndev = 0;
  NCCLCHECK(net->devices(&ndev));
  if (ndev <= 0) {
    MK_WARN("net: backend %s has no device", net->name());
    return ncclSystemError;
  }
  int pick = comm->topo.localRank % ndev;
  if (ndev > 1 && !comm->topo.nics.empty()) {
    std::string list = "," + comm->topo.nics + ",";
    for (int d = 0; d < ndev; d++) {
      NetProperties p;
      if (net->getProperties(d, &p) != ncclSuccess) continue;
      std::string base = p.name.substr(0, p.name.find(':'));
      if (!base.empty() && list.find("," + base + ",") != std::string::npos) {
        pick = d;
        break;
      }
    }
  }
  NCCLCHECK(net->getProperties(pick, props));
  *dev = pick;
  return ncclSuccess;
}

// Everything that needs no other rank. Its result is agreed on before any collective step.
ncclResult_t setupLocal(ncclComm* comm, NetState* ns) {
  const int dev = comm->cudaDev;
  NCCLCHECK(netLayout(netWindowBytes(), &ns->lay));
  CUDACHECK(cudaStreamCreateWithFlags(&ns->stream, cudaStreamNonBlocking));
  std::unique_ptr<Net> net;
  NCCLCHECK(createBackend(comm, &net));
  ns->net = net.release();
  // ncclCommAbort during init sets bootstrapAbort before it joins the init job.
  ns->net->setAbortFlag(&comm->bootstrapAbort);
  NetProperties props;
  NCCLCHECK(chooseDevice(comm, ns->net, &ns->netDev, &props));
  ns->gdr = (props.ptrSupport & NCCL_PTR_CUDA) != 0;
  const NetMem wk = ns->gdr ? NetMem::kDevice : NetMem::kHostMapped;
  const NetLayout& l = ns->lay;
  NCCLCHECK(netMemGet(wk, dev, l.sendBytes, ns->stream, &ns->send));
  NCCLCHECK(netMemGet(wk, dev, l.windowBytes, ns->stream, &ns->recv));
  NCCLCHECK(netMemGet(NetMem::kHostMapped, dev, l.sigBytes, ns->stream, &ns->sig));
  NCCLCHECK(netMemGet(NetMem::kHostMapped, dev, 256, ns->stream, &ns->err));
  NCCLCHECK(netMemGet(NetMem::kShared, dev, l.localBytes, ns->stream, &ns->local));
  NetCtlLayout cl = netCtlLayout(l.stageSlots, comm->nRanks, comm->topo.localRanks);
  NCCLCHECK(netMemGet(NetMem::kDevice, dev, cl.bytes, ns->stream, &ns->ctl));
  int64_t slots = MK_PARAM_INT(ProxyRingSlots);
  NCCLCHECK(netRingGet(dev, slots > 0 ? (uint64_t)slots : 1024, &ns->ring));
  NCCLCHECK(peerMemRegister(comm, ns->local.dev, l.localBytes, &ns->localReg));
  MK_INFO(kNet,
          "net: rank %d backend %s dev %d (%s), windows %llu bytes in %s memory, %u staging "
          "slots of %llu bytes, ring of %llu commands",
          comm->rank, ns->net->name(), ns->netDev, props.name.c_str(),
          (unsigned long long)l.windowBytes, ns->gdr ? "device" : "host-pinned", l.stageSlots,
          (unsigned long long)l.stageChunk, (unsigned long long)ns->ring->nslots());
  return ncclSuccess;
}

// Peer routing tables into the device control block.
ncclResult_t uploadTables(ncclComm* comm, NetState* ns) {
  NetCtlLayout cl = netCtlLayout(ns->lay.stageSlots, comm->nRanks, comm->topo.localRanks);
  char* ctl = static_cast<char*>(ns->ctl.dev);
  CUDACHECK(cudaMemcpyAsync(ctl + cl.peerLocalOff, ns->peerLocal.data(),
                            sizeof(int) * ns->peerLocal.size(), cudaMemcpyHostToDevice,
                            ns->stream));
  CUDACHECK(cudaMemcpyAsync(ctl + cl.localWinsOff, ns->localWins.data(),
                            sizeof(void*) * ns->localWins.size(), cudaMemcpyHostToDevice,
                            ns->stream));
  CUDACHECK(cudaStreamSynchronize(ns->stream));
  return ncclSuccess;
}

void buildView(ncclComm* comm, NetState* ns) {
  const NetLayout& l = ns->lay;
  NetCtlLayout cl = netCtlLayout(l.stageSlots, comm->nRanks, comm->topo.localRanks);
  char* ctl = static_cast<char*>(ns->ctl.dev);
  NetDev& d = ns->dev;
  d = NetDev{};
  d.w.abortFlag = comm->abortFlagDev;
  d.w.hdr = reinterpret_cast<rt::CtlHdr*>(ctl + cl.hdrOff);
  d.w.err = static_cast<rt::ErrRecord*>(ns->err.dev);
  d.w.rank = comm->rank;
  d.w.op = rt::kOpPut;  // every device API call names its own op
  d.ring = ns->ring->deviceView();
  d.rank = comm->rank;
  d.nRanks = comm->nRanks;
  d.localRank = comm->topo.localRank;
  d.nLocal = comm->topo.localRanks;
  d.peerLocal = reinterpret_cast<const int*>(ctl + cl.peerLocalOff);
  d.localWins = reinterpret_cast<void* const*>(ctl + cl.localWinsOff);
  d.localDataOff = l.sigBytes;
  d.sigLocal = static_cast<uint64_t*>(ns->local.dev);
  d.sigRemote = static_cast<uint64_t*>(ns->sig.dev);
  d.localData = static_cast<char*>(ns->local.dev) + l.sigBytes;
  d.recvData = static_cast<char*>(ns->recv.dev);
  d.windowBytes = l.windowBytes;
  d.sendBase = static_cast<char*>(ns->send.dev);
  d.sendUser = l.sendUser;
  d.stage = d.sendBase + l.sendUser;
  d.stageChunk = l.stageChunk;
  d.stageSlots = l.stageSlots;
  d.nSignals = kNetSignals;
  d.stageNext = reinterpret_cast<uint64_t*>(ctl + cl.stageNextOff);
  d.stagePub = reinterpret_cast<uint64_t*>(ctl + cl.stagePubOff);
  d.stageTicket = reinterpret_cast<uint64_t*>(ctl + cl.stageTicketOff);
  d.localSameDev = 0;
  const RankInfo& mine = comm->peerInfo[comm->rank];
  const std::vector<int>& nodeRanks = comm->topo.nodeRanks[comm->topo.node];
  for (size_t j = 0; j < nodeRanks.size() && j < 64; j++) {
    const RankInfo& o = comm->peerInfo[nodeRanks[j]];
    if (o.hostHash == mine.hostHash && o.busId == mine.busId) d.localSameDev |= 1ull << j;
  }
  const int64_t inl = MK_PARAM_INT(ProxyInlineCmd);
  d.inlineCmd = 0;
  if (ns->proxy != nullptr && proxyAllInline(ns->proxy) && inl > 0)
    d.inlineCmd = inl >= 2 && ns->ring->nslots() >= kProxyGroupMaxSlots ? 2 : 1;
}

ncclResult_t startProxy(ncclComm* comm, NetState* ns) {
  ProxyConfig cfg;
  cfg.rank = comm->rank;
  cfg.nranks = comm->nRanks;
  cfg.peers = ns->peers;
  cfg.net = ns->net;
  cfg.netDev = ns->netDev;
  cfg.rings = {ns->ring};
  // The proxy addresses the windows with host pointers when they are host memory.
  cfg.sendBuf = ns->gdr ? ns->send.dev : ns->send.host;
  cfg.sendBytes = ns->lay.sendBytes;
  cfg.recvBuf = ns->gdr ? ns->recv.dev : ns->recv.host;
  cfg.recvBytes = ns->lay.windowBytes;
  cfg.bufType = ns->gdr ? NCCL_PTR_CUDA : NCCL_PTR_HOST;
  cfg.signals = static_cast<uint64_t*>(ns->sig.host);
  cfg.nSignals = kNetSignals;
  Bootstrap* b = comm->bootstrap;
  std::vector<int> peers = ns->peers;
  cfg.alltoall = [b, peers](const void* s, void* r, size_t bytes) {
    return netBootstrapAllToAll(b, peers, kNetBootstrapTag, s, r, bytes);
  };
  cfg.cudaDev = comm->cudaDev;
  cfg.abortFlag = &comm->bootstrapAbort;
  cfg.pinThread = true;
  // Ranks of this host (the real one: virtual nodes share it) in rank order.
  cfg.hostCount = 0;
  for (int r = 0; r < comm->nRanks; r++) {
    if (comm->peerInfo[r].hostHash != comm->peerInfo[comm->rank].hostHash) continue;
    if (r < comm->rank) cfg.hostIndex++;
    cfg.hostCount++;
  }
  NCCLCHECK(proxyCreate(cfg, &ns->proxy));
  return ncclSuccess;
}

}  // namespace

ncclResult_t netInit(ncclComm* comm) {
  if (comm->net != nullptr || comm->topo.nNodes <= 1) return ncclSuccess;
  DevGuard g(comm->cudaDev);
  NetState* ns = new NetState();
  comm->net = ns;  // netFini releases whatever was built if a later step fails
  ncclResult_t local = setupLocal(comm, ns);
  // Agree on the local results before anything collective: a rank that could not set up
  // must not leave the others blocked in the lookup or the proxy's connection phase.
  struct Info {
    int32_t res;
    int32_t gdr;
    uint64_t windowBytes;
  };
  std::vector<Info> all(comm->nRanks);
  all[comm->rank] = Info{(int32_t)local, ns->gdr ? 1 : 0, ns->lay.windowBytes};
  NCCLCHECK(bootstrapAllGather(comm->bootstrap, all.data(), sizeof(Info)));
  for (int r = 0; r < comm->nRanks; r++) {
    if (all[r].res == ncclSuccess) continue;
    if (r == comm->rank) return local;
    MK_WARN("netInit: rank %d could not set up its inter-node state (error %d)", r, all[r].res);
    return ncclRemoteError;
  }
  for (int r = 0; r < comm->nRanks; r++) {
    if (all[r].windowBytes != ns->lay.windowBytes) {
      MK_WARN(
          "netInit: rank %d uses %llu-byte windows, rank %d %llu: MKERNEL_WORKSPACE_BYTES "
          "must be the same on every rank",
          r, (unsigned long long)all[r].windowBytes, comm->rank,
          (unsigned long long)ns->lay.windowBytes);
      return ncclInvalidUsage;
    }
  }
  // P2P windows of the local peers (every rank calls the lookup: it is collective).
  std::vector<void*> ptrs;
  bool ok = false;
  NCCLCHECK(peerMemLookup(comm, ns->local.dev, ns->lay.localBytes, &ok, &ptrs));
  const Topo& t = comm->topo;
  ns->p2pOk = ok && (int)ptrs.size() == t.localRanks;
  if (!ns->p2pOk && t.localRanks > 1)
    MK_INFO(kNet, "net: rank %d cannot map its local peers' windows; local traffic takes the proxy",
            comm->rank);
  ns->localWins.assign(t.localRanks, nullptr);
  ns->localWins[t.localRank] = ns->local.dev;
  if (ns->p2pOk) ns->localWins = ptrs;
  ns->peerLocal = netPeerLocal(t, comm->rank, comm->nRanks, ns->p2pOk);
  ns->peers = netProxyPeers(t, comm->rank, comm->nRanks, ns->p2pOk);
  NCCLCHECK(uploadTables(comm, ns));
  NCCLCHECK(startProxy(comm, ns));
  buildView(comm, ns);
  MK_INFO(kNet | kInit, "net: rank %d node %d/%d: %zu proxy peer(s), %d local peer(s) by P2P",
          comm->rank, t.node, t.nNodes, ns->peers.size(), ns->p2pOk ? t.localRanks - 1 : 0);
  return ncclSuccess;
}

ncclResult_t netFini(ncclComm* comm, bool leakMemory) {
  NetState* ns = comm->net;
  if (ns == nullptr) return ncclSuccess;
  DevGuard g(comm->cudaDev);
  ncclResult_t res = ncclSuccess, r;
  if (ns->proxy && (r = proxyDestroy(ns->proxy)) != ncclSuccess) res = r;
  ns->proxy = nullptr;
  if (ns->localReg && (r = peerMemDeregister(comm, ns->localReg)) != ncclSuccess &&
      res == ncclSuccess)
    res = r;
  ns->localReg = nullptr;
  // Without the internal stream the ring's device tail cannot be read without waiting for
  // the whole device: leak the ring instead (a failed init only).
  if (ns->ring && ns->stream && !leakMemory) netRingPut(comm->cudaDev, ns->ring, ns->stream);
  ns->ring = nullptr;
  if (!leakMemory)
    for (NetBlock* b : {&ns->send, &ns->recv, &ns->sig, &ns->err, &ns->ctl, &ns->local})
      netMemPut(b);
  delete ns->net;  // after the proxy: it closed every comm of the backend
  ns->net = nullptr;
  if (ns->stream) cudaStreamDestroy(ns->stream);
  cudaGetLastError();
  comm->net = nullptr;
  delete ns;
  return res;
}

void netAbort(ncclComm* comm) {
  NetState* ns = comm->net;
  if (ns == nullptr) return;
  ns->aborted.store(true);
  if (ns->proxy) proxyAbort(ns->proxy);
  if (ns->ring) ns->ring->setAbort();
}

ncclResult_t netPollAsyncError(ncclComm* comm) {
  NetState* ns = comm->net;
  if (ns == nullptr) return ncclSuccess;
  std::string proxyMsg;
  ncclResult_t pr = ns->proxy ? proxyGetAsyncError(ns->proxy, &proxyMsg) : ncclSuccess;
  // The proxy's error is the root cause: report it first; the device record (a kernel
  // that then failed to push or wait) adds the operation that noticed.
  if (pr != ncclSuccess && !ns->proxyReported.exchange(true))
    commSetAsyncError(comm, pr, proxyMsg.c_str());
  rt::ErrNames names;
  names.rank = comm->rank;
  names.setHint(comm->queueHint, comm->topo.inMyProcess);
  names.proxyMsg = proxyMsg.c_str();
  ncclResult_t res;
  std::string msg;
  if (rt::poll(static_cast<const rt::ErrRecord*>(ns->err.host), &ns->recordReported, names, &res,
               &msg))
    commSetAsyncError(comm, res, msg.c_str());
  return ncclSuccess;
}

ncclResult_t netDevView(ncclComm* comm, NetDev* out) {
  if (comm == nullptr || comm->net == nullptr) {
    MK_WARN(
        "device net API: comm %p has no inter-node state (it spans a single node, or "
        "netInit was not called)",
        (void*)comm);
    return ncclInvalidUsage;
  }
  *out = comm->net->dev;
  // Read at every hand-out, so that a change of MKERNEL_TIMEOUT_MS (tests: paramReset)
  // applies to the next launch.
  out->w.timeoutNs = rt::timeoutNs();
  return ncclSuccess;
}

ncclResult_t netHostView(ncclComm* comm, NetHostView* out) {
  if (comm == nullptr || comm->net == nullptr) return ncclInvalidUsage;
  NetState* ns = comm->net;
  out->sigRemote = static_cast<uint64_t*>(ns->sig.host);
  out->sendUser = ns->gdr ? ns->send.dev : ns->send.host;
  out->windowsOnHost = !ns->gdr;
  out->netDev = ns->netDev;
  out->backend = ns->net ? ns->net->name() : "";
  out->nProxyPeers = (int)ns->peers.size();
  return ncclSuccess;
}

ncclResult_t netStats(ncclComm* comm, NetStats* out) {
  if (comm == nullptr || comm->net == nullptr || comm->net->proxy == nullptr)
    return ncclInvalidUsage;
  ProxyStats s = proxyStats(comm->net->proxy);
  *out = NetStats{s.cmds, s.bytesSent, s.bytesRecv, s.signalsApplied};
  return ncclSuccess;
}

}  // namespace mk
