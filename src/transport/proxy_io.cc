// Proxy engine, the moving parts (proxy.h has the protocol, proxy_impl.h the state): ring
// commands into batches per peer (held acks wait for a batch to ride with), batches out as
// header + data messages, incoming headers parsed and checked, data landed, signals applied in
// order.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "transport/proxy_impl.h"

namespace mk {

using namespace prx;  // NOLINT: the engine's own types

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
      // A group (an inline put of 9..64 bytes): poll hands it out whole; a header without
      // its continuation slots (a group larger than the ring) is a broken producer, and so
      // is a header that poll keeps stopping at (stalledGroupTooLong, below).
      const uint64_t g = proxyGroupSlots(c.op, c.bytes);
      if (g > 1 && (uint64_t)(n - k) < g) {
        setError(ncclInvalidUsage, -1, "invalid ring command (inline group cut short)");
        return true;
      }
      if (c.op == kProxyNop) {
        retire((int)i, ticket);
        continue;
      }
      const uint32_t op = c.op & ~kProxyInline;
      const bool inl = (c.op & kProxyInline) != 0;
      bool bad = op > kProxySignal || (c.sigOp & ~kSignalLazy) > kSignalAdd ||
                 c.peer >= rankToPeer.size() || rankToPeer[c.peer] < 0;
      if (!bad && inl)  // data in the command: a small put to a peer that takes it inline
        bad = (op != kProxyPut && op != kProxyPutSignal) || c.bytes > kProxyInlineExtMax ||
              !peers[rankToPeer[c.peer]].inlineOk;
      else if (!bad && op != kProxySignal)
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
      const bool lazy = c.op == kProxySignal && c.sigOp == (kSignalSet | kSignalLazy);
      const bool held = holdNs > 0 && lazy && ps.recvSmall && ps.lastUrgentNs != 0 &&
                        seenNs - ps.lastUrgentNs < 4 * holdNs;
      Pending pd{c, {}, (int)i, ticket, seenNs, held};
      if (g > 1) {
        // Continuation slots: their data joins the command; as tickets they are complete at
        // once (nothing of theirs is left to send), done still waits for the header's.
        for (uint64_t j = 1; j < g; j++) {
          const uint64_t off = (j - 1) * kProxyContBytes;
          const uint64_t left = c.bytes - kProxyInlineMax - off;
          memcpy(pd.ext + off, reinterpret_cast<const char*>(&buf[k + j]) + sizeof(uint64_t),
                 left < kProxyContBytes ? left : kProxyContBytes);
          rings[i].flags.push_back(0);
          retire((int)i, ticket + j);
        }
        k += (int)(g - 1);
      }
      ps.queued.push_back(pd);
      if (!held) ps.urgent++;
      // Only real traffic (data, eager signals) is something later acks may ride with: an ack
      // sent at once because nothing was going to the peer does not make the next one wait.
      if (!lazy) ps.lastUrgentNs = seenNs;
      // A signal has no source data: a held one is complete for the ring at once, so that
      // waits on the ring's done counter (quiet, staging slots) never wait out a hold, and
      // a comm destroyed while one is held leaves a clean ring.
      if (held) retire((int)i, ticket);
      cmds.fetch_add(1, std::memory_order_relaxed);
    }
    any |= n > 0;
    if (stalledGroupTooLong(rings[i])) return true;
  }
  return any;
}

bool Proxy::stalledGroupTooLong(RingTrack& t) {
  uint64_t ticket = 0;
  if (!t.ring->stalledGroup(&ticket)) {
    t.stallTicket = RingTrack::kNoStall;
    return false;
  }
  const uint64_t now = proxyNowNs();
  if (ticket != t.stallTicket) {
    t.stallTicket = ticket;
    t.stallSinceNs = now;
    return false;
  }
  if (now - t.stallSinceNs < kGroupStallNs) return false;
  char m[160];
  snprintf(m, sizeof(m),
           "invalid ring command (inline group cut short: ticket %llu's header valid, its "
           "continuation slot not, for %llu ms)",
           (unsigned long long)ticket, (unsigned long long)((now - t.stallSinceNs) / 1000000));
  setError(ncclInvalidUsage, -1, m);
  return true;
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
      // A command carrying its data travels only inline: when the header is full it opens
      // the next batch.
      const ProxyCmd& f = ps.queued.front().cmd;
      if ((f.op & kProxyInline) && inl + inlineSpan(f.bytes) > kInlineCap) break;
      Pending pd = ps.queued.front();
      ps.queued.pop_front();
      if (!pd.held) ps.urgent--;
      const ProxyCmd& c = pd.cmd;
      ProxyWireCmd& w = b->hdr->cmds[n];
      const bool inCmd = (c.op & kProxyInline) != 0;
      const uint32_t op = c.op & ~kProxyInline;
      w = ProxyWireCmd{
          op, c.sigOp & ~kSignalLazy, c.dstOff, op == kProxySignal ? 0 : c.bytes, c.slot, c.value};
      // Inline: the data carried in the command (drainRings checked: <= 8 bytes, a peer that
      // takes inline data), or a small put from the window that fits. The GPU made the
      // window's source visible before it published the command (fence, then the release of
      // its valid word, which drainRings acquired).
      if (inCmd || (ps.inlineOk && w.bytes > 0 && inl + inlineSpan(w.bytes) <= kInlineCap)) {
        if (inCmd) {  // the first 8 bytes in srcOff, the rest (9..64-byte puts) in ext
          const uint64_t head = std::min<uint64_t>(w.bytes, kProxyInlineMax);
          memcpy(b->hdr->inl + inl, &c.srcOff, head);
          if (w.bytes > head) memcpy(b->hdr->inl + inl + head, pd.ext, w.bytes - head);
        } else {
          memcpy(b->hdr->inl + inl, static_cast<const char*>(cfg.sendBuf) + c.srcOff, w.bytes);
        }
        inl += inlineSpan(w.bytes);
        if (w.bytes > 0) w.op |= kWireInline;
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
  // Post in order: batch k+1 only after every message of batch k is posted. A busy backend
  // ends the posting, not the pass: only test() frees requests (and moves a coalesced
  // connection's queued frames), so the completion loop below must still run.
  bool busy = false;
  for (SendBatch* b : ps.sendq) {
    if (!b->hdrPosted) {
      const uint64_t callNs = proxyNowNs();
      if (netFailed(net->isend(ps.sendComm, b->hdr, b->msgBytes, kTagHdr, ps.sendHdrMh, &b->hdrReq),
                    ps.rank, "isend(header)"))
        return true;
      if (!b->hdrReq) break;  // backend busy
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
      if (!ch.req) {
        busy = true;
        break;
      }
      b->nextPost++;
      progress = true;
    }
    if (busy) break;
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
  bool recvBusy = false;
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
      if (!ch.req) {  // backend busy: landing below still tests (and frees) what is posted
        recvBusy = true;
        break;
      }
      b->nextPost++;
      progress = true;
    }
    if (recvBusy) break;
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

}  // namespace mk
