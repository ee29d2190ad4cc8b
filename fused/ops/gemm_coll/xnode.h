// The "xnode" layout of the fused AllGather + GEMM: a comm spanning (virtual) nodes. Every
// shard moves through the device communication API (device/net/devcomm.cuh): P2P stores to
// the ranks of this node, the proxy to the others. This header holds the arithmetic both
// sides share (host planner, kernel, CPU unit test): the window's slot layout, the signal
// slots and the values carried in them.
//
// Window. Each receiver's net window is cut into one area per source rank (areaBytes, a
// multiple of 256); an area is a ring of `slots` chunk slots of chunkBytes each. Chunk j of
// source s (chunkRows rows of its shard) lands in slot j % slots of area s.
//
// Signals (one writer each, "set" values that only grow over the comm's lifetime):
//   data slot kGxSigData + s at the receiver, written by s: gxValue(seq, j + 1) once chunk j
//     of call seq landed;
//   ack slot kGxSigAck + r at the sender, written by receiver r: gxValue(seq, 0) when r
//     entered call seq (credit for the first `slots` chunks), gxValue(seq, j + 1) when it has
//     consumed chunk j, gxValue(seq, kGxDone) once it has consumed every chunk of every source.
// A sender puts chunk j once ack >= gxAckNeed(seq, j, slots), and ends its kernel only after
// every receiver's kGxDone. So a fused call writes into a rank's window only while that rank
// is inside the same call (after its credit, before its done): the window areas of the
// hierarchical collectives and the channel engine (docs/inter-node.md), which other
// operations use between fused calls, may be reused without a reserved share.
#pragma once
#include <cstdint>

#include "coll/hier_xfer.h"  // kXSigEnd, kXMaxRanks, MK_HD
#include "transport/net_state.h"

namespace mk {
namespace fused {

constexpr int kGxMaxRanks = kXMaxRanks;
// Private words of this rank (only its own kernel writes them; device memory, zero when the
// comm is created): completed xnode calls, and the last-CTA detection word.
constexpr uint32_t kGxSigSeq = kXSigEnd;
constexpr uint32_t kGxSigCta = kXSigEnd + 1;
constexpr uint32_t kGxSigData = kXSigEnd + 8;
constexpr uint32_t kGxSigAck = kGxSigData + kGxMaxRanks;
constexpr uint32_t kGxSigEnd = kGxSigAck + kGxMaxRanks;
static_assert(kGxSigEnd <= kNetSignals, "xnode signal slots exceed kNetSignals");

constexpr uint32_t kGxDone = 0xffffffffu;  // ack value: every chunk of the call consumed
// Largest chunk: small enough that the GEMM starts on a remote shard's first rows well
// before the whole shard landed, large enough that a chunk is a few proxy commands.
constexpr int64_t kGxChunkTarget = 2 << 20;
constexpr int32_t kGxMaxSlots = 64;

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

// Offset of chunk j of source `src` in a receiver's window.
MK_HD inline uint64_t gxSlotOff(int64_t areaBytes, int64_t chunkBytes, int32_t slots, int src,
                                int64_t j) {
  return (uint64_t)src * (uint64_t)areaBytes + (uint64_t)(j % slots) * (uint64_t)chunkBytes;
}
// Signal value of call `seq` (the rank's xnode call number, 1-based), count j.
MK_HD inline uint64_t gxValue(uint64_t seq, uint32_t j) {
  return (seq << 32) | j;
}
// The ack a sender needs before it puts chunk j: slot j % slots is free once chunk
// j - slots was consumed; the first `slots` chunks need the receiver's credit for the call.
MK_HD inline uint64_t gxAckNeed(uint64_t seq, int64_t j, int32_t slots) {
  return gxValue(seq, j >= slots ? (uint32_t)(j - slots + 1) : 0u);
}
// Round t (1 .. n-1) pairs a sender with me + t and a receiver with me - t: the k-th chunk
// between two ranks sits in the same round on both, so a blocked sender waits for a receiver
// in an earlier round, never in a cycle (docs/inter-node.md, channel engine).
MK_HD inline int gxSendPeer(int me, int t, int n) {
  return (me + t) % n;
}
MK_HD inline int gxRecvPeer(int me, int t, int n) {
  return (me - t + n) % n;
}
// Comm CTAs [0, gxSendCtas) send (at most one per destination: more would idle), the rest
// receive (at least one). Receive CTAs past the first n - 1 serve no source: they copy this
// rank's own shard, so the source CTAs consume landed chunks meanwhile (gxOwnCopier).
MK_HD inline int gxSendCtas(int nComm, int n) {
  const int s = nComm / 2 < n - 1 ? nComm / 2 : n - 1;
  return s > 0 ? s : 1;
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
