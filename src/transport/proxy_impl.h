// The proxy engine's shared parts (proxy.h has the protocol): the wire format, the per-peer
// and per-batch state, and the Proxy class. proxy.cc runs the thread and the lifecycle;
// proxy_io.cc moves batches (ring commands in, net messages out, landed data and signals).
#pragma once
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/debug.h"
#include "transport/net.h"
#include "transport/proxy.h"
#include "transport/proxy_ring.h"
#include "transport/proxy_stats.h"

namespace mk {
namespace prx {

constexpr int kProxyMaxBatch = 64;
constexpr int kTagHdr = 0x6d6b01;
constexpr int kTagData = 0x6d6b02;
constexpr size_t kProxyChunk = 16u << 20;  // data messages are cut here (same on both sides)
constexpr int kMaxInflight = 8;            // batches in flight per peer and direction
constexpr uint32_t kHdrMagic = 0x6d6b4844u;
// Small puts ride in the header message (after the commands, 8-byte aligned each), when
// both windows are host memory: one message per batch instead of two, and on backends
// with a header round (verbs) one round trip less.
constexpr size_t kInlineCap = 4096;        // inline bytes per batch
constexpr uint32_t kWireInline = 1u << 8;  // ProxyWireCmd::op flag: data follows inline
constexpr uint32_t kPeerInfoMagic = 0x6d6b5049u;

struct ProxyWireCmd {
  uint32_t op;  // ProxyOp | kWireInline
  uint32_t sigOp;
  uint64_t dstOff;
  uint64_t bytes;
  uint64_t slot;
  uint64_t value;
};

struct WireHdr {
  uint32_t magic;
  uint32_t count;
  uint64_t batchSeq;
  ProxyWireCmd cmds[kProxyMaxBatch];
  char inl[kInlineCap];  // sender's assembly area; on the wire the data follows cmds[count)
};

inline size_t hdrBytes(uint32_t count) {
  return offsetof(WireHdr, cmds) + count * sizeof(ProxyWireCmd);
}
inline uint64_t inlineSpan(uint64_t bytes) {
  return (bytes + 7) & ~(uint64_t)7;
}

// What each proxy tells its peers next to the backend's handle (out-of-band all-to-all).
struct PeerInfo {
  uint32_t magic;
  uint32_t recvHost;  // its receive window is host memory: inline data can be copied there
};
constexpr size_t kOobBlock = kNetHandleSize + sizeof(PeerInfo);

struct Pending {
  ProxyCmd cmd;
  // An inline put of more than kProxyInlineMax bytes: its bytes after the first 8 (those
  // are in cmd.srcOff), gathered from the group's continuation slots.
  char ext[kProxyInlineExtMax - kProxyInlineMax];
  int ring;
  uint64_t ticket;
  uint64_t seenNs;  // when the proxy took it from its ring
  bool held;        // a lazy ack (kSignalLazy) that may wait for the next batch
};

struct Chunk {
  char* ptr;
  size_t len;
  int entry;  // index in the batch header
  void* req = nullptr;
  bool done = false;
};

struct SendBatch {
  WireHdr* hdr;  // in PeerState::sendHdrs (registered)
  std::vector<Pending> cmds;
  void* hdrReq = nullptr;
  bool hdrPosted = false, hdrDone = false;
  std::vector<Chunk> chunks;
  size_t nextPost = 0;
  uint64_t formedNs = 0;  // batch formed (its commands taken from the queue)
  uint64_t postedNs = 0;  // header handed to the backend
  size_t msgBytes = 0;    // header message: commands and inline data
};

struct RecvBatch {
  WireHdr* hdr;  // in PeerState::recvHdrs (registered)
  void* hdrReq = nullptr;
  bool hdrDone = false;
  std::vector<Chunk> chunks;
  size_t nextPost = 0;
  size_t firstChunk[kProxyMaxBatch + 1] =
      {};  // chunks of entry i: [firstChunk[i], firstChunk[i+1])
  uint32_t applied = 0;
  uint64_t hdrNs = 0;                    // header received
  uint32_t inlOff[kProxyMaxBatch] = {};  // inline entries: offset of their data in the message
  uint32_t inlCopied = 0;                // entries below this had their inline data copied
};

struct PeerState {
  int rank = -1;
  void* listenComm = nullptr;
  void* sendComm = nullptr;
  void* recvComm = nullptr;
  void* sendMh = nullptr;
  void* recvMh = nullptr;
  std::deque<Pending> queued;
  std::deque<SendBatch*> sendq;
  std::deque<RecvBatch*> recvq;
  uint64_t sendSeq = 0, recvSeq = 0, recvPosted = 0;
  // Header buffers, kMaxInflight per direction, registered once: backends such as verbs
  // only move registered memory. Batches complete in order, so slot seq % kMaxInflight
  // is free whenever a new batch may start.
  std::unique_ptr<WireHdr[]> sendHdrs, recvHdrs;
  void* sendHdrMh = nullptr;
  void* recvHdrMh = nullptr;
  // GPU windows: the last data chunk received since the last flush (NULL: none), and
  // the flush in flight. A flush makes every chunk completed before it visible to the GPU.
  char* unflushed = nullptr;
  size_t unflushedLen = 0;
  void* flushReq = nullptr;
  std::chrono::steady_clock::time_point flushDeadline;
  bool inlineOk = false;  // small puts to this peer travel inside the header
  // Commands in `queued` that must leave now (not held acks).
  size_t urgent = 0;
  // The last batch from this peer that carried data carried at most kInlineCap bytes: its
  // traffic is small messages, whose acks are held (a bulk stream's acks pace the sender
  // and leave at once).
  bool recvSmall = true;
  // When the last urgent command to this peer was taken from a ring (0: never). Acks are
  // held only while traffic goes both ways: with nothing of ours to ride with, a held ack
  // would only slow a one-way stream (the sender waits for it two messages later).
  uint64_t lastUrgentNs = 0;
};

// How long a group header may stay valid with a continuation slot that is not: producers
// write the continuation slots first and publish the header last (one release), so such a
// header is seen for microseconds at most (memory visibility) unless its producer is broken
// (a header pushed alone, a slot written with a wrong ticket). Then the ring is stuck at it
// for good; the proxy says so (an error) instead of leaving every waiter to its own timeout.
constexpr uint64_t kGroupStallNs = 1000000000ull;

struct RingTrack {
  ProxyRing* ring;
  uint64_t base = 0;       // ticket of flags.front()
  std::deque<char> flags;  // completion flags of tickets consumed, not yet retired
  // The incomplete group the ring's last poll stopped at (ProxyRing::stalledGroup) and
  // since when: kNoStall when none.
  static constexpr uint64_t kNoStall = ~0ull;
  uint64_t stallTicket = kNoStall;
  uint64_t stallSinceNs = 0;
};

}  // namespace prx

class Proxy {
 public:
  ProxyConfig cfg;
  NetProperties props;
  std::vector<prx::PeerState> peers;
  std::vector<int> rankToPeer;
  std::vector<prx::RingTrack> rings;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::mutex errMu;
  std::atomic<int> errCode{ncclSuccess};
  std::string errMsg;
  std::atomic<uint64_t> cmds{0}, batches{0}, bytesSent{0}, bytesRecv{0}, signalsApplied{0};
  ProxyTimes times;     // written by the proxy thread only; read after it stopped
  uint64_t loopNs = 0;  // start of the current loop iteration
  uint64_t holdNs = 0;  // MKERNEL_PROXY_ACK_HOLD_US
  int pinSlot = -1;     // proxyClaimSlot(), while the proxy lives

  void setError(ncclResult_t res, int peerRank, const std::string& what) {
    std::lock_guard<std::mutex> lk(errMu);
    if (errCode.load() != ncclSuccess) return;
    char head[96];
    if (peerRank >= 0)
      snprintf(head, sizeof(head), "proxy rank %d, peer rank %d: ", cfg.rank, peerRank);
    else
      snprintf(head, sizeof(head), "proxy rank %d: ", cfg.rank);
    errMsg = head + what;
    errCode.store(res);
    MK_WARN("%s", errMsg.c_str());
    for (auto& r : rings) r.ring->setAbort();
  }
  // Wraps a failing net call: the backend already logged details into the last error.
  bool netFailed(ncclResult_t res, int peerRank, const char* op) {
    if (res == ncclSuccess || res == ncclInProgress) return false;
    setError(res, peerRank, std::string(op) + " failed: " + lastError());
    return true;
  }

  bool drainRings();
  // The ring's last poll stopped at the same incomplete group for kGroupStallNs: sets the
  // error and says true.
  bool stalledGroupTooLong(prx::RingTrack& t);
  bool progressSend(prx::PeerState& ps);
  bool progressRecv(prx::PeerState& ps);
  int flushRecv(prx::PeerState& ps);
  void retire(int ring, uint64_t ticket);
  void run();
  bool busy() const;
  void applySignal(const prx::ProxyWireCmd& c);
};

}  // namespace mk
