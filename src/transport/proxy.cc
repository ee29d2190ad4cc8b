// Proxy engine (see proxy.h for the protocol): the thread's polling loop, creation
// (connections to every peer), teardown and the API. The moving parts are in proxy_io.cc.
#include "transport/proxy.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include <sched.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>

#include "base/checks.h"
#include "base/param.h"
#include "transport/proxy_impl.h"

namespace mk {

using namespace prx;  // NOLINT: the engine's own types

bool Proxy::busy() const {
  for (const PeerState& ps : peers) {
    if (!ps.queued.empty() || !ps.sendq.empty() || ps.flushReq) return true;
    if (!ps.recvq.empty() && ps.recvq.front()->hdrDone) return true;
  }
  return false;
}

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);  // keeps the poll loop a loop
#endif
}

// Polling policy. Nothing can wake the proxy (GPU threads write the ring, peers write the
// sockets), so it polls, and how it waits between polls decides the latency of messages:
//  - right after progress, a few tight polls;
//  - then, for MKERNEL_PROXY_SPIN_US after the last progress, sched_yield between polls:
//    free on a CPU nobody else wants (and it does not let an idle virtual CPU halt, which
//    can take long to undo), while the rank's other threads get the CPU when they want it;
//  - then sleeps: 2 us while work is in flight (a large transfer on helper threads), else an
//    eighth of the time since the last progress (1 us .. MKERNEL_PROXY_SLEEP_US), at most
//    ~12% added to any wait. Not a longer spin: a thread that keeps the CPU busy loses its
//    claim on it under contention (another busy thread on its CPU, a loaded host) and then
//    waits whole time slices after each yield, milliseconds per message, while a thread
//    that wakes from a short sleep preempts at once. Yields that took over 100 us (another
//    thread held the CPU for its slice) are counted in the statistics.
// The timer slack is cut to 1 us so that a sleep lasts what it asks (Linux adds 50 us by
// default, and a slack inherited from the environment can be milliseconds).
void Proxy::run() {
  if (cfg.pinThread) proxyPinThread(cfg.cudaDev, props.pciPath, pinSlot);
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  const uint64_t spinNs = (uint64_t)MK_PARAM_INT(ProxySpinUs) * 1000;
  const uint64_t maxSleepNs = (uint64_t)MK_PARAM_INT(ProxySleepUs) * 1000;
  constexpr uint64_t kSlowYieldNs = 100000;
  uint64_t lastActive = proxyNowNs(), prev = lastActive;
  bool slept = false;
  for (uint32_t polls = 0; !stop.load(std::memory_order_relaxed);) {
    loopNs = proxyNowNs();
    times.loop(loopNs - prev, slept);
    prev = loopNs;
    slept = false;
    bool progress = drainRings();
    for (PeerState& ps : peers) {
      if (errCode.load() != ncclSuccess) break;
      progress |= progressSend(ps);
      if (errCode.load() != ncclSuccess) break;
      progress |= progressRecv(ps);
    }
    // Commands the GPU pushed while this iteration sat in the peers' system calls (often
    // the answer to what it just received: an ack, the next chunk) leave now rather than
    // after another round of receive polls. Only after progress: an idle loop stays cheap.
    if (progress && errCode.load() == ncclSuccess && drainRings()) {
      for (PeerState& ps : peers) {
        if (errCode.load() != ncclSuccess) break;
        if (!ps.queued.empty()) progressSend(ps);
      }
    }
    if (errCode.load() != ncclSuccess) break;
    if (progress) {
      lastActive = loopNs;
      polls = 0;
      continue;
    }
    if (++polls < 64) {
      cpuRelax();
      continue;
    }
    const uint64_t idleNs = loopNs - lastActive;
    if (idleNs < spinNs) {
      sched_yield();
      times.yields++;
      if (proxyNowNs() - loopNs > kSlowYieldNs) times.slowYields++;
      continue;
    }
    const uint64_t sleepNs =
        busy() ? 2000 : std::max<uint64_t>(1000, std::min<uint64_t>(idleNs / 8, maxSleepNs));
    struct timespec ts = {0, (long)sleepNs};
    nanosleep(&ts, nullptr);
    times.sleeps++;
    slept = true;
  }
}

ncclResult_t proxyCreate(const ProxyConfig& cfgIn, Proxy** out) {
  MK_ARGCHECK(cfgIn.net != nullptr, "proxy: no net backend");
  MK_ARGCHECK(cfgIn.nranks > 0 && cfgIn.rank >= 0 && cfgIn.rank < cfgIn.nranks,
              "proxy: bad rank %d of %d", cfgIn.rank, cfgIn.nranks);
  MK_ARGCHECK((bool)cfgIn.alltoall || cfgIn.peers.empty(), "proxy: no out-of-band exchange");
  MK_ARGCHECK(cfgIn.nSignals == 0 || cfgIn.signals != nullptr, "proxy: NULL signal array");
  Proxy* p = new Proxy();
  p->cfg = cfgIn;
  ProxyConfig& cfg = p->cfg;
  p->holdNs = (uint64_t)MK_PARAM_INT(ProxyAckHoldUs) * 1000;
  if (cfg.timeoutMs <= 0) cfg.timeoutMs = netTimeoutMs();
  Net* net = cfg.net;
  ncclResult_t res = ncclSuccess;
  std::vector<char> sendH, recvH;
  int64_t deadline;
  NCCLCHECKGOTO(net->getProperties(cfg.netDev, &p->props), res, fail);
  p->rankToPeer.assign(cfg.nranks, -1);
  for (int r : cfg.peers) {
    if (r < 0 || r >= cfg.nranks || r == cfg.rank || p->rankToPeer[r] >= 0) {
      MK_WARN("proxy: bad peer list entry %d (rank %d of %d)", r, cfg.rank, cfg.nranks);
      res = ncclInvalidArgument;
      goto fail;
    }
    p->rankToPeer[r] = (int)p->peers.size();
    p->peers.emplace_back();
    p->peers.back().rank = r;
  }
  for (ProxyRing* r : cfg.rings) p->rings.push_back(RingTrack{r, r->done(), {}});
  // Listen once per peer, exchange handles, then connect and accept everything in one
  // loop (connect/accept never block on the peer, so no pairwise ordering is needed).
  sendH.assign((size_t)cfg.nranks * kOobBlock, 0);
  recvH.assign((size_t)cfg.nranks * kOobBlock, 0);
  for (PeerState& ps : p->peers) {
    char* blk = &sendH[(size_t)ps.rank * kOobBlock];
    NCCLCHECKGOTO(net->listen(cfg.netDev, blk, &ps.listenComm), res, fail);
    const PeerInfo info = {kPeerInfoMagic, cfg.bufType == NCCL_PTR_HOST ? 1u : 0u};
    memcpy(blk + kNetHandleSize, &info, sizeof(info));
  }
  if (!p->peers.empty())
    NCCLCHECKGOTO(cfg.alltoall(sendH.data(), recvH.data(), kOobBlock), res, fail);
  for (PeerState& ps : p->peers) {
    PeerInfo info;
    memcpy(&info, &recvH[(size_t)ps.rank * kOobBlock + kNetHandleSize], sizeof(info));
    ps.inlineOk = cfg.bufType == NCCL_PTR_HOST && info.magic == kPeerInfoMagic && info.recvHost;
  }
  deadline = std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
                 .count() +
             cfg.timeoutMs;
  for (;;) {
    bool all = true;
    for (PeerState& ps : p->peers) {
      if (!ps.sendComm)
        NCCLCHECKGOTO(net->connect(cfg.netDev, &recvH[(size_t)ps.rank * kOobBlock], &ps.sendComm),
                      res, fail);
      if (!ps.recvComm) NCCLCHECKGOTO(net->accept(ps.listenComm, &ps.recvComm), res, fail);
      all &= ps.sendComm && ps.recvComm;
    }
    if (all) break;
    if (cfg.abortFlag != nullptr && __atomic_load_n(cfg.abortFlag, __ATOMIC_ACQUIRE) != 0) {
      MK_WARN("proxy rank %d: connection set-up aborted (ncclCommAbort)", cfg.rank);
      res = ncclRemoteError;
      goto fail;
    }
    if (std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now().time_since_epoch())
            .count() > deadline) {
      for (PeerState& ps : p->peers)
        if (!ps.sendComm || !ps.recvComm)
          MK_WARN("proxy rank %d: no connection with peer rank %d after %lld ms", cfg.rank, ps.rank,
                  (long long)cfg.timeoutMs);
      res = ncclRemoteError;
      goto fail;
    }
    usleep(1000);
  }
  for (PeerState& ps : p->peers) {
    ps.sendHdrs.reset(new WireHdr[kMaxInflight]);
    ps.recvHdrs.reset(new WireHdr[kMaxInflight]);
    NCCLCHECKGOTO(net->regMr(ps.sendComm, ps.sendHdrs.get(), sizeof(WireHdr) * kMaxInflight,
                             NCCL_PTR_HOST, &ps.sendHdrMh),
                  res, fail);
    NCCLCHECKGOTO(net->regMr(ps.recvComm, ps.recvHdrs.get(), sizeof(WireHdr) * kMaxInflight,
                             NCCL_PTR_HOST, &ps.recvHdrMh),
                  res, fail);
    if (cfg.sendBytes)
      NCCLCHECKGOTO(net->regMr(ps.sendComm, cfg.sendBuf, cfg.sendBytes, cfg.bufType, &ps.sendMh),
                    res, fail);
    if (cfg.recvBytes)
      NCCLCHECKGOTO(net->regMr(ps.recvComm, cfg.recvBuf, cfg.recvBytes, cfg.bufType, &ps.recvMh),
                    res, fail);
  }
  // A slot only when the comm has several ranks on this host: its proxies are the ones that
  // start together. A comm with one rank per host (a data-parallel group) keeps the near set:
  // with host-wide lock files it could take a free slot, but where they are unusable every
  // such proxy of the host would claim slot 0 and share one core (measured layouts: none).
  if (cfg.pinThread && cfg.hostCount > 1) p->pinSlot = proxyClaimSlot(cfg.hostIndex, cfg.hostCount);
  p->thread = std::thread([p] { p->run(); });
  MK_INFO(kProxy, "proxy rank %d: %zu peer(s) over %s, %zu ring(s)", cfg.rank, p->peers.size(),
          net->name(), cfg.rings.size());
  *out = p;
  return ncclSuccess;
fail:
  proxyDestroy(p);
  return res;
}

ncclResult_t proxyDestroy(Proxy* p) {
  if (!p) return ncclSuccess;
  p->stop.store(true);
  if (p->thread.joinable()) {
    p->thread.join();
    ProxyRecvCalls rc;
    for (PeerState& ps : p->peers) {
      NetRecvCounts n;
      if (!ps.recvComm || !p->cfg.net->recvCounts(ps.recvComm, &n)) continue;
      rc.counted = true;
      rc.calls += n.calls, rc.empty += n.empty, rc.msgs += n.msgs;
    }
    proxyReportTimes(p->cfg.rank, p->times, p->cmds.load(), p->batches.load(), rc);
  }
  if (p->pinSlot >= 0) proxyReleaseSlot(p->pinSlot);
  Net* net = p->cfg.net;
  for (PeerState& ps : p->peers) {
    for (SendBatch* b : ps.sendq) delete b;
    for (RecvBatch* b : ps.recvq) delete b;
    if (ps.sendHdrMh) net->deregMr(ps.sendComm, ps.sendHdrMh);
    if (ps.recvHdrMh) net->deregMr(ps.recvComm, ps.recvHdrMh);
    if (ps.sendMh) net->deregMr(ps.sendComm, ps.sendMh);
    if (ps.recvMh) net->deregMr(ps.recvComm, ps.recvMh);
    if (ps.sendComm) net->closeSend(ps.sendComm);
    if (ps.recvComm) net->closeRecv(ps.recvComm);
    if (ps.listenComm) net->closeListen(ps.listenComm);
  }
  delete p;
  return ncclSuccess;
}

ncclResult_t proxyGetAsyncError(Proxy* p, std::string* msg) {
  std::lock_guard<std::mutex> lk(p->errMu);
  if (msg) *msg = p->errMsg;
  return (ncclResult_t)p->errCode.load();
}

void proxyAbort(Proxy* p) {
  p->stop.store(true);
  for (auto& r : p->rings) r.ring->setAbort();
}

bool proxyAllInline(Proxy* p) {
  for (const PeerState& ps : p->peers)
    if (!ps.inlineOk) return false;
  return true;
}

uint64_t proxyCompleted(Proxy* p, int ring) {
  return p->rings.at(ring).ring->done();
}

ProxyStats proxyStats(Proxy* p) {
  ProxyStats s;
  s.cmds = p->cmds.load();
  s.batches = p->batches.load();
  s.bytesSent = p->bytesSent.load();
  s.bytesRecv = p->bytesRecv.load();
  s.signalsApplied = p->signalsApplied.load();
  return s;
}

}  // namespace mk
