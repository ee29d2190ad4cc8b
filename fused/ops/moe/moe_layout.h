// Routing arithmetic of the MoE operators (issue 13), shared by host code, tests and device
// kernels (__host__ __device__, no CUDA calls): which rank owns an expert, how many rows a rank
// sends to each destination expert, and the packed layout a rank receives its experts' rows in.
//
// Packed layout (the input of the grouped GEMM, gemm::GemmArgs::groups): local expert e owns
// rows [start[e], start[e] + count[e]); start[e] is a multiple of the GEMM's row tile and the
// rows up to the next multiple are padding, which the grouped GEMM may overwrite. Inside an
// expert, the rows of source rank 0 come first, then rank 1's, ...; inside a source, its tokens
// in token order (slot order for a token routed twice to one expert). The layout is a function
// of the counts alone, so every rank computes the same offsets from exchanged counts, with no
// host synchronisation.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>  // __host__ __device__

namespace mk {
namespace fused {

struct MoeShape {
  int32_t tokens;          // T: tokens of this rank
  int32_t topk;            // k: routing slots per token
  int32_t experts;         // E: experts of the layer
  int32_t nRanks;          // ranks of the comm
  int32_t expertsPerRank;  // E / nRanks (E % nRanks == 0)
};

__host__ __device__ inline int32_t moeOwner(const MoeShape& s, int32_t expert) {
  return expert / s.expertsPerRank;
}

// counts[r * expertsPerRank + e] = rows this rank sends to local expert e of rank r: one per
// routing slot with an expert id in [0, E); -1 marks an unused slot. False if a slot holds any
// other value (the caller reports the token and slot: *badSlot = t * k + j).
__host__ __device__ inline bool moeSendCounts(const MoeShape& s, const int32_t* topkIdx,
                                              int32_t* counts, int64_t* badSlot) {
  for (int32_t i = 0; i < s.nRanks * s.expertsPerRank; ++i) counts[i] = 0;
  const int64_t slots = (int64_t)s.tokens * s.topk;
  for (int64_t i = 0; i < slots; ++i) {
    const int32_t e = topkIdx[i];
    if (e == -1) continue;
    if (e < 0 || e >= s.experts) {
      *badSlot = i;
      return false;
    }
    ++counts[e];  // expert e is local expert e % epr of rank e / epr: the same flat index
  }
  return true;
}

// The receiving side's layout from recv[src * expertsPerRank + e] (rows source src sends to this
// rank's local expert e): start[e], count[e], and srcRow[src * expertsPerRank + e], the first
// row of src's rows of expert e. Returns the rows the layout spans (padding included), which
// the caller compares with its capacity (overflow is reported, never truncated).
__host__ __device__ inline int64_t moeRecvLayout(const MoeShape& s, const int32_t* recv,
                                                 int32_t tileRows, int32_t* start, int32_t* count,
                                                 int32_t* srcRow) {
  int64_t row = 0;
  for (int32_t e = 0; e < s.expertsPerRank; ++e) {
    start[e] = (int32_t)row;
    int64_t n = 0;
    for (int32_t src = 0; src < s.nRanks; ++src) {
      srcRow[src * s.expertsPerRank + e] = (int32_t)(row + n);
      n += recv[src * s.expertsPerRank + e];
    }
    count[e] = (int32_t)n;
    row += (n + tileRows - 1) / tileRows * tileRows;
  }
  return row;
}

// Where slot i (= t * k + j) of this rank lands at its destination: the row inside the
// destination's layout, given srcRowAtDst[r * expertsPerRank + e] = the destination r's srcRow
// entry for this rank and expert e. `seen` ([nRanks * expertsPerRank], zeroed by the caller) counts
// the slots already placed; call in slot order. -1 for an unused slot.
__host__ __device__ inline int64_t moeSlotRow(const MoeShape& s, const int32_t* topkIdx, int64_t i,
                                              const int32_t* srcRowAtDst, int32_t* seen) {
  const int32_t e = topkIdx[i];
  if (e < 0) return -1;
  return (int64_t)srcRowAtDst[e] + seen[e]++;
}

}  // namespace fused
}  // namespace mk
