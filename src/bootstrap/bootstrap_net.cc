// The message layer of a Bootstrap: creation, receiver thread, send, recv, close.
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <system_error>

#include "bootstrap/bootstrap_impl.h"
#include "bootstrap/ifaces.h"
#include "bootstrap/root.h"
#include "bootstrap/unique_id.h"
#include "base/checks.h"
#include "base/debug.h"
#include "base/param.h"

namespace mk {
namespace {

const char* kindName(uint32_t kind) {
  switch (kind) {
    case kKindUser:
      return "send/recv";
    case kKindAllGather:
      return "allgather";
    case kKindBarrier:
      return "barrier";
    case kKindSplit:
      return "split";
    case kKindInitAddrs:
      return "init";
    default:
      return "?";
  }
}

struct InConn {
  enum State { kHello, kHeader, kPayload };
  Socket sock;
  State state = kHello;
  int peer = -1;  // known once the hello is validated
  int64_t helloDeadline = 0;
  PeerHello hello{};
  MsgHeader hdr{};
  size_t off = 0;
  BootstrapMsg msg;
  bool bye = false;
};

void markPeer(Bootstrap* b, int peer, uint8_t state) {
  std::lock_guard<std::mutex> g(b->mu);
  if (b->peerState[peer] == kPeerOk) b->peerState[peer] = state;
  b->cv.notify_all();
}

void deliver(Bootstrap* b, int peer, const MsgHeader& h, BootstrapMsg&& m) {
  std::lock_guard<std::mutex> g(b->mu);
  b->queue[BootstrapMsgKey{peer, h.kind, h.tag, h.sub}].push_back(std::move(m));
  b->cv.notify_all();
}

const char* checkHello(const Bootstrap* b, const PeerHello& h) {
  if (h.magic != kBootstrapIdMagic) return "bad magic";
  if (h.version != kBootstrapProtocolVersion) return "protocol version mismatch";
  if (h.type != kPeerHello) return "not a peer hello";
  if (h.secret != b->secret) return "wrong secret";
  if (h.commHash != b->commHash) return "another communicator";
  if (h.nranks != b->nranks || h.dst != b->rank) return "wrong destination";
  if (h.src < 0 || h.src >= b->nranks || h.src == b->rank) return "bad source rank";
  return nullptr;
}

// Reads what is available on one connection. Returns false when it is to be closed.
bool rxStep(Bootstrap* b, InConn* c) {
  char peer[kSocketAddrStrLen];
  for (;;) {
    bool closed = false;
    if (c->state == InConn::kHello) {
      const char* why = nullptr;
      if (socketProgressRecv(&c->sock, &c->hello, sizeof(c->hello), &c->off, &closed) !=
              ncclSuccess ||
          closed)
        why = "closed before its hello";
      else if (c->off < sizeof(c->hello))
        return true;
      else
        why = checkHello(b, c->hello);
      if (why != nullptr) {
        MK_INFO(kBootstrap, "Bootstrap rank %d: dropped connection from %s: %s", b->rank,
                socketAddressToString(&c->sock.addr, peer, sizeof(peer)), why);
        return false;
      }
      c->peer = c->hello.src;
      c->state = InConn::kHeader;
      c->off = 0;
    } else if (c->state == InConn::kHeader) {
      ncclResult_t r = socketProgressRecv(&c->sock, &c->hdr, sizeof(c->hdr), &c->off, &closed);
      if (r != ncclSuccess || closed) {
        if (r != ncclSuccess || !c->bye)
          MK_INFO(kBootstrap, "Bootstrap rank %d: connection from rank %d closed unexpectedly",
                  b->rank, c->peer);
        markPeer(b, c->peer, r == ncclSuccess && c->bye ? kPeerClosed : kPeerFailed);
        return false;
      }
      if (c->off < sizeof(c->hdr)) return true;
      c->off = 0;
      if (c->hdr.kind < kKindUser || c->hdr.kind >= kKindMax ||
          c->hdr.size > kBootstrapMaxMsgBytes || c->bye) {
        MK_INFO(kBootstrap, "Bootstrap rank %d: invalid message header from rank %d", b->rank,
                c->peer);
        markPeer(b, c->peer, kPeerFailed);
        return false;
      }
      if (c->hdr.kind == kKindBye) {
        c->bye = true;
        continue;
      }
      c->msg.size = c->hdr.size;
      if (c->msg.size > 0) {
        c->msg.data.reset(new (std::nothrow) char[c->msg.size]);
        if (!c->msg.data) {
          MK_WARN("Bootstrap rank %d: cannot allocate %zu bytes for a message from rank %d",
                  b->rank, c->msg.size, c->peer);
          markPeer(b, c->peer, kPeerFailed);
          return false;
        }
        c->state = InConn::kPayload;
      } else {
        deliver(b, c->peer, c->hdr, std::move(c->msg));
        c->msg = BootstrapMsg();
      }
    } else {
      if (socketProgress(&c->sock, SocketOp::kRecv, c->msg.data.get(), c->msg.size, &c->off) !=
          ncclSuccess) {
        markPeer(b, c->peer, kPeerFailed);
        return false;
      }
      if (c->off < c->msg.size) return true;
      deliver(b, c->peer, c->hdr, std::move(c->msg));
      c->msg = BootstrapMsg();
      c->state = InConn::kHeader;
      c->off = 0;
    }
  }
}

void rxMain(Bootstrap* b) {
  pthread_setname_np(pthread_self(), "mk-boot-rx");
  std::vector<std::unique_ptr<InConn>> conns;
  std::vector<pollfd> pfds;
  int64_t helloTimeout =
      b->timeoutMs < kBootstrapHelloTimeoutMs ? b->timeoutMs : kBootstrapHelloTimeoutMs;
  // accept() failed (out of fds): the listener is left alone until then, doubling up to 1 s,
  // rather than failing again at every wake-up while the connection stays queued.
  int64_t listenPausedUntil = 0, acceptBackoffMs = 10;
  // The oldest connection still without a hello, when it has been so long enough to be
  // evicted for a newcomer (conns stay in arrival order); -1 if none.
  auto evictable = [&](int64_t now) -> int {
    for (size_t i = 0; i < conns.size(); i++)
      if (conns[i]->peer < 0)
        return now - (conns[i]->helloDeadline - helloTimeout) >= kBootstrapEvictAgeMs ? (int)i : -1;
    return -1;
  };
  auto unauthenticated = [&] {
    int n = 0;
    for (auto& c : conns) n += c->peer < 0;
    return n;
  };
  while (!b->stop.load(std::memory_order_acquire)) {
    int unauth = unauthenticated();
    int64_t now0 = socketClockMs();
    bool pollListen =
        now0 >= listenPausedUntil && (unauth < kBootstrapRankMaxPending || evictable(now0) >= 0);
    int waitMs = unauth > 0 ? 50 : 1000;
    if (now0 < listenPausedUntil && listenPausedUntil - now0 < waitMs)
      waitMs = (int)(listenPausedUntil - now0);
    pfds.clear();
    pfds.push_back({b->wakeFd, POLLIN, 0});
    pfds.push_back({b->listen.fd, (short)(pollListen ? POLLIN : 0), 0});
    for (auto& c : conns) pfds.push_back({c->sock.fd, POLLIN, 0});
    int rc = poll(pfds.data(), pfds.size(), waitMs);
    if (rc < 0 && errno != EINTR) {
      MK_WARN("Bootstrap rank %d: poll failed: %s", b->rank, strerror(errno));
      std::lock_guard<std::mutex> g(b->mu);
      b->rxFailed = true;
      b->cv.notify_all();
      break;
    }
    if (pfds[0].revents != 0) {
      uint64_t v;
      (void)!read(b->wakeFd, &v, sizeof(v));
      continue;  // re-check stop
    }
    int64_t now = socketClockMs();
    std::vector<std::unique_ptr<InConn>> keep;
    for (size_t i = 0; i < conns.size(); i++) {
      InConn* c = conns[i].get();
      bool ok = pfds[2 + i].revents == 0 || rxStep(b, c);
      if (ok && c->peer < 0 && now >= c->helloDeadline) {
        char peer[kSocketAddrStrLen];
        MK_INFO_RATELIMITED(kBootstrap, 1000,
                            "Bootstrap rank %d: dropped connection from %s: no hello in time",
                            b->rank, socketAddressToString(&c->sock.addr, peer, sizeof(peer)));
        ok = false;
      }
      if (ok)
        keep.push_back(std::move(conns[i]));
      else
        socketClose(&c->sock);
    }
    conns.swap(keep);
    if (!pollListen || !(pfds[1].revents & POLLIN)) continue;
    unauth = unauthenticated();
    for (int k = 0; k < 1024; k++) {
      if (unauth >= kBootstrapRankMaxPending) {  // full: the oldest silent one makes room
        int e = evictable(now);
        if (e < 0) break;
        socketClose(&conns[e]->sock);
        conns.erase(conns.begin() + e);
        unauth--;
      }
      auto c = std::make_unique<InConn>();
      bool accepted = false;
      if (socketTryAccept(&b->listen, &c->sock, &accepted) != ncclSuccess) {
        listenPausedUntil = now + acceptBackoffMs;
        acceptBackoffMs = acceptBackoffMs * 2 > 1000 ? 1000 : acceptBackoffMs * 2;
        break;
      }
      if (!accepted) break;
      acceptBackoffMs = 10;
      c->helloDeadline = now + helloTimeout;
      conns.push_back(std::move(c));
      unauth++;
    }
  }
  for (auto& c : conns) socketClose(&c->sock);
}

}  // namespace

ncclResult_t bootstrapCreate(int rank, int nranks, uint64_t secret, uint64_t commHash,
                             const uint32_t* abortFlag, Bootstrap** out) {
  ncclResult_t res = ncclSuccess;
  SocketAddress local;
  Bootstrap* b = new (std::nothrow) Bootstrap();
  if (b == nullptr) {
    MK_WARN("Cannot allocate a Bootstrap");
    return ncclSystemError;
  }
  b->rank = rank;
  b->nranks = nranks;
  b->secret = secret;
  b->commHash = commHash;
  b->abortFlag = abortFlag;
  b->timeoutMs = bootstrapTimeoutMs();
  try {
    b->peers.resize(nranks);
    b->out.resize(nranks);
    b->peerState.assign(nranks, kPeerOk);
  } catch (const std::bad_alloc&) {
    MK_WARN("Cannot allocate bootstrap tables for %d ranks", nranks);
    res = ncclSystemError;
    goto fail;
  }
  socketInit(&b->listen, abortFlag, b->timeoutMs);
  NCCLCHECKGOTO(ifBootstrapAddress(&local, nullptr), res, fail);
  NCCLCHECKGOTO(socketListen(&b->listen, &local), res, fail);
  b->peers[rank] = b->listen.addr;
  b->wakeFd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (b->wakeFd < 0) {
    MK_WARN("eventfd failed: %s", strerror(errno));
    res = ncclSystemError;
    goto fail;
  }
  try {
    b->rx = std::thread(rxMain, b);
  } catch (const std::system_error& e) {
    MK_WARN("Cannot start the bootstrap receiver thread: %s", e.what());
    res = ncclSystemError;
    goto fail;
  }
  *out = b;
  return ncclSuccess;
fail:
  bootstrapClose(b);
  return res;
}

ncclResult_t bootstrapSendMsg(Bootstrap* b, int peer, uint32_t kind, uint64_t tag, uint32_t sub,
                              const void* data, size_t size, const uint32_t* extraAbort) {
  NCCLCHECK(socketCheckAbort(b->abortFlag, "Bootstrap send"));
  NCCLCHECK(socketCheckAbort(extraAbort, "Bootstrap send"));
  // The receiver refuses a larger message by dropping the whole connection: refuse it here,
  // where the caller learns why and the connection lives on.
  MK_ARGCHECK((uint64_t)size <= kBootstrapMaxMsgBytes,
              "Bootstrap rank %d: a message of %zu bytes to rank %d exceeds the limit of %llu",
              b->rank, size, peer, (unsigned long long)kBootstrapMaxMsgBytes);
  MsgHeader hdr{kind, sub, tag, (uint64_t)size};
  if (peer == b->rank) {
    BootstrapMsg m;
    m.size = size;
    if (size > 0) {
      m.data.reset(new (std::nothrow) char[size]);
      if (!m.data) {
        MK_WARN("Cannot allocate %zu bytes for a message to self", size);
        return ncclSystemError;
      }
      memcpy(m.data.get(), data, size);
    }
    deliver(b, peer, hdr, std::move(m));
    return ncclSuccess;
  }
  BootstrapOutConn* oc;
  {
    std::lock_guard<std::mutex> g(b->outMu);
    if (!b->out[peer]) {
      b->out[peer].reset(new (std::nothrow) BootstrapOutConn());
      if (!b->out[peer]) return ncclSystemError;
      socketInit(&b->out[peer]->sock, b->abortFlag, b->timeoutMs);
    }
    oc = b->out[peer].get();
  }
  char name[kSocketAddrStrLen];
  socketAddressToString(&b->peers[peer], name, sizeof(name));
  std::lock_guard<std::mutex> g(oc->mu);
  if (oc->failed) {
    MK_WARN("Bootstrap rank %d: the connection to rank %d (%s) failed earlier", b->rank, peer,
            name);
    return ncclRemoteError;
  }
  ncclResult_t res = ncclSuccess;
  // The child's flag, while a split talks through this (parent) connection: its abort must end
  // a connect or send that waits on the parent's sockets too.
  oc->sock.abortFlag2 = extraAbort;
  if (oc->sock.fd < 0) {
    PeerHello h{};
    h.magic = kBootstrapIdMagic;
    h.version = kBootstrapProtocolVersion;
    h.type = kPeerHello;
    h.secret = b->secret;
    h.commHash = b->commHash;
    h.src = b->rank;
    h.dst = peer;
    h.nranks = b->nranks;
    // Peers listen before their address is published, so a refusal means the peer is gone.
    res = socketConnect(&oc->sock, &b->peers[peer], /*retryRefused=*/false);
    if (res == ncclSuccess) res = socketSend(&oc->sock, &h, sizeof(h));
    if (res == ncclInternalError &&
        !(b->abortFlag && __atomic_load_n(b->abortFlag, __ATOMIC_ACQUIRE))) {
      // Only the child was aborted, before any byte of a message: the parent's stream is
      // intact (a partial hello is dropped by the receiver), so a later send may connect again.
      socketClose(&oc->sock);
      oc->sock.abortFlag2 = nullptr;
      return res;
    }
    if (res != ncclSuccess) goto fail;
  }
  if (size <= 4096) {
    // One segment for small messages: header and payload together.
    char buf[sizeof(MsgHeader) + 4096];
    memcpy(buf, &hdr, sizeof(hdr));
    if (size > 0) memcpy(buf + sizeof(hdr), data, size);
    NCCLCHECKGOTO(socketSend(&oc->sock, buf, sizeof(hdr) + size), res, fail);
  } else {
    NCCLCHECKGOTO(socketSend(&oc->sock, &hdr, sizeof(hdr)), res, fail);
    NCCLCHECKGOTO(socketSend(&oc->sock, data, size), res, fail);
  }
  oc->sock.abortFlag2 = nullptr;
  return ncclSuccess;
fail:
  // A partial message would desynchronise the stream: this connection is done for.
  oc->sock.abortFlag2 = nullptr;
  oc->failed = true;
  socketClose(&oc->sock);
  if (res != ncclInternalError &&
      socketCheckAbort(extraAbort, "Bootstrap send") == ncclInternalError)
    return ncclInternalError;
  if (res != ncclInternalError)
    MK_WARN("Bootstrap rank %d: sending %zu bytes (%s) to rank %d (%s) failed", b->rank, size,
            kindName(kind), peer, name);
  return res;
}

ncclResult_t bootstrapRecvMsg(Bootstrap* b, int peer, uint32_t kind, uint64_t tag, uint32_t sub,
                              void* data, size_t size, const uint32_t* extraAbort) {
  BootstrapMsgKey key{peer, kind, tag, sub};
  int64_t start = socketClockMs();
  int64_t deadline = saturatingAdd(start, b->timeoutMs);
  char name[kSocketAddrStrLen];
  std::unique_lock<std::mutex> lk(b->mu);
  for (;;) {
    auto it = b->queue.find(key);
    if (it != b->queue.end()) {
      BootstrapMsg m = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) b->queue.erase(it);
      lk.unlock();
      if (m.size != size) {
        MK_WARN(
            "Bootstrap rank %d: %s message from rank %d (tag %llu) has %zu bytes, the "
            "receiver expected %zu",
            b->rank, kindName(kind), peer, (unsigned long long)tag, m.size, size);
        return ncclInternalError;
      }
      if (size > 0) memcpy(data, m.data.get(), size);
      return ncclSuccess;
    }
    // The abort comes first: failures of peers it provoked must read as the abort.
    if ((b->abortFlag && __atomic_load_n(b->abortFlag, __ATOMIC_ACQUIRE)) ||
        (extraAbort && __atomic_load_n(extraAbort, __ATOMIC_ACQUIRE))) {
      lk.unlock();
      MK_WARN("Bootstrap rank %d: receive from rank %d aborted", b->rank, peer);
      return ncclInternalError;
    }
    uint8_t st = b->peerState[peer];
    bool rxFailed = b->rxFailed;
    if (st != kPeerOk || rxFailed) {
      lk.unlock();
      socketAddressToString(&b->peers[peer], name, sizeof(name));
      if (rxFailed) {
        MK_WARN("Bootstrap rank %d: receiver thread failed", b->rank);
        return ncclSystemError;
      }
      MK_WARN("Bootstrap rank %d: rank %d (%s) %s before sending the expected %s message", b->rank,
              peer, name,
              st == kPeerClosed ? "closed its bootstrap" : "lost its connection (process died?)",
              kindName(kind));
      return ncclRemoteError;
    }
    int64_t now = socketClockMs();
    if (now >= deadline) {
      lk.unlock();
      socketAddressToString(&b->peers[peer], name, sizeof(name));
      MK_WARN(
          "Bootstrap rank %d: no %s message from rank %d (%s) after %lld ms "
          "(MKERNEL_BOOTSTRAP_TIMEOUT_S)",
          b->rank, kindName(kind), peer, name, (long long)(now - start));
      return ncclRemoteError;
    }
    int64_t wait = deadline - now < kSocketPollSliceMs ? deadline - now : kSocketPollSliceMs;
    b->cv.wait_for(lk, std::chrono::milliseconds(wait));
  }
}

ncclResult_t bootstrapClose(Bootstrap* b) {
  if (b == nullptr) return ncclSuccess;
  for (auto& oc : b->out) {
    if (!oc) continue;
    std::lock_guard<std::mutex> g(oc->mu);
    if (oc->sock.fd >= 0 && !oc->failed) {
      // Best effort and non-blocking: a peer that does not get it just sees a failed peer.
      MsgHeader bye{kKindBye, 0, 0, 0};
      size_t off = 0;
      socketProgress(&oc->sock, SocketOp::kSend, &bye, sizeof(bye), &off);
    }
    socketClose(&oc->sock);
  }
  if (b->rx.joinable()) {
    b->stop.store(true, std::memory_order_release);
    uint64_t one = 1;
    (void)!write(b->wakeFd, &one, sizeof(one));
    b->rx.join();
  }
  socketClose(&b->listen);
  if (b->wakeFd >= 0) close(b->wakeFd);
  delete b;
  return ncclSuccess;
}

}  // namespace mk
