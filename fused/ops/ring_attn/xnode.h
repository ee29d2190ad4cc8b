// The "xnode" layout of the fused ring attention: a comm spanning (virtual) nodes. Every k/v
// slice moves through the device communication API (device/net/devcomm.cuh): P2P stores to
// the ranks of this node, the proxy to the others, with the protocol of the fused kernels
// across nodes (fused/core/xnode_proto.h: window slots, credits, acks, done). This header
// holds the arithmetic the host planner, the kernel (xnode_role.cuh) and the CPU unit test
// share.
//
// Units. A slice ([B][S][Hkv][D], 2-byte elements) is B*S rows of Hkv*D elements; it is cut
// into `chunks` chunks of chunkRows rows (the last one may be shorter: seqLocal need not
// divide into anything). Unit u is chunk u / 2 of k (u even) or of v (u odd): k and v of the
// same rows travel together, so the attention, which needs both for a key block, can start
// on the first rows of a source while its later rows are still on their way. Units are the
// protocol's chunks: unit u of source s lands in slot u % slots of area s.
//
// Ready counters. One receive CTA copies a source's units in order and raises the source's
// counter to u + 1 after unit u (one word per source, not one per unit: the attention then
// needs one load to know whether a block's rows are in, rxUnitsFor).
#pragma once
#include <cstdint>

#include "fused/core/xnode_proto.h"

namespace mk {
namespace fused {

struct RxPlan {
  bool ok = false;         // false: the layout cannot run this shape (sequential path)
  int64_t areaBytes = 0;   // window bytes per source rank
  int64_t rows = 0;        // B * S: rows of a slice
  int64_t rowBytes = 0;    // Hkv * D * 2
  int32_t chunkRows = 0;   // rows per chunk (the last chunk may have fewer)
  int64_t chunkBytes = 0;  // the slot size: chunkRows * rowBytes
  int32_t slots = 0;       // unit slots per source area (>= 2: k and v of a chunk in flight)
  int32_t chunks = 0;      // chunks per slice
  int32_t units = 0;       // 2 * chunks
};

// A pure function of values every rank shares (the comm's agreed window size, n, the call's
// shape), so every rank takes the same path. A chunk is at most min(areaBytes / 2,
// kGxChunkTarget) bytes of whole rows.
inline RxPlan rxPlan(uint64_t windowBytes, int n, int64_t rows, int64_t rowBytes) {
  RxPlan p;
  if (n < 2 || n > kGxMaxRanks || rows <= 0 || rowBytes <= 0 || rowBytes % 16 != 0) return p;
  p.areaBytes = (int64_t)(windowBytes / (uint64_t)n) / 256 * 256;
  const int64_t cap = p.areaBytes / 2 < kGxChunkTarget ? p.areaBytes / 2 : kGxChunkTarget;
  if (rowBytes > cap) return p;
  const int64_t chunkRows = cap / rowBytes < rows ? cap / rowBytes : rows;
  const int64_t chunks = (rows + chunkRows - 1) / chunkRows;
  // Unit counts ride in the low 32 bits of the signal values (kGxDone reserved).
  if (2 * chunks >= (int64_t)kGxDone || chunkRows > INT32_MAX) return p;
  p.rows = rows;
  p.rowBytes = rowBytes;
  p.chunkRows = (int32_t)chunkRows;
  p.chunkBytes = chunkRows * rowBytes;
  const int64_t slots = p.areaBytes / p.chunkBytes;
  p.slots = (int32_t)(slots < kGxMaxSlots ? slots : kGxMaxSlots);
  p.chunks = (int32_t)chunks;
  p.units = (int32_t)(2 * chunks);
  p.ok = p.slots >= 2;
  return p;
}

// Byte offset of unit u inside its slice (k or v), and its length.
MK_HD inline int64_t rxUnitOff(int64_t chunkBytes, int32_t u) {
  return (int64_t)(u / 2) * chunkBytes;
}
MK_HD inline int64_t rxUnitBytes(int64_t chunkBytes, int64_t sliceBytes, int32_t u) {
  const int64_t left = sliceBytes - rxUnitOff(chunkBytes, u);
  return left < chunkBytes ? left : chunkBytes;
}
// Units of a source that must have landed before rows [0, rowEnd) of both k and v are in
// place (the ready counter's target for a key block ending at row rowEnd).
MK_HD inline uint64_t rxUnitsFor(int64_t rowEnd, int32_t chunkRows) {
  return 2 * (uint64_t)((rowEnd + chunkRows - 1) / chunkRows);
}

}  // namespace fused
}  // namespace mk
