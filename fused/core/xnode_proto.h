// The xnode protocol of the fused kernels on a comm spanning (virtual) nodes, shared by the
// fused AllGather + GEMM (fused/ops/gemm_coll/xnode.h) and the fused ring attention
// (fused/ops/ring_attn/xnode.h): data moves through the device communication API
// (device/net/devcomm.cuh) in chunks, into a ring of slots per source in the receiver's
// window; credits, acks and a done value bound what a sender may put.
//
// Window. Each receiver's net window is cut into one area per source rank (areaBytes, a
// multiple of 256); an area is a ring of `slots` chunk slots of chunkBytes each. Chunk j of
// source s lands in slot j % slots of area s.
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
//
// seq is the rank's xnode call number (kGxSigSeq + 1), one counter for every fused operator
// that uses these slots: the values stay monotonic across operators (every rank makes the
// same fused calls in the same order).
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
// Largest chunk: small enough that the consumer (GEMM, attention) starts on a remote
// shard's first rows well before the whole shard landed, large enough that a chunk is a few proxy
// commands.
constexpr int64_t kGxChunkTarget = 2 << 20;
constexpr int32_t kGxMaxSlots = 64;

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
// Whether a receiver acks chunk j of a stream of `total` chunks once it consumed it: only where
// the sender will need the slot again (chunk j + slots exists); kGxDone covers the last ones.
MK_HD inline bool gxAckSent(int64_t j, int64_t slots, int64_t total) {
  return j + slots < total;
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
// rank's own shard, so the source CTAs consume landed chunks meanwhile.
MK_HD inline int gxSendCtas(int nComm, int n) {
  const int s = nComm / 2 < n - 1 ? nComm / 2 : n - 1;
  return s > 0 ? s : 1;
}

// The receive CTA that takes this rank's own share (ring attention: its slices into gather
// index 0; MoE: its own records): the first one that serves no source if there is one, else
// the last one.
MK_HD inline int rxOwnCopier(int nRecv, int n) {
  return nRecv > n - 1 ? n - 1 : nRecv - 1;
}

}  // namespace fused
}  // namespace mk
