// What every collective kernel knows about its comm (CommDev): the symmetric workspaces of
// the local peers, the channel counters in device memory and the comm's wait context (abort
// flag, sticky failure word, error record, deadline: device/rt/err.h). The collectives'
// kernels, the channel toolkit (device/chan.cuh) and fused operators (fused/core/
// fused_comm.h) receive one; the net layer's kernels get their own wait context (NetDev).
#pragma once
#include <cstddef>
#include <cstdint>

#include "comm/workspace.h"
#include "device/rt/err.h"

namespace mk {

// The comm's device state, in device memory of comm->cudaDev (zeroed at init, never reset
// by the host): the control header of its wait context, then uint64_t
// sendCnt[kMaxLocalRanks * kMaxLanes] and recvCnt[...] (channel message counters, indexed
// [peer local index * kMaxLanes + lane]), then seq[kDevSeqSlots] (fused operators' call
// counters, fused/core/fused_dev.cuh).
constexpr int kDevSeqSlots = 16;
inline size_t devStateBytes() {
  return sizeof(rt::CtlHdr) + sizeof(uint64_t) * (2 * kMaxLocalRanks * kMaxLanes + kDevSeqSlots);
}

// What every kernel needs to know about its comm.
struct CommDev {
  rt::WaitCtx w;       // abort flag, failure word + opCount (DevState), error record, deadline
  void* const* peers;  // [nLocal] workspace of every local rank (peerMem->peersDev)
  uint64_t* sendCnt;   // [kMaxLocalRanks * kMaxLanes]: messages sent to (peer, lane)
  uint64_t* recvCnt;   // [kMaxLocalRanks * kMaxLanes]: messages received
  WsLayout ws;
  int me;      // local index of this rank
  int nLocal;  // local ranks: the peers of the channels (other nodes go through NetDev)
};

}  // namespace mk
