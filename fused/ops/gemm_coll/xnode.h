// The "xnode" layout of the fused AllGather + GEMM: a comm spanning (virtual) nodes. Every
// shard moves through the device communication API (device/net/devcomm.cuh): P2P stores to
// the ranks of this node, the proxy to the others. The protocol (window slots, signal slots,
// values) is fused/core/xnode_proto.h, shared with the fused ring attention; this header holds
// the GEMM's planner (chunks of whole rows of a shard) and its own-shard copier choice (host
// planner, kernel, CPU unit test).
#pragma once
#include <cstdint>

#include "fused/core/xnode_proto.h"

namespace mk {
namespace fused {

struct GxPlan {
  bool ok = false;         // false: the layout cannot run this shape (sequential path)
  int64_t areaBytes = 0;   // window bytes per source rank
  int32_t chunkRows = 0;   // rows per chunk: divides rowsPerRank (a rows-ready flag each)
  int64_t chunkBytes = 0;  // the slot size
  int32_t slots = 0;       // chunk slots per source area (>= 2)
  int32_t chunks = 0;      // chunks per shard
};

// A pure function of values every rank shares (the comm's agreed window size, n, the call's
// shape), so every rank takes the same path. chunkRows: the largest divisor of rowsPerRank
// whose chunk fits min(areaBytes / 2, kGxChunkTarget) (a flag then covers rows of one shard).
inline GxPlan gxPlan(uint64_t windowBytes, int n, int64_t rowsPerRank, int64_t K) {
  GxPlan p;
  if (n < 2 || n > kGxMaxRanks || rowsPerRank <= 0 || K <= 0) return p;
  p.areaBytes = (int64_t)(windowBytes / (uint64_t)n) / 256 * 256;
  const int64_t rowBytes = K * 2;
  const int64_t cap = p.areaBytes / 2 < kGxChunkTarget ? p.areaBytes / 2 : kGxChunkTarget;
  if (rowBytes > cap) return p;
  int64_t rows = cap / rowBytes < rowsPerRank ? cap / rowBytes : rowsPerRank;
  while (rows > 1 && rowsPerRank % rows != 0) --rows;
  const int64_t chunks = rowsPerRank / rows;
  if (chunks >= (int64_t)kGxDone || (int64_t)n * chunks > (int64_t)1 << 30) return p;
  p.chunkRows = (int32_t)rows;
  p.chunkBytes = rows * rowBytes;
  const int64_t slots = p.areaBytes / p.chunkBytes;
  p.slots = (int32_t)(slots < kGxMaxSlots ? slots : kGxMaxSlots);
  p.chunks = (int32_t)chunks;
  p.ok = p.slots >= 2;
  return p;
}

// Whether receive CTA k of nRecv copies own chunk j: the CTAs that serve no source when there
// are such, otherwise all of them in turn.
MK_HD inline bool gxOwnCopier(int k, int nRecv, int n, int64_t j) {
  const int idle = nRecv - (n - 1);
  if (idle <= 0) return j % nRecv == k;
  return k >= n - 1 && j % idle == k - (n - 1);
}

}  // namespace fused
}  // namespace mk
