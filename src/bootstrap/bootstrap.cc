// Bootstrap API: unique id, init (root rendezvous + address allgather), split, collectives.
#include "bootstrap/bootstrap.h"

#include <cstdint>
#include <string>
#include <cstring>
#include <set>
#include <vector>

#include "bootstrap/bootstrap_impl.h"
#include "bootstrap/ifaces.h"
#include "bootstrap/root.h"
#include "bootstrap/unique_id.h"
#include "base/checks.h"
#include "base/debug.h"
#include "base/param.h"

namespace mk {
namespace {

// NCCL_COMM_ID ids must come out the same in every process, so their "secret" is derived from
// the address alone: it only keeps unrelated jobs that reuse the port apart.
uint64_t commIdSecret(const SocketAddress& addr) {
  SocketWireAddress w;
  socketAddressToWire(&addr, &w);
  return bootstrapHash(w.bytes, sizeof(w.bytes), 0x4e43434c5f434f4dull /* "NCCL_COM" */);
}

ncclResult_t checkPeer(const Bootstrap* b, int peer, const char* what) {
  MK_ARGCHECK(b != nullptr, "%s: null bootstrap", what);
  MK_ARGCHECK(peer >= 0 && peer < b->nranks, "%s: peer %d out of range [0, %d)", what, peer,
              b->nranks);
  return ncclSuccess;
}

ncclResult_t addressesFromWire(Bootstrap* b, const std::vector<SocketWireAddress>& wire) {
  for (int i = 0; i < b->nranks; i++) {
    if (socketAddressFromWire(&wire[i], &b->peers[i]) != ncclSuccess) {
      MK_WARN("Bootstrap rank %d: invalid address received for rank %d", b->rank, i);
      return ncclRemoteError;
    }
  }
  return ncclSuccess;
}

}  // namespace

ncclResult_t bootstrapGetUniqueId(ncclUniqueId* out) {
  MK_ARGCHECK(out != nullptr, "ncclGetUniqueId: uniqueId is null");
  BootstrapId id;
  const char* commId = MK_PARAM_STR(CommId);
  if (*commId != '\0') {
    if (socketAddressFromString(commId, &id.root) != ncclSuccess ||
        socketAddressPort(&id.root) == 0) {
      MK_WARN(
          "Invalid NCCL_COMM_ID '%s': use <ipv4>:<port>, [<ipv6>]:<port> or "
          "<hostname>:<port> with a non-zero port",
          commId);
      return ncclInvalidArgument;
    }
    id.flags = kBootstrapIdFlagCommId;
    id.secret = commIdSecret(id.root);
  } else {
    NCCLCHECK(bootstrapRandom(&id.secret, sizeof(id.secret)));
    SocketAddress local;
    std::string ifName;
    NCCLCHECK(ifBootstrapAddress(&local, &ifName));
    NCCLCHECK(bootstrapRootStart(id.secret, &local, &id.root));
    MK_INFO(kBootstrap | kInit, "Bootstrap: unique id uses interface %s", ifName.c_str());
  }
  bootstrapIdEncode(id, out);
  return ncclSuccess;
}

ncclResult_t bootstrapInit(const ncclUniqueId* ids, int nIds, int rank, int nranks,
                           const uint32_t* abortFlag, Bootstrap** out) {
  MK_ARGCHECK(out != nullptr && ids != nullptr, "bootstrapInit: null argument");
  *out = nullptr;
  MK_ARGCHECK(nranks >= 1 && nranks <= kBootstrapMaxRanks, "Invalid nranks %d (1..%d)", nranks,
              kBootstrapMaxRanks);
  MK_ARGCHECK(rank >= 0 && rank < nranks, "Invalid rank %d for nranks %d", rank, nranks);
  MK_ARGCHECK(nIds >= 1 && nIds <= nranks, "Invalid number of unique ids %d (1..nranks=%d)", nIds,
              nranks);
  std::vector<BootstrapId> dec(nIds);
  for (int i = 0; i < nIds; i++) NCCLCHECK(bootstrapIdDecode(&ids[i], &dec[i]));
  bool allSame = true;
  for (int i = 1; i < nIds && allSame; i++) allSame = memcmp(&ids[i], &ids[0], sizeof(ids[0])) == 0;
  if (nIds > 1 && allSame && (dec[0].flags & kBootstrapIdFlagCommId)) {
    // NCCL_COMM_ID names one root; every "id" is that root.
    nIds = 1;
    dec.resize(1);
  }
  std::set<uint64_t> secrets;
  for (auto& d : dec)
    MK_ARGCHECK(secrets.insert(d.secret).second,
                "bootstrapInit: the same unique id is given twice among the %d ids", nIds);
  uint64_t secret = dec[0].secret;
  if (nIds > 1) {
    std::vector<uint64_t> all;
    for (auto& d : dec) all.push_back(d.secret);
    secret = bootstrapHash(all.data(), all.size() * sizeof(uint64_t), 1);
  }
  uint64_t commHash = bootstrapHash(ids, (size_t)nIds * sizeof(ncclUniqueId), (uint64_t)nranks);

  int g = bootstrapRootOfRank(rank, nranks, nIds);
  if ((dec[g].flags & kBootstrapIdFlagCommId) &&
      rank == bootstrapFirstRankOfRoot(g, nranks, nIds)) {
    SocketAddress bound;
    if (bootstrapRootStart(dec[g].secret, &dec[g].root, &bound) != ncclSuccess) {
      char buf[kSocketAddrStrLen];
      MK_WARN(
          "Bootstrap rank %d: cannot start the root on NCCL_COMM_ID %s: the address must be "
          "local to rank %d and the port free",
          rank, socketAddressToString(&dec[g].root, buf, sizeof(buf)), rank);
      return ncclSystemError;
    }
  }

  // Where this process made an id (and runs its root), the root now knows what to expect and
  // refuses any other claim, such as a hello announcing millions of ranks.
  for (int k = 0; k < nIds; k++) bootstrapRootExpect(dec[k].secret, nranks, nIds, k);

  ncclResult_t res = ncclSuccess;
  Bootstrap* b = nullptr;
  SocketAddress next;
  std::vector<SocketWireAddress> wire;
  NCCLCHECKGOTO(bootstrapCreate(rank, nranks, secret, commHash, abortFlag, &b), res, fail);
  NCCLCHECKGOTO(bootstrapRootRendezvous(dec.data(), nIds, rank, nranks, &b->listen.addr, abortFlag,
                                        b->timeoutMs, &next),
                res, fail);
  // The root is done with us; if it runs in this process, do not leave its thread behind.
  bootstrapRootJoin(dec[g].secret);
  b->peers[(rank + 1) % nranks] = next;
  try {
    wire.resize(nranks);
  } catch (const std::bad_alloc&) {
    res = ncclSystemError;
    goto fail;
  }
  socketAddressToWire(&b->listen.addr, &wire[rank]);
  NCCLCHECKGOTO(bootstrapRingAllGather(b, nullptr, nranks, rank, kKindInitAddrs, 0, wire.data(),
                                       sizeof(SocketWireAddress)),
                res, fail);
  NCCLCHECKGOTO(addressesFromWire(b, wire), res, fail);
  MK_INFO(kBootstrap | kInit, "Bootstrap rank %d/%d ready (%d root%s)", rank, nranks, nIds,
          nIds > 1 ? "s" : "");
  *out = b;
  return ncclSuccess;
fail:
  bootstrapClose(b);
  bootstrapRootsReap();
  return res;
}

ncclResult_t bootstrapSplit(Bootstrap* parent, const int* members, int nMembers, int myIndex,
                            uint64_t tag, const uint32_t* abortFlag, Bootstrap** out) {
  MK_ARGCHECK(parent != nullptr && members != nullptr && out != nullptr,
              "bootstrapSplit: null argument");
  *out = nullptr;
  MK_ARGCHECK(nMembers >= 1 && nMembers <= parent->nranks,
              "bootstrapSplit: %d members for %d "
              "ranks",
              nMembers, parent->nranks);
  MK_ARGCHECK(myIndex >= 0 && myIndex < nMembers && members[myIndex] == parent->rank,
              "bootstrapSplit: members[%d] is not the calling rank %d", myIndex, parent->rank);
  std::vector<uint8_t> seen(parent->nranks, 0);
  for (int i = 0; i < nMembers; i++) {
    int m = members[i];
    MK_ARGCHECK(m >= 0 && m < parent->nranks && !seen[m],
                "bootstrapSplit: member %d (rank %d) is out of range or repeated", i, m);
    seen[m] = 1;
  }
  // Identity of the child: a function of the parent, the tag and the member list, so every
  // member derives the same one without talking, and concurrent splits differ.
  uint64_t h = bootstrapHash(members, (size_t)nMembers * sizeof(int), parent->commHash ^ tag);
  uint64_t secret = bootstrapHash(&parent->secret, sizeof(parent->secret), h);
  uint64_t commHash = bootstrapHash(&tag, sizeof(tag), h ^ 0x73706c6974ull /* "split" */);

  ncclResult_t res = ncclSuccess;
  Bootstrap* b = nullptr;
  std::vector<SocketWireAddress> wire;
  NCCLCHECKGOTO(bootstrapCreate(myIndex, nMembers, secret, commHash, abortFlag, &b), res, fail);
  try {
    wire.resize(nMembers);
  } catch (const std::bad_alloc&) {
    res = ncclSystemError;
    goto fail;
  }
  socketAddressToWire(&b->listen.addr, &wire[myIndex]);
  NCCLCHECKGOTO(bootstrapRingAllGather(parent, members, nMembers, myIndex, kKindSplit, tag,
                                       wire.data(), sizeof(SocketWireAddress), abortFlag),
                res, fail);
  NCCLCHECKGOTO(addressesFromWire(b, wire), res, fail);
  *out = b;
  return ncclSuccess;
fail:
  bootstrapClose(b);
  return res;
}

ncclResult_t bootstrapRingAllGather(Bootstrap* b, const int* ranks, int n, int me, uint32_t kind,
                                    uint64_t tag, void* data, size_t bytesPerRank,
                                    const uint32_t* extraAbort) {
  if (n <= 1) return ncclSuccess;
  char* d = static_cast<char*>(data);
  int next = (me + 1) % n, prev = (me + n - 1) % n;
  if (ranks != nullptr) {
    next = ranks[next];
    prev = ranks[prev];
  }
  // Step s forwards the slice received at step s-1 (our own at s=0).
  for (int s = 0; s < n - 1; s++) {
    size_t sendSlot = (size_t)((me - s + n) % n), recvSlot = (size_t)((me - s - 1 + n) % n);
    NCCLCHECK(bootstrapSendMsg(b, next, kind, tag, (uint32_t)s, d + sendSlot * bytesPerRank,
                               bytesPerRank, extraAbort));
    NCCLCHECK(bootstrapRecvMsg(b, prev, kind, tag, (uint32_t)s, d + recvSlot * bytesPerRank,
                               bytesPerRank, extraAbort));
  }
  return ncclSuccess;
}

ncclResult_t bootstrapAllGather(Bootstrap* b, void* data, size_t bytesPerRank) {
  MK_ARGCHECK(b != nullptr, "bootstrapAllGather: null bootstrap");
  MK_ARGCHECK(data != nullptr || bytesPerRank == 0, "bootstrapAllGather: null data");
  uint64_t seq = ++b->agSeq;
  return bootstrapRingAllGather(b, nullptr, b->nranks, b->rank, kKindAllGather, seq, data,
                                bytesPerRank);
}

ncclResult_t bootstrapBarrier(Bootstrap* b) {
  MK_ARGCHECK(b != nullptr, "bootstrapBarrier: null bootstrap");
  // Dissemination barrier: after round k every rank has heard, directly or not, from the 2^(k+1)
  // ranks before it; log2(n) rounds instead of the n-1 steps of a ring.
  uint64_t seq = ++b->barrierSeq;
  int n = b->nranks;
  uint32_t round = 0;
  for (int dist = 1; dist < n; dist <<= 1, round++) {
    NCCLCHECK(bootstrapSendMsg(b, (b->rank + dist) % n, kKindBarrier, seq, round, nullptr, 0));
    NCCLCHECK(bootstrapRecvMsg(b, (b->rank - dist + n) % n, kKindBarrier, seq, round, nullptr, 0));
  }
  return ncclSuccess;
}

ncclResult_t bootstrapSend(Bootstrap* b, int peer, int tag, const void* data, size_t size) {
  NCCLCHECK(checkPeer(b, peer, "bootstrapSend"));
  MK_ARGCHECK(data != nullptr || size == 0, "bootstrapSend: null data");
  return bootstrapSendMsg(b, peer, kKindUser, (uint64_t)(int64_t)tag, 0, data, size);
}

ncclResult_t bootstrapRecv(Bootstrap* b, int peer, int tag, void* data, size_t size) {
  NCCLCHECK(checkPeer(b, peer, "bootstrapRecv"));
  MK_ARGCHECK(data != nullptr || size == 0, "bootstrapRecv: null data");
  return bootstrapRecvMsg(b, peer, kKindUser, (uint64_t)(int64_t)tag, 0, data, size);
}

int bootstrapRank(const Bootstrap* b) {
  return b ? b->rank : -1;
}
int bootstrapNRanks(const Bootstrap* b) {
  return b ? b->nranks : 0;
}

}  // namespace mk
