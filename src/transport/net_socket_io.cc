// Frame movement of the socket net backend (see net_socket_impl.h): the helper threads of
// the striped connections and the caller-driven inline connection.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "base/checks.h"
#include "transport/net_socket_impl.h"
#include "transport/net_sockutil.h"

namespace mk {
namespace sock {

namespace {

std::string ioWhy(NetIo io, int err) {
  if (io == NetIo::kClosed)
    return err ? std::string("connection reset (") + strerror(err) + ")"
               : std::string("connection closed (peer process exited or closed its comm)");
  return strerror(err);
}

void recvFailed(Comm* c, NetIo io, int err) {
  setError(c, ncclRemoteError,
           "socket net: receive from peer " + c->peer + " failed: " + ioWhy(io, err));
}

// Clean EOF between frames on one connection: the sender closed it after every frame it
// sent there was consumed. Other connections may still carry frames, so the comm is
// finished only when all of them are; requests still pending then can never complete.
void connEof(Comm* c) {
  bool all;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    all = ++c->eofs == c->nconns;
  }
  if (all)
    setError(c, ncclRemoteError,
             "socket net: peer " + c->peer +
                 " closed the connection (peer process exited or closed its comm)",
             /*quiet=*/true);
}

// offset and len are checked one at a time: offset + len of a corrupt frame can wrap
// around 2^64 to a value within total, and the payload would land before the buffer.
bool frameValid(const Frame& f) {
  return f.magic == kFrameMagic && f.len <= kMaxChunk && f.offset <= f.total &&
         f.len <= f.total - f.offset;
}

// Matches frame f to its receive (c->mu held; f.seq < c->nextSeq). False with *code and
// *bad set when the frame fits no posted receive.
bool bindFrame(Comm* c, const Frame& f, Request** out, int* jOut, int* bufOut, ncclResult_t* code,
               std::string* bad) {
  Request* req = nullptr;
  for (Request* r : c->posted)
    if (f.seq >= r->baseSeq && f.seq < r->baseSeq + (uint64_t)r->n) req = r;
  *code = ncclInvalidUsage;
  if (req == nullptr) {
    *code = ncclInternalError;
    *bad = "socket net: no receive for message from " + c->peer;
    return false;
  }
  const int j = (int)(f.seq - req->baseSeq);
  if (req->bound[j] < 0) {
    int pick = -1;
    for (int i = 0; i < req->n && pick < 0; i++)
      if (!req->used[i] && req->tags[i] == f.tag) pick = i;
    if (pick < 0) {
      *bad = "socket net: message with tag " + std::to_string(f.tag) + " from " + c->peer +
             " matches no posted receive buffer";
      return false;
    }
    if (f.total > req->cap[pick]) {
      *bad = "socket net: message of " + std::to_string(f.total) + " bytes from " + c->peer +
             " exceeds the receive buffer (" + std::to_string(req->cap[pick]) + " bytes)";
      return false;
    }
    req->bound[j] = pick;
    req->used[pick] = true;
    req->got[pick] = f.total;
    req->msgChunksLeft[j] = numChunks(f.total, c->dataConns());
    req->msgChunksUnbound[j] = req->msgChunksLeft[j] - 1;
  } else if (f.total != req->got[req->bound[j]]) {
    // Only the message's first frame was checked against the buffer's capacity; a later
    // frame that says the message is larger would land its payload past the buffer's end.
    *code = ncclSystemError;
    *bad = "socket net: corrupt frame from peer " + c->peer + " (message of " +
           std::to_string(req->got[req->bound[j]]) + " bytes, a later frame says " +
           std::to_string(f.total) + ")";
    return false;
  } else if (req->msgChunksUnbound[j] == 0) {
    *code = ncclSystemError;
    *bad = "socket net: corrupt frame from peer " + c->peer + " (more frames than a message of " +
           std::to_string(f.total) + " bytes has)";
    return false;
  } else {
    req->msgChunksUnbound[j]--;
  }
  *out = req;
  *jOut = j;
  *bufOut = req->bound[j];
  return true;
}

// A chunk of message j of req has fully landed (c->mu held).
void chunkLanded(Comm* c, Request* req, int j) {
  if (--req->msgChunksLeft[j] == 0 && --req->msgsLeft == 0) {
    for (auto it = c->posted.begin(); it != c->posted.end(); ++it)
      if (*it == req) {
        c->posted.erase(it);
        break;
      }
    req->done.store(true, std::memory_order_release);
  }
}

// ---- inline connection ----------------------------------------------------------------

// Writes queued frames, up to kTxGatherFrames per sendmsg (frame header and payload of each
// as iovecs, so nothing is copied); a partial write leaves the rest for a later call.
void progressTx(Comm* c) {
  const int fd = c->conns[0].fd;
  while (!c->txq.empty() && c->error.load(std::memory_order_relaxed) == ncclSuccess) {
    Frame fr[kTxGatherFrames];
    struct iovec iov[2 * kTxGatherFrames];
    int n = 0;
    const size_t nf = std::min(c->txq.size(), (size_t)kTxGatherFrames);
    for (size_t k = 0; k < nf; k++) {
      const Task& t = c->txq[k];
      fr[k] = Frame{t.seq, t.total, t.offset, t.len, t.tag, kFrameMagic};
      if (t.sent < sizeof(Frame)) {
        iov[n++] = {reinterpret_cast<char*>(&fr[k]) + t.sent, sizeof(Frame) - t.sent};
        if (t.len) iov[n++] = {const_cast<char*>(t.ptr), t.len};
      } else {
        iov[n++] = {const_cast<char*>(t.ptr) + (t.sent - sizeof(Frame)),
                    sizeof(Frame) + t.len - t.sent};
      }
    }
    struct msghdr m = {};
    m.msg_iov = iov;
    m.msg_iovlen = n;
    ssize_t r = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    c->txCalls++;
    if (r > 0) {
      // Hand the written bytes out to the frames in order; only the last one touched may
      // be left partial.
      size_t left = (size_t)r;
      while (left > 0) {
        Task& t = c->txq.front();
        const size_t take = std::min(left, sizeof(Frame) + t.len - t.sent);
        t.sent += take;
        left -= take;
        if (t.sent == sizeof(Frame) + t.len) {
          t.req->chunksLeft.fetch_sub(1, std::memory_order_release);
          c->txq.pop_front();
          c->txFrames++;
        }
      }
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // Socket buffer full: the rest goes on a later call. The receiver never writes on a
      // data socket, so a hang-up or readable EOF means it is gone.
      struct pollfd p = {fd, POLLRDHUP, 0};
      if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
        setError(c, ncclRemoteError,
                 "socket net: send to peer " + c->peer +
                     " failed: " + ioWhy(NetIo::kClosed, ECONNRESET));
      return;
    }
    const int err = r < 0 ? errno : EIO;
    setError(c, ncclRemoteError,
             "socket net: send to peer " + c->peer + " failed: " +
                 ioWhy(err == EPIPE || err == ECONNRESET ? NetIo::kClosed : NetIo::kError, err));
    return;
  }
}

// One non-blocking read: > 0 bytes, 0 would block, -1 error recorded (or clean EOF, *eof).
ssize_t readSome(Comm* c, int fd, void* p, size_t len, bool* eof) {
  for (;;) {
    ssize_t r = recv(fd, p, len, MSG_DONTWAIT);
    if (r > 0) return r;
    if (r == 0) {
      *eof = true;
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    recvFailed(c, errno == ECONNRESET ? NetIo::kClosed : NetIo::kError, errno);
    return -1;
  }
}

// Reads the inline connection into its read-ahead buffer (empty when called): one recv()
// for up to kInlineRxBuf bytes. *drained: the read came back short, so the socket had no
// more and a second read now would only find nothing. Returns readSome's verdict.
ssize_t fillRx(Comm* c, int fd, bool* drained, bool* eof) {
  InlineRx& s = c->rx;
  s.inPos = s.inEnd = 0;
  ssize_t r = readSome(c, fd, s.in.get(), kInlineRxBuf, eof);
  s.calls++;
  if (r == 0) s.empty++;
  if (r > 0) {
    s.inEnd = (size_t)r;
    *drained = s.inEnd < kInlineRxBuf;
  }
  return r;
}

// Takes up to n read-ahead bytes into dst; returns how many.
size_t takeRx(InlineRx& s, void* dst, size_t n) {
  n = std::min(n, s.inEnd - s.inPos);
  memcpy(dst, s.in.get() + s.inPos, n);
  s.inPos += n;
  return n;
}

// Frames are parsed out of the read-ahead buffer, so a small message (header and payload
// arrive together) costs one recv(), and a burst of them one recv() per kInlineRxBuf bytes.
// A read that came back short emptied the socket: the call then stops when it needs more
// bytes instead of asking again (the caller polls; the next call reads).
void progressRx(Comm* c) {
  const int fd = c->conns[0].fd;
  InlineRx& s = c->rx;
  if (!s.in) {
    s.in.reset(new (std::nothrow) char[kInlineRxBuf]);
    if (!s.in) {
      setError(c, ncclSystemError, "socket net: cannot allocate a receive buffer");
      return;
    }
  }
  bool drained = false;
  for (int frames = 0; frames < kInlineFramesPerCall && !s.closed; frames++) {
    if (c->error.load(std::memory_order_relaxed) != ncclSuccess) return;
    InlineRx::Cur& f = s.cur;
    bool eof = false;
    while (f.hdrGot < sizeof(Frame)) {
      if (s.inPos == s.inEnd) {
        if (drained) return;
        ssize_t r = fillRx(c, fd, &drained, &eof);
        if (r == 0) return;
        if (r < 0) {
          if (eof && f.hdrGot == 0) {
            s.closed = true;
            connEof(c);
          } else if (eof) {
            recvFailed(c, NetIo::kClosed, 0);
          }
          return;
        }
      }
      f.hdrGot += takeRx(s, reinterpret_cast<char*>(&f.f) + f.hdrGot, sizeof(Frame) - f.hdrGot);
    }
    if (!f.bound) {
      if (!frameValid(f.f)) {
        setError(c, ncclSystemError, "socket net: corrupt frame from peer " + c->peer);
        return;
      }
      std::string bad;
      ncclResult_t code = ncclSuccess;
      {
        std::lock_guard<std::mutex> lk(c->mu);
        if (f.f.seq >= c->nextSeq) return;  // its receive is not posted yet
        f.bound = bindFrame(c, f.f, &f.req, &f.j, &f.buf, &code, &bad);
      }
      if (!f.bound) {
        setError(c, code, bad);
        return;
      }
    }
    char* dst = static_cast<char*>(f.req->data[f.buf]) + f.f.offset;
    while (f.payGot < f.f.len) {
      const size_t want = f.f.len - f.payGot;
      if (s.inPos < s.inEnd) {
        f.payGot += takeRx(s, dst + f.payGot, want);
        continue;
      }
      if (drained) return;
      ssize_t r;
      if (want >= kInlineRxBuf) {  // large: straight into the receive buffer
        r = readSome(c, fd, dst + f.payGot, want, &eof);
        s.calls++;
        if (r == 0) s.empty++;
        if (r > 0) {
          f.payGot += (size_t)r;
          drained = (size_t)r < want;
        }
      } else {
        r = fillRx(c, fd, &drained, &eof);
      }
      if (r == 0) return;
      if (r < 0) {
        if (eof) recvFailed(c, NetIo::kClosed, 0);
        return;
      }
    }
    {
      std::lock_guard<std::mutex> lk(c->mu);
      chunkLanded(c, f.req, f.j);
    }
    s.frames++;
    s.cur = InlineRx::Cur{};
  }
}

}  // namespace

size_t chunkBytes(size_t total, int dataConns) {
  const int n = dataConns > 0 ? dataConns : 1;
  size_t c = (total + n - 1) / n;
  c = (c + 4095) & ~(size_t)4095;
  if (c < kMinChunk) c = kMinChunk;
  if (c > kMaxChunk) c = kMaxChunk;
  return c;
}

uint64_t numChunks(size_t total, int dataConns) {
  if (total == 0) return 1;
  size_t c = chunkBytes(total, dataConns);
  return (total + c - 1) / c;
}

void setError(Comm* c, ncclResult_t res, const std::string& msg, bool quiet) {
  std::lock_guard<std::mutex> lk(c->mu);
  if (c->error.load() != ncclSuccess) return;
  c->errMsg = msg;
  c->error.store(res);
  c->errWarned = !quiet;
  if (!quiet) MK_WARN("%s", msg.c_str());
  c->cv.notify_all();
}

void progressInline(Comm* c) {
  if (!c->inlineConn) return;
  std::unique_lock<std::mutex> io(c->ioMu, std::try_to_lock);
  if (!io.owns_lock()) return;
  if (c->isSend)
    progressTx(c);
  else
    progressRx(c);
}

void sendThread(Comm* c, Conn* conn) {
  std::vector<char> small(sizeof(Frame) + 4096);
  for (;;) {
    Task t;
    {
      std::unique_lock<std::mutex> lk(conn->mu);
      conn->cv.wait(lk, [&] { return c->stop.load() || !conn->queue.empty(); });
      if (c->stop.load()) return;
      t = conn->queue.front();
      conn->queue.pop_front();
    }
    if (c->error.load() != ncclSuccess) continue;  // the comm is dead; test() reports it
    Frame f = {t.seq, t.total, t.offset, t.len, t.tag, kFrameMagic};
    int err = 0;
    NetIo io;
    if (t.len <= 4096) {  // one segment for small messages (TCP_NODELAY is on)
      memcpy(small.data(), &f, sizeof(f));
      if (t.len) memcpy(small.data() + sizeof(f), t.ptr, t.len);
      io = netSendAll(conn->fd, small.data(), sizeof(f) + t.len, &c->stop, &err);
    } else {
      io = netSendAll(conn->fd, &f, sizeof(f), &c->stop, &err);
      if (io == NetIo::kOk) io = netSendAll(conn->fd, t.ptr, t.len, &c->stop, &err);
    }
    if (io == NetIo::kAborted) return;
    if (io != NetIo::kOk) {
      setError(c, ncclRemoteError,
               "socket net: send to peer " + c->peer + " failed: " + ioWhy(io, err));
      continue;
    }
    t.req->chunksLeft.fetch_sub(1, std::memory_order_release);
  }
}

void recvThread(Comm* c, Conn* conn) {
  for (;;) {
    Frame f;
    int err = 0;
    NetIo io = netRecvAll(conn->fd, &f, sizeof(f), &c->stop, &err);
    if (io == NetIo::kAborted) return;
    if (io == NetIo::kClosed && err == 0) {
      connEof(c);
      return;
    }
    if (io != NetIo::kOk) {
      recvFailed(c, io, err);
      return;
    }
    if (!frameValid(f)) {
      setError(c, ncclSystemError, "socket net: corrupt frame from peer " + c->peer);
      return;
    }
    Request* req = nullptr;
    int j = 0, buf = 0;
    {
      std::unique_lock<std::mutex> lk(c->mu);
      c->cv.wait(lk, [&] { return c->stop.load() || f.seq < c->nextSeq; });
      if (c->stop.load()) return;
      std::string bad;
      ncclResult_t code = ncclSuccess;
      if (!bindFrame(c, f, &req, &j, &buf, &code, &bad)) {
        lk.unlock();
        setError(c, code, bad);
        return;
      }
    }
    if (f.len) {
      io = netRecvAll(conn->fd, static_cast<char*>(req->data[buf]) + f.offset, f.len, &c->stop,
                      &err);
      if (io == NetIo::kAborted) return;
      if (io != NetIo::kOk) {
        recvFailed(c, io, err);
        return;
      }
    }
    std::lock_guard<std::mutex> lk(c->mu);
    chunkLanded(c, req, j);
  }
}

}  // namespace sock
}  // namespace mk
