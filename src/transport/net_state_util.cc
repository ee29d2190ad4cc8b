// Pure host logic of the inter-node state: window layout, peer routing, the bootstrap
// all-to-all the proxy connects with, and the text of device-side error records.
#include <cstdint>
#include <string>
#include <vector>
#include <cstdio>

#include "bootstrap/bootstrap.h"
#include "base/checks.h"
#include "base/param.h"
#include "transport/net_state_impl.h"
#include "transport/proxy_ring.h"

namespace mk {

namespace {
uint64_t roundUp(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}
uint64_t floorPow2(uint64_t v) {
  uint64_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}
}  // namespace

uint64_t netWindowBytes() {
  int64_t v = MK_PARAM_INT(NetWindowBytes);
  return v > 0 ? (uint64_t)v : 0;
}

ncclResult_t netLayout(uint64_t windowBytes, NetLayout* out) {
  const uint64_t kMin = 64 << 10;
  windowBytes = windowBytes / 4096 * 4096;
  MK_ARGCHECK(windowBytes >= kMin,
              "inter-node windows: %llu bytes is too small (MKERNEL_WORKSPACE_BYTES must be at "
              "least %llu)",
              (unsigned long long)windowBytes, (unsigned long long)kMin);
  NetLayout l{};
  l.windowBytes = windowBytes;
  l.sendUser = windowBytes;
  // Staging slots: big enough that one command carries a useful message (up to 1 MiB,
  // the sweet spot of the socket backend's striping), and at least 4 of them so that a
  // CTA copies the next chunk while the proxy still sends the previous ones.
  uint64_t chunk = floorPow2(windowBytes / 32);
  if (chunk < kMin) chunk = kMin;
  if (chunk > (1 << 20)) chunk = 1 << 20;
  uint64_t stage = windowBytes / 2;
  if (stage < 4 * chunk) stage = 4 * chunk;
  uint64_t slots = stage / chunk;
  if (slots > 256) slots = 256;
  l.stageChunk = chunk;
  l.stageSlots = (uint32_t)slots;
  l.sendBytes = l.sendUser + chunk * slots;
  l.sigBytes = roundUp(sizeof(uint64_t) * kNetSignals, 4096);
  l.localBytes = l.sigBytes + windowBytes;
  *out = l;
  return ncclSuccess;
}

std::vector<int> netProxyPeers(const Topo& topo, int rank, int nRanks, bool p2pOk) {
  std::vector<int> peers;
  for (int r = 0; r < nRanks; r++) {
    if (r == rank) continue;
    bool sameNode = topo.rankToNode[r] == topo.rankToNode[rank];
    if (!sameNode || !p2pOk) peers.push_back(r);
  }
  return peers;
}

std::vector<int> netPeerLocal(const Topo& topo, int rank, int nRanks, bool p2pOk) {
  std::vector<int> local(nRanks, -1);
  for (int r = 0; r < nRanks; r++) {
    bool sameNode = topo.rankToNode[r] == topo.rankToNode[rank];
    if (r == rank || (sameNode && p2pOk)) local[r] = topo.rankToLocalRank[r];
  }
  return local;
}

NetCtlLayout netCtlLayout(uint32_t stageSlots, int nRanks, int nLocal) {
  NetCtlLayout l{};
  size_t off = 0;
  auto take = [&](size_t bytes) {
    size_t at = off;
    off = roundUp(off + bytes, 64);
    return at;
  };
  l.hdrOff = take(sizeof(DevStateHdr));
  l.stageNextOff = take(sizeof(uint64_t));
  l.stagePubOff = take(sizeof(uint64_t) * stageSlots);
  l.stageTicketOff = take(sizeof(uint64_t) * stageSlots);
  l.peerLocalOff = take(sizeof(int) * nRanks);
  l.localWinsOff = take(sizeof(void*) * nLocal);
  l.bytes = off;
  return l;
}

ncclResult_t netBootstrapAllToAll(Bootstrap* b, const std::vector<int>& peers, int tag,
                                  const void* sendbuf, void* recvbuf, size_t bytes) {
  // Sends never wait for the matching receive (the bootstrap queues messages by peer and
  // tag), so posting every send first cannot deadlock.
  for (int p : peers)
    NCCLCHECK(
        bootstrapSend(b, p, tag, static_cast<const char*>(sendbuf) + (size_t)p * bytes, bytes));
  for (int p : peers)
    NCCLCHECK(bootstrapRecv(b, p, tag, static_cast<char*>(recvbuf) + (size_t)p * bytes, bytes));
  return ncclSuccess;
}

namespace {
const char* opName(int op) {
  switch (op) {
    case kNetOpPut:
      return "put";
    case kNetOpPutSignal:
      return "put_signal";
    case kNetOpSignal:
      return "signal";
    case kNetOpWaitSignal:
      return "wait_signal";
    case kNetOpQuiet:
      return "quiet";
    default:
      return "device net operation";
  }
}
const char* waitName(int w) {
  switch (w) {
    case kNetWaitSignal:
      return "the signal";
    case kNetWaitRing:
      return "a free slot in the proxy command ring";
    case kNetWaitStage:
      return "a free staging slot (the proxy was still sending its data)";
    case kNetWaitQuiet:
      return "the proxy to complete the commands issued so far";
    default:
      return "nothing";
  }
}
}  // namespace

std::string netDescribeRecord(const ErrRecord& e, int rank, const std::string& proxyMsg,
                              int64_t timeoutMs, ncclResult_t* res) {
  char m[768];
  const char* op = opName(e.coll);
  char who[64];
  if (e.peer >= 0)
    snprintf(who, sizeof(who), "rank %d", e.peer);
  else
    snprintf(who, sizeof(who), "the peer");
  if (e.code == kNetErrArgs) {
    *res = ncclInvalidUsage;
    if (e.waitSend == kNetWaitNone && e.coll == kNetOpWaitSignal)
      snprintf(m, sizeof(m), "rank %d: %s: signal slot %d out of range (%u slots)", rank, op,
               e.slot, kNetSignals);
    else
      // Argument records carry dst_offset in seq and the byte count in waitedNs.
      snprintf(m, sizeof(m),
               "rank %d: %s to rank %d (CTA %d): bad arguments (peer out of range, dst_offset "
               "%llu + %llu bytes beyond the window, or signal slot %d >= %u)",
               rank, op, e.peer, e.lane, (unsigned long long)e.seq, (unsigned long long)e.waitedNs,
               e.slot, kNetSignals);
  } else if (e.code == kErrTimeout) {
    *res = ncclRemoteError;
    if (e.waitSend == kNetWaitSignal)
      snprintf(m, sizeof(m),
               "rank %d: wait_signal (CTA %d) timed out after %.3f s: signal slot %d never "
               "reached %llu; %s did not send it or failed (MKERNEL_TIMEOUT_MS=%lld)",
               rank, e.lane, (double)e.waitedNs * 1e-9, e.slot, (unsigned long long)e.seq, who,
               (long long)timeoutMs);
    else
      snprintf(m, sizeof(m),
               "rank %d: %s to %s (CTA %d) timed out after %.3f s waiting for %s; the proxy or "
               "the connection to %s is stalled (MKERNEL_TIMEOUT_MS=%lld)",
               rank, op, who, e.lane, (double)e.waitedNs * 1e-9, waitName(e.waitSend), who,
               (long long)timeoutMs);
  } else if (e.code == kErrAbort) {
    *res = ncclSystemError;
    snprintf(m, sizeof(m), "rank %d: %s (%s, CTA %d) aborted (ncclCommAbort) while waiting for %s",
             rank, op, who, e.lane, waitName(e.waitSend));
  } else if (e.code == kNetErrProxy) {
    *res = ncclRemoteError;
    snprintf(m, sizeof(m), "rank %d: %s (%s, CTA %d) failed: the proxy stopped (%s)", rank, op, who,
             e.lane, proxyMsg.empty() ? "comm aborted" : proxyMsg.c_str());
  } else {
    *res = ncclSystemError;
    snprintf(m, sizeof(m), "rank %d: %s (%s) failed with device error %u", rank, op, who, e.code);
  }
  return m;
}

}  // namespace mk
