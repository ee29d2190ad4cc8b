// Shared by the MoE AllToAll path's kernels (a2a.cu, a2a_node.cu): their parameters, the
// count message's entries and the receiving layout every kernel derives from the received
// counts. Device code and kernel parameters only; moeA2aRun (a2a.cu) fills and launches.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "device/rt/wait.cuh"
#include "fused/core/fused_comm.h"
#include "fused/gemm/gemm.h"
#include "fused/ops/moe/moe.h"
#include "fused/ops/moe/moe_layout.h"

namespace mk {
namespace fused {

constexpr int kA2aThreads = 256;
constexpr int kA2aWarps = kA2aThreads / 32;
constexpr int kA2aMaxLocalExperts = gemm::kMaxGroups;
static_assert(NCCL_MOE_MAX_TOPK <= 32, "the rows kernel gives each slot of a token a lane");
// ErrRecord::slot of the "maxRows differs" record (err_host.cc names the peer and both bounds).
constexpr int32_t kSlotMaxRows = -2;

// Ints per pair in the count messages (A2aParams::sendCnt), the index of the pair's rows (one
// per slot: the return trip) and of its token rows (one per token: the dispatch).
__host__ __device__ constexpr int cntStride(int epr) {
  return epr + 4;
}
__host__ __device__ constexpr int cntRows(int epr) {
  return epr + 2;
}
__host__ __device__ constexpr int cntToks(int epr) {
  return epr + 3;
}

struct A2aParams {
  FusedComm f;  // error record (rt::recordError) of the comm
  const uint8_t* x;
  const int32_t* topkIdx;
  const float* topkWeights;
  ncclMoeRecv_t recv;
  int32_t* slotPos;  // [T*k] row of the slot in its destination's pair layout, -1: not sent
  // [T*k] the token row of the slot's token in its destination's pair buffer, set on the
  // token's first slot for that destination only (-1 elsewhere)
  int32_t* slotTok;
  // [n][epr + 4] rows per local expert; [epr]: 1 = the pair overflowed; [epr + 1]: the
  // sender's maxRows (pair buffers are maxRows rows: every rank must pass the same); [epr + 2]:
  // the rows (slots) the pair carries (0 on overflow), which sizes the return AllToAll on the
  // device (fusedAlltoAllSized); [epr + 3]: its token rows (<= rows), which size the row and
  // metadata AllToAlls
  int32_t* sendCnt;
  const int32_t* recvCnt;
  unsigned long long* badSlot;  // first bad slot + 1 (~0: none)
  uint8_t* sendRows;            // [n][P][rowBytes] token rows
  const uint8_t* recvRows;
  // [n][P][k] per token row: (pair row, token, slot, weight bits) of each of its slots on that
  // destination in slot order, then pair row -1
  int4* sendMeta;
  const int4* recvMeta;
  float* retSend;  // [n][P][H] fp32 (ffn)
  const float* retRecv;
  const float* out;  // [maxRows, H] fp32: the experts' outputs (ffn)
  void* y;           // [T, H] outType (ffn)
  int64_t rowBytes, pairRows, hidden;
  int32_t report;  // this kernel records the call's errors (the last one of the call)
  MoeShape s;
};

__device__ __forceinline__ rt::ErrSite a2aSite(const A2aParams& p) {
  return rt::ErrSite{p.f.c.w.op, -1, (int32_t)blockIdx.x, -1, rt::kWaitNone, 0};
}

// The receiving layout from the received counts (every CTA derives it): start/count per local
// expert, the first packed row of each source's rows of each expert, and the overflow verdict.
struct RecvLayout {
  int32_t start[kA2aMaxLocalExperts + 1];
  int32_t count[kA2aMaxLocalExperts];
  int64_t span;
  int ovf;       // nothing is received: an overflow, or a sender's maxRows differs
  int otherMax;  // the first source whose maxRows differs from this rank's (-1: none)
};

// recvCnt is set to -1 before the counts' AllToAll: a message that never arrived (the comm
// failed on the way) reads as invalid, and the rank then receives nothing rather than laying
// out leftover memory.
__device__ inline void recvLayout(const A2aParams& p, RecvLayout& L, int32_t* srcRow,
                                  int32_t* recv) {
  const MoeShape& s = p.s;
  const int n = s.nRanks, epr = s.expertsPerRank;
  if (threadIdx.x == 0) {
    int ovf = 0, invalid = 0;
    L.otherMax = -1;
    for (int src = 0; src < n; ++src) {
      const int32_t* m = p.recvCnt + src * cntStride(epr);
      invalid |= m[epr] != 0 && m[epr] != 1;
      ovf |= m[epr] == 1;
      if (L.otherMax < 0 && !invalid && m[epr + 1] != (int32_t)p.pairRows) L.otherMax = src;
      int64_t rows = 0;
      for (int le = 0; le < epr; ++le) {
        invalid |= m[le] < 0;
        recv[src * epr + le] = m[le] < 0 ? 0 : m[le];
        rows += m[le];
      }
      // The sized AllToAlls moved m[cntToks] token rows here and move m[cntRows] rows back:
      // a layout of more would read what never came.
      invalid |= m[epr] == 0 && m[cntRows(epr)] != rows;
      invalid |= m[epr] == 0 && (m[cntToks(epr)] < (rows > 0 ? 1 : 0) || m[cntToks(epr)] > rows);
    }
    L.span = moeRecvLayout(s, recv, NCCL_MOE_ROW_ALIGN, L.start, L.count, srcRow);
    L.start[epr] = (int32_t)L.span;
    if (invalid) L.otherMax = -1;  // the comm has failed already: that error stands
    L.ovf = invalid || ovf || L.span > (int64_t)p.recv.maxRows || L.otherMax >= 0;
  }
  __syncthreads();
}

// The local expert of row pr of source src's pair buffer (its rows are laid out expert after
// expert, by the received counts, `recv` in shared memory) and the packed row it maps to; -1
// past src's rows.
__device__ __forceinline__ int64_t pairRowTarget(const A2aParams& p, const int32_t* srcRow,
                                                 const int32_t* recv, int src, int64_t pr) {
  const int epr = p.s.expertsPerRank;
  int64_t off = 0;
  for (int le = 0; le < epr; ++le) {
    const int32_t c = recv[src * epr + le];
    if (pr < off + c) return srcRow[src * epr + le] + (pr - off);
    off += c;
  }
  return -1;
}

}  // namespace fused
}  // namespace mk
