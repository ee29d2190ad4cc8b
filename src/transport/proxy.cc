// Proxy engine (see proxy.h for the protocol).
#include "transport/proxy.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include <sched.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "base/checks.h"
#include "base/param.h"
#include "transport/proxy_stats.h"

namespace mk {
namespace {

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

size_t hdrBytes(uint32_t count) {
  return offsetof(WireHdr, cmds) + count * sizeof(ProxyWireCmd);
}
uint64_t inlineSpan(uint64_t bytes) {
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

struct RingTrack {
  ProxyRing* ring;
  uint64_t base = 0;       // ticket of flags.front()
  std::deque<char> flags;  // completion flags of tickets consumed, not yet retired
};

}  // namespace

class Proxy {
 public:
  ProxyConfig cfg;
  NetProperties props;
  std::vector<PeerState> peers;
  std::vector<int> rankToPeer;
  std::vector<RingTrack> rings;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::mutex errMu;
  std::atomic<int> errCode{ncclSuccess};
  std::string errMsg;
  std::atomic<uint64_t> cmds{0}, batches{0}, bytesSent{0}, bytesRecv{0}, signalsApplied{0};
  ProxyTimes times;     // written by the proxy thread only; read after it stopped
  uint64_t loopNs = 0;  // start of the current loop iteration
  uint64_t holdNs = 0;  // MKERNEL_PROXY_ACK_HOLD_US

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
  bool progressSend(PeerState& ps);
  bool progressRecv(PeerState& ps);
  int flushRecv(PeerState& ps);
  void retire(int ring, uint64_t ticket);
  void run();
  bool busy() const;
  void applySignal(const ProxyWireCmd& c);
};

void Proxy::retire(int ring, uint64_t ticket) {
  RingTrack& t = rings[ring];
  if (ticket < t.base) return;
  t.flags[ticket - t.base] = 1;
  uint64_t n = 0;
  while (!t.flags.empty() && t.flags.front()) t.flags.pop_front(), n++;
  if (n) {
    t.base += n;
    t.ring->setDone(t.base);
  }
}

bool Proxy::drainRings() {
  bool any = false;
  ProxyCmd buf[kProxyMaxBatch];
  for (size_t i = 0; i < rings.size(); i++) {
    uint64_t first;
    int n = rings[i].ring->poll(buf, kProxyMaxBatch, &first);
    const uint64_t seenNs = n > 0 ? proxyNowNs() : 0;
    for (int k = 0; k < n; k++) {
      const ProxyCmd& c = buf[k];
      rings[i].flags.push_back(0);
      uint64_t ticket = first + k;
      if (c.op == kProxyNop) {
        retire((int)i, ticket);
        continue;
      }
      bool bad = c.op > kProxySignal || (c.sigOp & ~kSignalLazy) > kSignalAdd ||
                 c.peer >= rankToPeer.size() || rankToPeer[c.peer] < 0;
      if (!bad && c.op != kProxySignal)
        bad = c.bytes > cfg.sendBytes || c.srcOff > cfg.sendBytes - c.bytes;
      if (bad) {
        char m[200];
        snprintf(m, sizeof(m),
                 "invalid ring command (op %u, peer %llu, src_off %llu, bytes %llu; window %zu)",
                 c.op, (unsigned long long)c.peer, (unsigned long long)c.srcOff,
                 (unsigned long long)c.bytes, cfg.sendBytes);
        setError(ncclInvalidUsage, -1, m);
        return true;
      }
      PeerState& ps = peers[rankToPeer[c.peer]];
      const bool held = holdNs > 0 && c.op == kProxySignal && (c.sigOp & kSignalLazy) &&
                        c.sigOp != (kSignalAdd | kSignalLazy) && ps.recvSmall &&
                        ps.lastUrgentNs != 0 && seenNs - ps.lastUrgentNs < 4 * holdNs;
      ps.queued.push_back(Pending{c, (int)i, ticket, seenNs, held});
      if (!held) ps.urgent++, ps.lastUrgentNs = seenNs;
      // A signal has no source data: a held one is complete for the ring at once, so that
      // waits on the ring's done counter (quiet, staging slots) never wait out a hold, and
      // a comm destroyed while one is held leaves a clean ring.
      if (held) retire((int)i, ticket);
      cmds.fetch_add(1, std::memory_order_relaxed);
    }
    any |= n > 0;
  }
  return any;
}

bool Proxy::progressSend(PeerState& ps) {
  bool progress = false;
  Net* net = cfg.net;
  // Form new batches. Held acks alone wait (up to holdNs) for something urgent to ride with.
  while (!ps.queued.empty() && ps.sendq.size() < (size_t)kMaxInflight &&
         (ps.urgent > 0 || ps.queued.front().seenNs + holdNs <= loopNs)) {
    SendBatch* b = new SendBatch();
    b->hdr = &ps.sendHdrs[ps.sendSeq % kMaxInflight];
    b->hdr->magic = kHdrMagic;
    b->hdr->batchSeq = ps.sendSeq++;
    uint32_t n = 0;
    size_t inl = 0;
    while (!ps.queued.empty() && n < kProxyMaxBatch) {
      Pending pd = ps.queued.front();
      ps.queued.pop_front();
      if (!pd.held) ps.urgent--;
      const ProxyCmd& c = pd.cmd;
      ProxyWireCmd& w = b->hdr->cmds[n];
      w = ProxyWireCmd{c.op,     c.sigOp & ~kSignalLazy,
                       c.dstOff, c.op == kProxySignal ? 0 : c.bytes,
                       c.slot,   c.value};
      if (ps.inlineOk && w.bytes > 0 && inl + inlineSpan(w.bytes) <= kInlineCap) {
        // The GPU made the source visible before it published the command (fence, then
        // the release of its valid word, which drainRings acquired).
        memcpy(b->hdr->inl + inl, static_cast<char*>(cfg.sendBuf) + c.srcOff, w.bytes);
        inl += inlineSpan(w.bytes);
        w.op |= kWireInline;
        bytesSent.fetch_add(w.bytes, std::memory_order_relaxed);
        b->cmds.push_back(pd);
        n++;
        continue;
      }
      for (uint64_t off = 0; off < w.bytes; off += kProxyChunk) {
        size_t len = (size_t)std::min<uint64_t>(kProxyChunk, w.bytes - off);
        b->chunks.push_back(Chunk{static_cast<char*>(cfg.sendBuf) + c.srcOff + off, len, (int)n});
      }
      b->cmds.push_back(pd);
      n++;
    }
    b->hdr->count = n;
    // On the wire the inline data follows the last command.
    if (inl) memmove(reinterpret_cast<char*>(b->hdr) + hdrBytes(n), b->hdr->inl, inl);
    b->msgBytes = hdrBytes(n) + inl;
    b->formedNs = proxyNowNs();
    ps.sendq.push_back(b);
    batches.fetch_add(1, std::memory_order_relaxed);
    progress = true;
  }
  // Post in order: batch k+1 only after every message of batch k is posted.
  for (SendBatch* b : ps.sendq) {
    if (!b->hdrPosted) {
      const uint64_t callNs = proxyNowNs();
      if (netFailed(net->isend(ps.sendComm, b->hdr, b->msgBytes, kTagHdr, ps.sendHdrMh, &b->hdrReq),
                    ps.rank, "isend(header)"))
        return true;
      if (!b->hdrReq) return progress;  // backend busy
      b->hdrPosted = true;
      b->postedNs = proxyNowNs();
      times.isendHdr.add(b->postedNs - callNs);
      times.batchToPost.add(b->postedNs - b->formedNs);
      for (const Pending& pd : b->cmds) {
        times.cmdToPost.add(b->postedNs - pd.seenNs);
        times.cmdToBatch.add(b->formedNs - pd.seenNs);
      }
      progress = true;
    }
    while (b->nextPost < b->chunks.size()) {
      Chunk& ch = b->chunks[b->nextPost];
      if (netFailed(net->isend(ps.sendComm, ch.ptr, ch.len, kTagData, ps.sendMh, &ch.req), ps.rank,
                    "isend(data)"))
        return true;
      if (!ch.req) return progress;
      b->nextPost++;
      progress = true;
    }
  }
  // Complete.
  for (SendBatch* b : ps.sendq) {
    int done = 0;
    if (b->hdrPosted && !b->hdrDone) {
      if (netFailed(net->test(b->hdrReq, &done, nullptr), ps.rank, "send")) return true;
      if (done) b->hdrDone = true, progress = true;
    }
    for (size_t i = 0; i < b->nextPost; i++) {
      Chunk& ch = b->chunks[i];
      if (ch.done) continue;
      if (netFailed(net->test(ch.req, &done, nullptr), ps.rank, "send")) return true;
      if (!done) break;
      ch.done = true;
      bytesSent.fetch_add(ch.len, std::memory_order_relaxed);
      progress = true;
    }
  }
  while (!ps.sendq.empty()) {
    SendBatch* b = ps.sendq.front();
    if (!b->hdrDone || b->nextPost < b->chunks.size() ||
        (!b->chunks.empty() && !b->chunks.back().done))
      break;
    for (const Pending& pd : b->cmds) retire(pd.ring, pd.ticket);
    times.postToSent.add(proxyNowNs() - b->postedNs);
    ps.sendq.pop_front();
    delete b;
  }
  return progress;
}

void Proxy::applySignal(const ProxyWireCmd& c) {
  uint64_t* w = &cfg.signals[c.slot];
  if (c.sigOp == kSignalAdd)
    __atomic_fetch_add(w, c.value, __ATOMIC_RELEASE);
  else
    __atomic_store_n(w, c.value, __ATOMIC_RELEASE);
  signalsApplied.fetch_add(1, std::memory_order_relaxed);
}

bool Proxy::progressRecv(PeerState& ps) {
  bool progress = false;
  Net* net = cfg.net;
  // A new header receive only once every data receive of the previous batch is posted
  // (receives match messages in posting order).
  bool canPost = ps.recvq.size() < (size_t)kMaxInflight;
  if (canPost && !ps.recvq.empty()) {
    RecvBatch* last = ps.recvq.back();
    canPost = last->hdrDone && last->nextPost == last->chunks.size();
  }
  if (canPost) {
    RecvBatch* b = new RecvBatch();
    b->hdr = &ps.recvHdrs[ps.recvPosted % kMaxInflight];
    void* data = b->hdr;
    size_t size = sizeof(WireHdr);
    int tag = kTagHdr;
    void* mh = ps.recvHdrMh;
    if (netFailed(net->irecv(ps.recvComm, 1, &data, &size, &tag, &mh, &b->hdrReq), ps.rank,
                  "irecv(header)")) {
      delete b;
      return true;
    }
    if (b->hdrReq) {
      ps.recvPosted++;
      ps.recvq.push_back(b);
      progress = true;
    } else {
      delete b;
    }
  }
  for (RecvBatch* b : ps.recvq) {
    if (!b->hdrDone) {
      int done = 0;
      size_t got = 0;
      if (netFailed(net->test(b->hdrReq, &done, &got), ps.rank, "receive")) return true;
      if (!done) break;  // later batches wait for this header anyway
      b->hdrDone = true;
      b->hdrNs = proxyNowNs();
      progress = true;
      const WireHdr& h = *b->hdr;
      if (got < offsetof(WireHdr, cmds) || h.magic != kHdrMagic || h.count > kProxyMaxBatch ||
          got < hdrBytes(h.count) || h.batchSeq != ps.recvSeq) {
        setError(ncclSystemError, ps.rank, "corrupt proxy header");
        return true;
      }
      ps.recvSeq++;
      uint64_t inl = 0, putBytes = 0;
      for (uint32_t i = 0; i < h.count; i++) {
        const ProxyWireCmd& c = h.cmds[i];
        const uint32_t op = c.op & ~kWireInline;
        const bool inLine = (c.op & kWireInline) != 0;
        b->firstChunk[i] = b->chunks.size();
        if (op != kProxySignal) putBytes += c.bytes;
        bool bad = op < kProxyPut || op > kProxySignal || (inLine && op == kProxySignal);
        if (op != kProxySignal)
          bad |= c.bytes > cfg.recvBytes || c.dstOff > cfg.recvBytes - c.bytes;
        if (op != kProxyPut) bad |= c.slot >= cfg.nSignals;
        if (inLine && !bad) {
          bad = cfg.bufType != NCCL_PTR_HOST || c.bytes > kInlineCap ||
                hdrBytes(h.count) + inl + inlineSpan(c.bytes) > got;
          b->inlOff[i] = (uint32_t)(hdrBytes(h.count) + inl);
          inl += inlineSpan(c.bytes);
        }
        if (bad) {
          char m[200];
          snprintf(m, sizeof(m),
                   "peer sent an out-of-range command (op %u, dst_off %llu, bytes %llu, slot "
                   "%llu; window %zu, %zu signals)",
                   op, (unsigned long long)c.dstOff, (unsigned long long)c.bytes,
                   (unsigned long long)c.slot, cfg.recvBytes, cfg.nSignals);
          setError(ncclInvalidUsage, ps.rank, m);
          return true;
        }
        for (uint64_t off = 0; off < c.bytes && op != kProxySignal && !inLine; off += kProxyChunk) {
          size_t len = (size_t)std::min<uint64_t>(kProxyChunk, c.bytes - off);
          b->chunks.push_back(Chunk{static_cast<char*>(cfg.recvBuf) + c.dstOff + off, len, (int)i});
        }
      }
      if (got != hdrBytes(h.count) + inl) {
        setError(ncclSystemError, ps.rank, "corrupt proxy header (inline data size)");
        return true;
      }
      b->firstChunk[h.count] = b->chunks.size();
      if (putBytes > 0) ps.recvSmall = putBytes <= kInlineCap;
    }
    while (b->nextPost < b->chunks.size()) {
      Chunk& ch = b->chunks[b->nextPost];
      void* data = ch.ptr;
      size_t size = ch.len;
      int tag = kTagData;
      void* mh = ps.recvMh;
      if (netFailed(net->irecv(ps.recvComm, 1, &data, &size, &tag, &mh, &ch.req), ps.rank,
                    "irecv(data)"))
        return true;
      if (!ch.req) return progress;
      b->nextPost++;
      progress = true;
    }
  }
  // Land data, then signals, strictly in order.
  while (!ps.recvq.empty()) {
    RecvBatch* b = ps.recvq.front();
    if (!b->hdrDone) break;
    while (b->applied < b->hdr->count) {
      uint32_t e = b->applied;
      bool ready = true;
      for (size_t k = b->firstChunk[e]; k < b->firstChunk[e + 1]; k++) {
        Chunk& ch = b->chunks[k];
        if (ch.done) continue;
        if (k >= b->nextPost) {
          ready = false;
          break;
        }
        int done = 0;
        size_t got = 0;
        if (netFailed(net->test(ch.req, &done, &got), ps.rank, "receive")) return true;
        if (!done) {
          ready = false;
          break;
        }
        if (got != ch.len) {
          setError(ncclSystemError, ps.rank, "short data message");
          return true;
        }
        ch.done = true;
        bytesRecv.fetch_add(ch.len, std::memory_order_relaxed);
        if (cfg.bufType == NCCL_PTR_CUDA && ch.len > 0)
          ps.unflushed = ch.ptr, ps.unflushedLen = ch.len;
      }
      if (!ready) break;
      const ProxyWireCmd& c = b->hdr->cmds[e];
      if ((c.op & kWireInline) && b->inlCopied <= e) {
        memcpy(static_cast<char*>(cfg.recvBuf) + c.dstOff,
               reinterpret_cast<const char*>(b->hdr) + b->inlOff[e], c.bytes);
        b->inlCopied = e + 1;
        bytesRecv.fetch_add(c.bytes, std::memory_order_relaxed);
      }
      if ((c.op & ~kWireInline) != kProxyPut) {
        // Every earlier chunk of this peer (this entry's and earlier puts') must be
        // visible to the GPU before the signal says so.
        int flushed = flushRecv(ps);
        if (flushed < 0) return true;
        if (flushed == 0) break;
        applySignal(c);
      }
      b->applied++;
      progress = true;
    }
    if (b->applied < b->hdr->count) break;
    times.hdrToApplied.add(proxyNowNs() - b->hdrNs);
    ps.recvq.pop_front();
    delete b;
  }
  return progress;
}

// 1: every chunk received so far is visible (flushed, or nothing needed one); 0: a flush
// is in flight (polled here, never waited for: the proxy keeps serving other peers and
// stops on abort); -1: error recorded.
int Proxy::flushRecv(PeerState& ps) {
  Net* net = cfg.net;
  if (!ps.flushReq) {
    if (!ps.unflushed) return 1;
    void* data = ps.unflushed;
    int size = (int)std::min<size_t>(ps.unflushedLen, 1u << 30);
    void* mh = ps.recvMh;
    if (netFailed(net->iflush(ps.recvComm, 1, &data, &size, &mh, &ps.flushReq), ps.rank, "iflush"))
      return -1;
    ps.unflushed = nullptr;
    if (!ps.flushReq) return 1;  // the backend has nothing to flush (host-visible data)
    ps.flushDeadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(netTimeoutMs());
  }
  int done = 0;
  if (netFailed(net->test(ps.flushReq, &done, nullptr), ps.rank, "flush")) {
    ps.flushReq = nullptr;  // a failed test() frees the request
    return -1;
  }
  if (done) {
    ps.flushReq = nullptr;
    return 1;
  }
  if (std::chrono::steady_clock::now() > ps.flushDeadline) {
    setError(
        ncclSystemError, ps.rank,
        "flush of received GPU data not complete after " + std::to_string(netTimeoutMs()) + " ms");
    return -1;
  }
  return 0;
}

// Work in flight that the proxy must keep polling for: commands not yet sent, batches not
// yet complete, received headers whose data or signals are pending, a flush. Header
// receives posted for batches that have not arrived do not count.
bool Proxy::busy() const {
  for (const PeerState& ps : peers) {
    if (!ps.queued.empty() || !ps.sendq.empty() || ps.flushReq) return true;
    if (!ps.recvq.empty() && ps.recvq.front()->hdrDone) return true;
  }
  return false;
}

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);  // keeps the poll loop a loop
#endif
}

// Polling policy. Nothing can wake the proxy (GPU threads write the ring, peers write the
// sockets), so it polls, and how it waits between polls decides the latency of messages:
//  - right after progress, a few tight polls;
//  - then, for MKERNEL_PROXY_SPIN_US after the last progress, sched_yield between polls:
//    free on a CPU nobody else wants (and it does not let an idle virtual CPU halt, which
//    can take long to undo), while the rank's other threads get the CPU when they want it;
//  - then sleeps: 2 us while work is in flight (a large transfer on helper threads), else an
//    eighth of the time since the last progress (1 us .. MKERNEL_PROXY_SLEEP_US), at most
//    ~12% added to any wait. Not a longer spin: a thread that keeps the CPU busy loses its
//    claim on it under contention (another busy thread on its CPU, a loaded host) and then
//    waits whole time slices after each yield, milliseconds per message, while a thread
//    that wakes from a short sleep preempts at once. Yields that took over 100 us (another
//    thread held the CPU for its slice) are counted in the statistics.
// The timer slack is cut to 1 us so that a sleep lasts what it asks (Linux adds 50 us by
// default, and a slack inherited from the environment can be milliseconds).
void Proxy::run() {
  if (cfg.pinThread) proxyPinThread(cfg.cudaDev, props.pciPath);
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  const uint64_t spinNs = (uint64_t)MK_PARAM_INT(ProxySpinUs) * 1000;
  const uint64_t maxSleepNs = (uint64_t)MK_PARAM_INT(ProxySleepUs) * 1000;
  constexpr uint64_t kSlowYieldNs = 100000;
  uint64_t lastActive = proxyNowNs(), prev = lastActive;
  bool slept = false;
  for (uint32_t polls = 0; !stop.load(std::memory_order_relaxed);) {
    loopNs = proxyNowNs();
    times.loop(loopNs - prev, slept);
    prev = loopNs;
    slept = false;
    bool progress = drainRings();
    for (PeerState& ps : peers) {
      if (errCode.load() != ncclSuccess) break;
      progress |= progressSend(ps);
      if (errCode.load() != ncclSuccess) break;
      progress |= progressRecv(ps);
    }
    // Commands the GPU pushed while this iteration sat in the peers' system calls (often
    // the answer to what it just received: an ack, the next chunk) leave now rather than
    // after another round of receive polls. Only after progress: an idle loop stays cheap.
    if (progress && errCode.load() == ncclSuccess && drainRings()) {
      for (PeerState& ps : peers) {
        if (errCode.load() != ncclSuccess) break;
        if (!ps.queued.empty()) progressSend(ps);
      }
    }
    if (errCode.load() != ncclSuccess) break;
    if (progress) {
      lastActive = loopNs;
      polls = 0;
      continue;
    }
    if (++polls < 64) {
      cpuRelax();
      continue;
    }
    const uint64_t idleNs = loopNs - lastActive;
    if (idleNs < spinNs) {
      sched_yield();
      times.yields++;
      if (proxyNowNs() - loopNs > kSlowYieldNs) times.slowYields++;
      continue;
    }
    const uint64_t sleepNs =
        busy() ? 2000 : std::max<uint64_t>(1000, std::min<uint64_t>(idleNs / 8, maxSleepNs));
    struct timespec ts = {0, (long)sleepNs};
    nanosleep(&ts, nullptr);
    times.sleeps++;
    slept = true;
  }
}

ncclResult_t proxyCreate(const ProxyConfig& cfgIn, Proxy** out) {
  MK_ARGCHECK(cfgIn.net != nullptr, "proxy: no net backend");
  MK_ARGCHECK(cfgIn.nranks > 0 && cfgIn.rank >= 0 && cfgIn.rank < cfgIn.nranks,
              "proxy: bad rank %d of %d", cfgIn.rank, cfgIn.nranks);
  MK_ARGCHECK((bool)cfgIn.alltoall || cfgIn.peers.empty(), "proxy: no out-of-band exchange");
  MK_ARGCHECK(cfgIn.nSignals == 0 || cfgIn.signals != nullptr, "proxy: NULL signal array");
  Proxy* p = new Proxy();
  p->cfg = cfgIn;
  ProxyConfig& cfg = p->cfg;
  p->holdNs = (uint64_t)MK_PARAM_INT(ProxyAckHoldUs) * 1000;
  if (cfg.timeoutMs <= 0) cfg.timeoutMs = netTimeoutMs();
  Net* net = cfg.net;
  ncclResult_t res = ncclSuccess;
  std::vector<char> sendH, recvH;
  int64_t deadline;
  NCCLCHECKGOTO(net->getProperties(cfg.netDev, &p->props), res, fail);
  p->rankToPeer.assign(cfg.nranks, -1);
  for (int r : cfg.peers) {
    if (r < 0 || r >= cfg.nranks || r == cfg.rank || p->rankToPeer[r] >= 0) {
      MK_WARN("proxy: bad peer list entry %d (rank %d of %d)", r, cfg.rank, cfg.nranks);
      res = ncclInvalidArgument;
      goto fail;
    }
    p->rankToPeer[r] = (int)p->peers.size();
    p->peers.emplace_back();
    p->peers.back().rank = r;
  }
  for (ProxyRing* r : cfg.rings) p->rings.push_back(RingTrack{r, r->done(), {}});
  // Listen once per peer, exchange handles, then connect and accept everything in one
  // loop (connect/accept never block on the peer, so no pairwise ordering is needed).
  sendH.assign((size_t)cfg.nranks * kOobBlock, 0);
  recvH.assign((size_t)cfg.nranks * kOobBlock, 0);
  for (PeerState& ps : p->peers) {
    char* blk = &sendH[(size_t)ps.rank * kOobBlock];
    NCCLCHECKGOTO(net->listen(cfg.netDev, blk, &ps.listenComm), res, fail);
    const PeerInfo info = {kPeerInfoMagic, cfg.bufType == NCCL_PTR_HOST ? 1u : 0u};
    memcpy(blk + kNetHandleSize, &info, sizeof(info));
  }
  if (!p->peers.empty())
    NCCLCHECKGOTO(cfg.alltoall(sendH.data(), recvH.data(), kOobBlock), res, fail);
  for (PeerState& ps : p->peers) {
    PeerInfo info;
    memcpy(&info, &recvH[(size_t)ps.rank * kOobBlock + kNetHandleSize], sizeof(info));
    ps.inlineOk = cfg.bufType == NCCL_PTR_HOST && info.magic == kPeerInfoMagic && info.recvHost;
  }
  deadline = std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
                 .count() +
             cfg.timeoutMs;
  for (;;) {
    bool all = true;
    for (PeerState& ps : p->peers) {
      if (!ps.sendComm)
        NCCLCHECKGOTO(net->connect(cfg.netDev, &recvH[(size_t)ps.rank * kOobBlock], &ps.sendComm),
                      res, fail);
      if (!ps.recvComm) NCCLCHECKGOTO(net->accept(ps.listenComm, &ps.recvComm), res, fail);
      all &= ps.sendComm && ps.recvComm;
    }
    if (all) break;
    if (std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now().time_since_epoch())
            .count() > deadline) {
      for (PeerState& ps : p->peers)
        if (!ps.sendComm || !ps.recvComm)
          MK_WARN("proxy rank %d: no connection with peer rank %d after %lld ms", cfg.rank, ps.rank,
                  (long long)cfg.timeoutMs);
      res = ncclRemoteError;
      goto fail;
    }
    usleep(1000);
  }
  for (PeerState& ps : p->peers) {
    ps.sendHdrs.reset(new WireHdr[kMaxInflight]);
    ps.recvHdrs.reset(new WireHdr[kMaxInflight]);
    NCCLCHECKGOTO(net->regMr(ps.sendComm, ps.sendHdrs.get(), sizeof(WireHdr) * kMaxInflight,
                             NCCL_PTR_HOST, &ps.sendHdrMh),
                  res, fail);
    NCCLCHECKGOTO(net->regMr(ps.recvComm, ps.recvHdrs.get(), sizeof(WireHdr) * kMaxInflight,
                             NCCL_PTR_HOST, &ps.recvHdrMh),
                  res, fail);
    if (cfg.sendBytes)
      NCCLCHECKGOTO(net->regMr(ps.sendComm, cfg.sendBuf, cfg.sendBytes, cfg.bufType, &ps.sendMh),
                    res, fail);
    if (cfg.recvBytes)
      NCCLCHECKGOTO(net->regMr(ps.recvComm, cfg.recvBuf, cfg.recvBytes, cfg.bufType, &ps.recvMh),
                    res, fail);
  }
  p->thread = std::thread([p] { p->run(); });
  MK_INFO(kProxy, "proxy rank %d: %zu peer(s) over %s, %zu ring(s)", cfg.rank, p->peers.size(),
          net->name(), cfg.rings.size());
  *out = p;
  return ncclSuccess;
fail:
  proxyDestroy(p);
  return res;
}

ncclResult_t proxyDestroy(Proxy* p) {
  if (!p) return ncclSuccess;
  p->stop.store(true);
  if (p->thread.joinable()) {
    p->thread.join();
    ProxyRecvCalls rc;
    for (PeerState& ps : p->peers) {
      NetRecvCounts n;
      if (!ps.recvComm || !p->cfg.net->recvCounts(ps.recvComm, &n)) continue;
      rc.counted = true;
      rc.calls += n.calls, rc.empty += n.empty, rc.msgs += n.msgs;
    }
    proxyReportTimes(p->cfg.rank, p->times, p->cmds.load(), p->batches.load(), rc);
  }
  Net* net = p->cfg.net;
  for (PeerState& ps : p->peers) {
    for (SendBatch* b : ps.sendq) delete b;
    for (RecvBatch* b : ps.recvq) delete b;
    if (ps.sendHdrMh) net->deregMr(ps.sendComm, ps.sendHdrMh);
    if (ps.recvHdrMh) net->deregMr(ps.recvComm, ps.recvHdrMh);
    if (ps.sendMh) net->deregMr(ps.sendComm, ps.sendMh);
    if (ps.recvMh) net->deregMr(ps.recvComm, ps.recvMh);
    if (ps.sendComm) net->closeSend(ps.sendComm);
    if (ps.recvComm) net->closeRecv(ps.recvComm);
    if (ps.listenComm) net->closeListen(ps.listenComm);
  }
  delete p;
  return ncclSuccess;
}

ncclResult_t proxyGetAsyncError(Proxy* p, std::string* msg) {
  std::lock_guard<std::mutex> lk(p->errMu);
  if (msg) *msg = p->errMsg;
  return (ncclResult_t)p->errCode.load();
}

void proxyAbort(Proxy* p) {
  p->stop.store(true);
  for (auto& r : p->rings) r.ring->setAbort();
}

uint64_t proxyCompleted(Proxy* p, int ring) {
  return p->rings.at(ring).ring->done();
}

ProxyStats proxyStats(Proxy* p) {
  ProxyStats s;
  s.cmds = p->cmds.load();
  s.batches = p->batches.load();
  s.bytesSent = p->bytesSent.load();
  s.bytesRecv = p->bytesRecv.load();
  s.signalsApplied = p->signalsApplied.load();
  return s;
}

}  // namespace mk
