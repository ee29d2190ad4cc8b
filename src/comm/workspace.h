// The symmetric workspace of a rank (allocated per comm by the peer-memory layer, laid out
// by the collectives, read by the kernels): its layout and the limits it is sized by. Its
// own header, below the collectives, because the device view of a comm (comm_dev.h) holds
// it and the transport layer passes that view to its kernels too.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define MK_HD __host__ __device__
#else
#define MK_HD
#endif

namespace mk {

constexpr int kMaxLocalRanks = 128;  // ranks of one node that a collective spans
constexpr int kMaxLanes = 16;        // independent in-order channel lanes per rank pair

// The symmetric workspace of a rank, as seen by its peers. Traffic from local rank `src`
// to this rank on lane `l` uses `slots` slots of `slotBytes` bytes, a ready flag per slot
// (written by src, read here) and a consumed flag per slot (written here, read by src).
// Flags hold 64-bit message sequence numbers (1-based); nothing ever resets them.
struct WsLayout {
  int nLocal;          // local ranks
  int lanes;           // lanes per (src, dst) pair
  int slots;           // slots per lane (>= 2: the two-shot and ring steps need two)
  int p2pLanes;        // lanes used by the copy engine (<= lanes; bounded stream count)
  uint64_t slotBytes;  // multiple of 256
  uint64_t readyOff;   // uint64_t ready[nLocal][lanes][slots]
  uint64_t consumedOff;
  uint64_t dataOff;     // char data[nLocal][lanes][slots][slotBytes]
  uint64_t zcOff;       // ZcSlot of the zero-copy AllReduce (kWsZcBytes, written by the owner)
  uint64_t totalBytes;  // bytes of the workspace the layout uses
};
// Zero-copy handshake block of one rank (in its workspace, read by its peers; device/zc.cuh):
// the owner publishes its buffer pointers and the call's sequence number, and `done` once
// its part is finished. Separate 128-byte lines: polled by different ranks.
struct ZcSlot {
  uint64_t seq;     // call number whose pointers are below
  uint64_t send;    // const void*, valid in every in-process peer
  uint64_t recv;    // void*
  uint64_t scalar;  // PreMulSum: this rank's scalar (element bits)
  // Buffers in windows: the window's key (its id + 1, the same on every rank; 0: none) and
  // the buffer's offset in this rank's window. Peers add the offset to their mapping of
  // this rank's window, so the ranks' offsets may differ (in place, NCCL_WIN_DEFAULT).
  uint64_t sendKey, sendOff, recvKey, recvOff;
  uint64_t pad0[8];
  uint64_t done;  // last call whose segment this rank finished
  uint64_t pad1[15];
};
constexpr uint64_t kWsZcBytes = 4096;
static_assert(sizeof(ZcSlot) <= kWsZcBytes, "ZcSlot exceeds its workspace block");
MK_HD inline uint64_t wsFlagIndex(const WsLayout& w, int src, int lane, int slot) {
  return ((uint64_t)src * w.lanes + lane) * w.slots + slot;
}
MK_HD inline uint64_t wsReadyOffset(const WsLayout& w, int src, int lane, int slot) {
  return w.readyOff + 8 * wsFlagIndex(w, src, lane, slot);
}
MK_HD inline uint64_t wsConsumedOffset(const WsLayout& w, int src, int lane, int slot) {
  return w.consumedOff + 8 * wsFlagIndex(w, src, lane, slot);
}
MK_HD inline uint64_t wsDataOffset(const WsLayout& w, int src, int lane, int slot) {
  return w.dataOff + w.slotBytes * wsFlagIndex(w, src, lane, slot);
}

}  // namespace mk
