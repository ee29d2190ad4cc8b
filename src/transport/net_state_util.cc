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
  l.hdrOff = take(sizeof(rt::CtlHdr));
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

}  // namespace mk
