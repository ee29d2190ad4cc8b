// The MoE kernels' slot ranking (device only): one warp walks the routing slots in order, 32
// at a time; lanes holding the same expert rank themselves by lane (match.any), so a slot's
// index among the earlier slots of its expert is stable and the packed layout deterministic.
#pragma once
#include <cstdint>

namespace mk {
namespace fused {

// For every slot i < slots: out[i] = place(e, k) where e = topkIdx[i] (an id in [0, experts))
// and k = the slots of expert e before i; -1 for unused or bad ids. `seen` ([experts], zeroed
// by the caller) ends holding each expert's slot count. Called by one whole warp.
template <class Place>
__device__ __forceinline__ void moeRankSlots(const int32_t* topkIdx, int64_t slots, int32_t experts,
                                             int32_t* seen, int32_t* out, Place place) {
  const int lane = threadIdx.x & 31;
  for (int64_t b = 0; b < slots; b += 32) {
    const int64_t i = b + lane;
    int32_t e = i < slots ? topkIdx[i] : -1;
    if (e < 0 || e >= experts) e = -1;
    const uint32_t same = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(same & ((1u << lane) - 1));
    const int32_t row = e >= 0 ? place(e, seen[e] + rank) : -1;
    __syncwarp();
    if (e >= 0 && rank == 0) seen[e] += __popc(same);
    __syncwarp();
    if (i < slots) out[i] = row;
  }
}

// The CTA's histogram of routed slots per expert: hist[e] += slots with id e (hist zeroed and
// the CTA synchronised by the caller). A bad id (not -1, outside [0, experts)) counts as an
// unused slot on every rank, so the exchange stays consistent; the first one is kept in
// *badSlot as slot + 1 (atomicMin; the caller presets ~0) and reported at the end of the call.
__device__ __forceinline__ void moeCountSlots(const int32_t* topkIdx, int64_t slots,
                                              int32_t experts, int32_t* hist,
                                              unsigned long long* badSlot) {
  for (int64_t i = threadIdx.x; i < slots; i += blockDim.x) {
    const int32_t e = topkIdx[i];
    if (e == -1) continue;
    if (e < 0 || e >= experts) {
      atomicMin(badSlot, (unsigned long long)i + 1);
      continue;
    }
    atomicAdd(&hist[e], 1);
  }
}

}  // namespace fused
}  // namespace mk
