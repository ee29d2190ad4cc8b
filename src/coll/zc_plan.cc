// Zero-copy decision for one collective (coll/zc_plan.h).
#include "coll/zc_plan.h"

#include <atomic>
#include <cstdint>
#include <vector>

#include "base/can_implement.h"
#include "base/checks.h"
#include "base/param.h"
#include "coll/algo.h"
#include "coll/coll_state.h"
#include "coll/launch_plan.h"
#include "comm/comm.h"
#include "transport/peer_mem.h"
#include "transport/peer_mem_win.h"

namespace mk {
namespace {

std::atomic<uint64_t> gTaken[(int)CollType::kCount];

}  // namespace

void zcCount(CollType t) {
  if ((int)t >= 0 && (int)t < (int)CollType::kCount) gTaken[(int)t].fetch_add(1);
}

const char* zcModeName(int mode) {
  return mode == kZcWindow ? " (window)" : mode == kZcMapped ? " (mapped)" : " (raw)";
}

uint64_t zcTakenCount(CollType t) {
  return (int)t >= 0 && (int)t < (int)CollType::kCount ? gTaken[(int)t].load() : 0;
}

ZcRemote zcRemoteOf(const CollArgs& a, int n) {
  ZcRemote r;
  const uint64_t B = (uint64_t)a.count * dtypeSize(a.dtype);
  const uint64_t nB = (uint64_t)n * B;
  switch (a.type) {
    case CollType::kAllReduce:  // rank q reads segment q of every input, writes every output
      r.send = r.recv = true;
      r.sendBytes = r.recvBytes = r.msgBytes = B;
      break;
    case CollType::kReduceScatter:  // rank q reads block q of every input
      r.send = true;
      r.sendBytes = r.msgBytes = nB;
      break;
    case CollType::kAllGather:  // every rank pulls every input
    case CollType::kReduce:     // the root pulls every input
    case CollType::kGather:
      r.send = true;
      r.sendBytes = B;
      r.msgBytes = a.type == CollType::kReduce ? B : nB;
      break;
    case CollType::kAlltoAll:
      // In place, a rank would overwrite blocks its peers are still reading.
      if (overlaps(a.sendbuff, nB, a.recvbuff, nB)) break;
      r.send = true;
      r.sendBytes = r.msgBytes = nB;
      break;
    case CollType::kBroadcast:  // the root pushes into every output
    case CollType::kScatter:
      r.recv = true;
      r.recvBytes = B;
      r.msgBytes = a.type == CollType::kBroadcast ? B : nB;
      break;
    default:  // Send/Recv: see docs/collectives.md
      break;
  }
  return r;
}

bool zcSizeAllows(uint64_t msgBytes, int n) {
  const Algo forced = collForcedAlgo();
  if (n > kZcMaxMapped || MK_PARAM_INT(RegZeroCopy) == 0) return false;
  return forced == Algo::kZeroCopy || (forced == Algo::kAuto && msgBytes >= kZeroCopyMinBytes);
}

ncclResult_t zcPlan(ncclComm* comm, const CollArgs& a, ZcPlan* out) {
  *out = ZcPlan{};
  CollState* cs = comm->coll;
  const int n = cs->ws.nLocal;
  if (cs->interNode || comm->nRanks < 2 || n != comm->nRanks || n > kZcMaxMapped)
    return ncclSuccess;
  const Algo forced = collForcedAlgo();
  if (forced != Algo::kAuto && forced != Algo::kZeroCopy) return ncclSuccess;
  const bool force = forced == Algo::kZeroCopy;
  if (MK_PARAM_INT(RegZeroCopy) == 0) return ncclSuccess;
  const ZcRemote rm = zcRemoteOf(a, n);
  if ((!rm.send && !rm.recv) || rm.msgBytes == 0) return ncclSuccess;
  ZcBufs& z = out->bufs;
  auto fill = [](uint64_t* dst, const std::vector<void*>& p) {
    for (size_t q = 0; q < p.size() && q < (size_t)kZcMaxMapped; q++)
      dst[q] = reinterpret_cast<uint64_t>(p[q]);
  };

  if (zcSizeAllows(rm.msgBytes, n)) {
    // 1. Windows: the peers' windows are mapped already; offsets travel on the device.
    std::vector<void*> sb, rb;
    if ((!rm.send || peerMemWinFind(comm, a.sendbuff, rm.sendBytes, &z.sendKey, &z.sendOff, &sb)) &&
        (!rm.recv || peerMemWinFind(comm, a.recvbuff, rm.recvBytes, &z.recvKey, &z.recvOff, &rb))) {
      z.mode = kZcWindow;
      fill(z.send, sb);
      fill(z.recv, rb);
      out->on = true;
      return ncclSuccess;
    }
    z = ZcBufs{};
    // 2. One process, one GPU: raw pointers through the handshake. ReduceScatter and
    //    AllGather on any buffers, as the AllReduce (planReduction): peers only read them,
    //    and the handshake's end keeps each rank's kernel until its peers are done, so nothing
    //    needs registering; the staged paths moved 1.4x the bytes on 16 CTAs a rank (the 8192^2
    //    bf16 ReduceScatter of 4 ranks on the H200: 0.82 ms against the AllReduce's 0.42).
    //    The other collectives on registered buffers.
    const bool anyBuffer = a.type == CollType::kReduceScatter || a.type == CollType::kAllGather;
    if (cs->zeroCopy &&
        (anyBuffer || ((!rm.send || peerMemIsRegistered(comm, a.sendbuff, rm.sendBytes)) &&
                       (!rm.recv || peerMemIsRegistered(comm, a.recvbuff, rm.recvBytes))))) {
      z.mode = kZcRaw;
      out->on = true;
      return ncclSuccess;
    }
  }
  // 3. Separate processes: map the registered buffers (collective: the same lookups on
  //    every rank, send before receive; the result is agreed). The lookup is a host barrier
  //    (a bootstrap allgather) per buffer and call, so it is entered only when this rank's
  //    own remote buffers are registered: a local decision that agrees across ranks under
  //    NCCL's rule, like steps 1 and 2. Unregistered buffers (framework scratch, nccl-tests
  //    without -R) stage at once; before, each such call of 4 MiB or more paid the barrier
  //    to learn that nobody could map them. A rank that breaks the rule blocks in the
  //    lookup while its peers stage: both end in a timeout error, never wrong data.
  if (!cs->sepProcs || (!force && rm.msgBytes < kRegZeroCopyMinBytes)) return ncclSuccess;
  if ((rm.send && !peerMemIsRegistered(comm, a.sendbuff, rm.sendBytes)) ||
      (rm.recv && !peerMemIsRegistered(comm, a.recvbuff, rm.recvBytes)))
    return ncclSuccess;
  bool ok = true;
  std::vector<void*> sp, rp;
  if (rm.send) NCCLCHECK(peerMemLookup(comm, a.sendbuff, rm.sendBytes, &ok, &sp));
  if (ok && rm.recv) NCCLCHECK(peerMemLookup(comm, a.recvbuff, rm.recvBytes, &ok, &rp));
  if (!ok || (rm.send && (int)sp.size() != n) || (rm.recv && (int)rp.size() != n))
    return ncclSuccess;
  z.mode = kZcMapped;
  fill(z.send, sp);
  fill(z.recv, rp);
  out->on = true;
  return ncclSuccess;
}

}  // namespace mk
