// Addresses in the collectives' symmetric workspaces (layout: comm/workspace.h) and the
// bounded wait on a peer's channel flag, as the collective kernels use them.
#pragma once
#include <cstdint>

#include "comm/comm_dev.h"
#include "device/rt/wait.cuh"

namespace mk {
namespace dev {

// ws = base pointer of the workspace that holds them.
__device__ __forceinline__ uint64_t* readyFlag(void* ws, const WsLayout& w, int src, int lane,
                                               int slot) {
  return (uint64_t*)((char*)ws + wsReadyOffset(w, src, lane, slot));
}
__device__ __forceinline__ uint64_t* consumedFlag(void* ws, const WsLayout& w, int src, int lane,
                                                  int slot) {
  return (uint64_t*)((char*)ws + wsConsumedOffset(w, src, lane, slot));
}
__device__ __forceinline__ char* slotData(void* ws, const WsLayout& w, int src, int lane,
                                          int slot) {
  return (char*)ws + wsDataOffset(w, src, lane, slot);
}

// Waits until the flag of local peer `peer` reaches target: its message (slotFree false) or
// the slot it freed for ours (slotFree true). False once the comm failed (recorded).
__device__ __forceinline__ bool waitPeer(const CommDev& c, const uint64_t* flag, uint64_t target,
                                         int peer, int coll, int lane, int slot, bool slotFree) {
  return rt::waitGe(c.w, flag, target,
                    rt::ErrSite{coll, peer, lane, slot, slotFree ? rt::kWaitSlot : rt::kWaitData,
                                rt::kErrPeerLocal});
}

}  // namespace dev
}  // namespace mk
