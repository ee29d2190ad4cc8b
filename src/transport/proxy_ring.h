// GPU -> CPU proxy command ring.
//
// Fixed 64-byte commands in a power-of-two array of slots, produced by GPU threads
// (proxy_ring.cuh) or host threads (ProxyRing::push*) and drained by the proxy thread.
// Protocol (multi-producer, single consumer):
//   producer:  t = fetch_add(tail, 1)                       // ticket = slot reservation
//              wait until t < head + nslots (acquire)        // back-pressure, bounded + abort
//              write the body of slots[t % nslots]
//              store valid = t + 1 with release              // device: st.release.sys
//   consumer:  v = load valid of slots[head % nslots] (acquire); v == head + 1 -> ready
//              copy the command, then store head + 1 with release (slot free again)
// The valid word carries the ticket, so a slot written in an earlier lap never looks
// ready and no slot is ever cleared. All counters are 64-bit and monotonic: they never
// wrap in practice and are never reset. `done` counts commands the proxy has finished
// (their source data has left, so the producer may overwrite it), advanced in ticket
// order. A producer that gives up (abort/timeout) after taking a ticket leaves a hole:
// the ring is then dead, which is fine because the comm is already in error.
#pragma once
#include <nccl.h>
#include <stdint.h>

namespace mk {

enum ProxyOp : uint32_t {
  kProxyNop = 0,
  kProxyPut = 1,        // copy bytes from local src_off to peer's dst_off
  kProxyPutSignal = 2,  // put, then (once the data landed) apply value to peer's signal slot
  kProxySignal = 3,     // apply value to peer's signal slot, after every earlier put to it
};

// Flag on the op of a put (kProxyPut, kProxyPutSignal) of at most 8 bytes: the data is in
// srcOff itself, not in the source window. A GPU producer then skips the staging slot and its
// system fence; only for peers the proxy sends small puts to inside the header (both windows
// host memory: proxyAllInline).
constexpr uint32_t kProxyInline = 1u << 4;
constexpr uint64_t kProxyInlineMax = 8;
// Inline puts of 9..kProxyInlineExtMax bytes (MKERNEL_PROXY_INLINE_CMD=2): the command (the
// "header", srcOff = the first 8 bytes) is followed by continuation slots under the next
// tickets of ONE fetch_add, each carrying kProxyContBytes more bytes after its valid word
// (which holds its own ticket + 1 like any slot). The consumer takes a group only once every
// slot of it is valid, so it never sees a partial group; the group may wrap around the end
// of the slot array (slots are indexed by ticket & (nslots - 1)). A ring of fewer slots than
// a group cannot carry it: producers then take the staging path.
constexpr uint64_t kProxyInlineExtMax = 64;
constexpr uint64_t kProxyContBytes = 56;
// Slots of the group a command opens: 1 unless it is an inline put of more than
// kProxyInlineMax bytes (bytes beyond kProxyInlineExtMax: 1, the consumer rejects it).
#if defined(__CUDACC__)
__host__ __device__
#endif
    constexpr uint64_t
    proxyGroupSlots(uint32_t op, uint64_t bytes) {
  return ((op & kProxyInline) && bytes > kProxyInlineMax && bytes <= kProxyInlineExtMax)
             ? 1 + (bytes - kProxyInlineMax + kProxyContBytes - 1) / kProxyContBytes
             : 1;
}
constexpr uint64_t kProxyGroupMaxSlots = 2;
static_assert(kProxyInlineMax + kProxyContBytes * (kProxyGroupMaxSlots - 1) >= kProxyInlineExtMax,
              "a group of kProxyGroupMaxSlots slots carries kProxyInlineExtMax bytes");

enum ProxySignalOp : uint32_t {
  kSignalSet = 0,  // signal = value   (value: a monotonic sequence number)
  kSignalAdd = 1,  // signal += value
};
// Flag on the sigOp of a kProxySignal command: an acknowledgement (a receiver freeing a
// slot) that nobody waits for at once, so the proxy may hold it up to
// MKERNEL_PROXY_ACK_HOLD_US to travel in the next batch to that peer instead of in a wire
// message of its own. Small messages in both directions then cost one message per call
// and direction instead of two.
constexpr uint32_t kSignalLazy = 1u << 8;

struct alignas(64) ProxyCmd {
  uint64_t valid;   // ticket + 1 once the body is written; written last
  uint32_t op;      // ProxyOp
  uint32_t sigOp;   // ProxySignalOp
  uint64_t peer;    // destination rank
  uint64_t srcOff;  // byte offset in the local source window
  uint64_t dstOff;  // byte offset in the peer's destination window
  uint64_t bytes;
  uint64_t slot;  // signal slot index at the peer
  uint64_t value;
};
static_assert(sizeof(ProxyCmd) == 64, "proxy commands are 64 bytes");

// Shared-state layout; each counter has its own cache line (GPU producers hammer tail,
// the proxy writes head/done).
struct ProxyRingCounters {
  alignas(64) uint64_t tail;   // next ticket
  alignas(64) uint64_t head;   // commands consumed
  alignas(64) uint64_t done;   // commands completed
  alignas(64) uint32_t abort;  // nonzero: producers stop waiting and fail
};

// What a producer needs; plain pointers so that it can be passed to a kernel by value.
struct ProxyRingView {
  ProxyCmd* slots;
  uint64_t nslots;  // power of two
  uint64_t* tail;
  uint64_t* head;
  uint64_t* done;
  uint32_t* abort;
};

// Host side (usable from .cc and .cu translation units).
enum class ProxyRingMem {
  kHost,        // malloc'ed host memory: host producers only (CPU tests, host-driven sends)
  kCudaMapped,  // cudaHostAlloc(mapped) for slots/head/done/abort, tail in device memory
};

class ProxyRing {
 public:
  // nslots: rounded up to a power of two; 0 = MKERNEL_PROXY_RING_SLOTS.
  static ncclResult_t create(uint64_t nslots, ProxyRingMem mem, ProxyRing** out);
  ~ProxyRing();

  ProxyRingView hostView() const { return host_; }
  // Device pointers of a kCudaMapped ring (same as hostView() for kHost).
  ProxyRingView deviceView() const { return dev_; }
  uint64_t nslots() const { return host_.nslots; }

  // Host producer. Waits at most timeoutMs for a free slot (ncclRemoteError on timeout,
  // ncclRemoteError "aborted" when the abort flag is set). Thread-safe. Only on kHost
  // rings: host and GPU atomics on the same counter are not atomic with each other over
  // PCIe.
  ncclResult_t push(const ProxyCmd& cmd, int64_t timeoutMs);
  // Host producer of an inline put (kProxyPut or kProxyPutSignal in cmd.op; kProxyInline is
  // added) of 1..kProxyInlineExtMax bytes from data: one command, or a header plus
  // continuation slots under one ticket range for more than kProxyInlineMax bytes.
  // cmd.srcOff and cmd.bytes are set here. Same waits and errors as push.
  ncclResult_t pushInline(const ProxyCmd& cmd, const void* data, uint64_t bytes, int64_t timeoutMs);
  ncclResult_t put(uint64_t peer, uint64_t srcOff, uint64_t dstOff, uint64_t bytes,
                   int64_t timeoutMs);
  ncclResult_t putSignal(uint64_t peer, uint64_t srcOff, uint64_t dstOff, uint64_t bytes,
                         uint64_t slot, uint64_t value, ProxySignalOp sigOp, int64_t timeoutMs);
  ncclResult_t signal(uint64_t peer, uint64_t slot, uint64_t value, ProxySignalOp sigOp,
                      int64_t timeoutMs);

  // Consumer (one thread). Copies up to max ready slots, frees them, returns how many;
  // *firstTicket gets the ticket of out[0]. A group (proxyGroupSlots) is copied whole or not
  // at all: it waits for the next call while any of its slots is not yet valid or it does not
  // fit in max (max >= kProxyGroupMaxSlots, else groups never come out). No wait inside, so
  // the caller's loop keeps honouring its shutdown and abort.
  int poll(ProxyCmd* out, int max, uint64_t* firstTicket);
  // Whether the last poll stopped at a group header whose continuation slots were not all
  // valid (*ticket: the header's); not when the group only did not fit in max. Producers
  // write the continuation slots before the header, so a group seen like this for long is a
  // broken producer: the caller (the proxy) turns that into an error instead of waiting.
  bool stalledGroup(uint64_t* ticket) const;
  // Marks every ticket below `ticket` completed (done = ticket, monotonic).
  void setDone(uint64_t ticket);
  uint64_t done() const;
  // Producers (host and device) waiting for space fail instead.
  void setAbort();
  bool aborted() const;
  // Tickets handed out (includes commands not yet written).
  uint64_t tail() const;

 private:
  ProxyRing() = default;
  ProxyRingMem mem_ = ProxyRingMem::kHost;
  ProxyRingView host_ = {};
  ProxyRingView dev_ = {};
  void* slotsAlloc_ = nullptr;
  void* ctrAlloc_ = nullptr;
  void* tailDevAlloc_ = nullptr;
  uint64_t consumed_ = 0;  // consumer's private copy of head
  bool stalled_ = false;   // the last poll stopped at an incomplete group at consumed_
};

}  // namespace mk
