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

// ---- GEMM + ReduceScatter / AllReduce across nodes (xnode_rs_role.cuh) ---------------------
//
// Rank r's partial P_r = A_r B_r is stored tile by tile ([tilesM][tilesN][tileM][tileN] of the
// output type, as the in-node fused path stores it), so consecutive tiles of one tile row are
// one contiguous block. Owner d (rows [d rpr, (d+1) rpr), rpr = M / n) needs every rank's
// tiles of the tile rows that hold its rows: grsFirstRow(d) .. grsLastRow(d), a row straddling
// two owners going to both (whole tiles; each owner reads its own rows only). A chunk is
// chunkTiles consecutive tiles of one such tile row (the row's last chunk may be shorter);
// chunk k of owner d is the same on every source, so the sender to d and d itself agree on
// it. Chunks move exactly as the AllGather's (slots of a per-source area, the same signal
// slots and values: seq is the rank's xnode call number, shared by both operators).
struct GrsPlan {
  bool ok = false;
  int64_t areaBytes = 0;  // window bytes per source rank
  int64_t tileBytes = 0;  // one tile of the output type
  int32_t tilesM = 0, tilesN = 0;
  int32_t chunkTiles = 0;  // tiles per chunk
  int32_t rowChunks = 0;   // chunks per tile row: ceil(tilesN / chunkTiles)
  int64_t chunkBytes = 0;  // the slot size (chunkTiles tiles)
  int32_t slots = 0;       // chunk slots per source area (>= 2)
  int64_t rowsPerRank = 0;
  // AllReduce only: the second part of every stream, the source's reduced rows (arChunks
  // chunks of arRows rows of N elements, the last one shorter); 0 for ReduceScatter.
  int32_t arRows = 0, arChunks = 0;
};

MK_HD inline int32_t grsFirstRow(int d, int64_t rowsPerRank, int32_t tileM) {
  return (int32_t)((int64_t)d * rowsPerRank / tileM);
}
MK_HD inline int32_t grsLastRow(int d, int64_t rowsPerRank, int32_t tileM) {
  return (int32_t)((((int64_t)d + 1) * rowsPerRank - 1) / tileM);
}
// Chunks every source sends to owner d.
MK_HD inline int64_t grsChunks(int d, int64_t rowsPerRank, int32_t tileM, int32_t rowChunks) {
  return (int64_t)(grsLastRow(d, rowsPerRank, tileM) - grsFirstRow(d, rowsPerRank, tileM) + 1) *
         rowChunks;
}
// Chunk k of owner d: tile row mBlk, tiles nBlk0 .. nBlk0 + tiles - 1.
MK_HD inline void grsChunk(int d, int64_t k, int64_t rowsPerRank, int32_t tileM, int32_t rowChunks,
                           int32_t chunkTiles, int32_t tilesN, int32_t* mBlk, int32_t* nBlk0,
                           int32_t* tiles) {
  *mBlk = grsFirstRow(d, rowsPerRank, tileM) + (int32_t)(k / rowChunks);
  *nBlk0 = (int32_t)(k % rowChunks) * chunkTiles;
  *tiles = tilesN - *nBlk0 < chunkTiles ? tilesN - *nBlk0 : chunkTiles;
}

// A pure function of values every rank shares (agreed window size, n, the shape, the output
// type), so every rank takes the same path. chunkTiles: as many tiles as fit
// min(areaBytes / 2, kGxChunkTarget), at most a tile row. allReduce: the stream from s to d
// goes on, after d's partial chunks, with s's reduced rows (as many whole rows of C as fit a
// slot); refused when a row of C does not fit one.
inline GrsPlan grsPlan(uint64_t windowBytes, int n, int64_t M, int64_t N, int32_t outBytes,
                       int32_t tileM, int32_t tileN, bool allReduce = false) {
  GrsPlan p;
  if (n < 2 || n > kGxMaxRanks || M <= 0 || N <= 0 || M % n != 0 || outBytes <= 0) return p;
  p.rowsPerRank = M / n;
  p.tilesM = (int32_t)((M + tileM - 1) / tileM);
  p.tilesN = (int32_t)((N + tileN - 1) / tileN);
  p.areaBytes = (int64_t)(windowBytes / (uint64_t)n) / 256 * 256;
  p.tileBytes = (int64_t)tileM * tileN * outBytes;
  const int64_t cap = p.areaBytes / 2 < kGxChunkTarget ? p.areaBytes / 2 : kGxChunkTarget;
  if (p.tileBytes > cap) return p;
  const int64_t g = cap / p.tileBytes < p.tilesN ? cap / p.tileBytes : p.tilesN;
  p.chunkTiles = (int32_t)g;
  p.rowChunks = (int32_t)((p.tilesN + g - 1) / g);
  p.chunkBytes = g * p.tileBytes;
  if (allReduce) {
    const int64_t rowBytes = N * outBytes;
    if (rowBytes > p.chunkBytes) return p;
    const int64_t rows = p.chunkBytes / rowBytes;
    p.arRows = (int32_t)(rows < p.rowsPerRank ? rows : p.rowsPerRank);
    p.arChunks = (int32_t)((p.rowsPerRank + p.arRows - 1) / p.arRows);
  }
  for (int d = 0; d < n; ++d)
    if ((grsChunks(d, p.rowsPerRank, tileM, p.rowChunks) + p.arChunks) * n > (int64_t)1 << 30)
      return p;
  const int64_t slots = p.areaBytes / p.chunkBytes;
  p.slots = (int32_t)(slots < kGxMaxSlots ? slots : kGxMaxSlots);
  p.ok = p.slots >= 2;
  return p;
}

// ncclFusedAuto across nodes: a rule of the call's own arguments, so every rank reaches the same
// verdict without the per-process rates the in-node model reads. The slow inter-node link
// dominates these calls, so the fused kernel wins whenever the GEMM has work to hide the
// transfers under: ReduceScatter / AllReduce always (fused 1.4-2.6x the sequential path at
// 2048-8192 rows, bench/results/session18-*/fused_vs_nccl_*); AllGather once N, the GEMM's
// flops per gathered byte, is large enough (N = 128 measured 3% slower fused, nothing to hide;
// N = 256 1.1-1.3x and N >= 512 1.3-1.4x faster; session 19 measured auto under this rule at
// 1.1-2.0x the sequential path, bench/results/session19-*/fused_vs_nccl_shapes_*).
constexpr int64_t kGxAutoMinN = 256;
inline bool gxAutoFuses(bool allGather, int64_t N) {
  return !allGather || N >= kGxAutoMinN;
}

// Comm CTAs of the ReduceScatter: [0, nSend) send (one per destination at most), [nSend,
// nSend + nRecv) receive into the staging buffer (one per source at most), the rest (>= 1)
// reduce. Needs nComm >= 3.
MK_HD inline void grsCtas(int nComm, int n, int* nSend, int* nRecv) {
  int s = nComm / 3 < n - 1 ? nComm / 3 : n - 1;
  s = s > 0 ? s : 1;
  int r = (nComm - s) / 2 < n - 1 ? (nComm - s) / 2 : n - 1;
  r = r > 0 ? r : 1;
  *nSend = s;
  *nRecv = r;
}

}  // namespace fused
}  // namespace mk
