// Socket (TCP) net backend: always available, the fallback and the test transport.
//
// A send/recv comm pair is MKERNEL_SOCKET_NCONNS TCP connections, each served by its own
// helper thread on both sides, so isend/irecv only queue work and return. Message m is
// cut into chunks; chunk i travels on connection (m + i) % nconns behind a small frame
// header {seq, total, offset, len, tag}. Because each connection carries frames in seq
// order and the receiver looks a message up by seq, large messages stripe over all
// connections while small ones spread round-robin, and nothing needs a control channel.
// Receives match messages in posting order (a multi-receive of n buffers takes the next
// n seqs, placing each by tag). Flow control is TCP's: a receiver thread reads a frame's
// payload only once the matching irecv is posted.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_set>

#include "base/checks.h"
#include "base/param.h"
#include "transport/net.h"
#include "bootstrap/ifaces.h"
#include "bootstrap/socket.h"
#include "transport/net_sockutil.h"

namespace mk {
namespace {

constexpr uint64_t kHandleMagic = 0x316b636f732d6b6dull;  // "mk-sock1"
constexpr uint64_t kHelloMagic = 0x6f6c6c65682d6b6dull;   // "mk-hello"
constexpr uint32_t kFrameMagic = 0x4d4b4652u;
constexpr int kMaxConns = 16;
constexpr int kMaxRequests = 1024;  // outstanding per comm; beyond, isend/irecv say "busy"
constexpr size_t kMinChunk = 128 << 10;
constexpr size_t kMaxChunk = 4 << 20;

struct SockHandle {
  uint64_t magic;
  SocketWireAddress addr;  // byte-order independent: the handle crosses hosts
};
static_assert(sizeof(SockHandle) <= kNetHandleSize, "socket handle too large");

struct Hello {
  uint64_t magic;
  uint64_t nonce;  // groups the connections of one connect() at the acceptor
  uint32_t index;
  uint32_t nconns;
};

struct Frame {
  uint64_t seq;
  uint64_t total;
  uint64_t offset;
  uint64_t len;
  int32_t tag;
  uint32_t magic;
};

// Both sides derive the chunking from (total, nconns) alone.
size_t chunkBytes(size_t total, int nconns) {
  size_t c = (total + nconns - 1) / nconns;
  c = (c + 4095) & ~(size_t)4095;
  if (c < kMinChunk) c = kMinChunk;
  if (c > kMaxChunk) c = kMaxChunk;
  return c;
}
uint64_t numChunks(size_t total, int nconns) {
  if (total == 0) return 1;
  size_t c = chunkBytes(total, nconns);
  return (total + c - 1) / c;
}

struct Comm;

struct Request {
  Comm* comm = nullptr;
  bool isSend = false;
  // send
  std::atomic<uint64_t> chunksLeft{0};
  size_t size = 0;
  // recv (fields guarded by comm->mu, except done)
  int n = 0;
  uint64_t baseSeq = 0;
  void* data[kNetMaxRecvs] = {};
  size_t cap[kNetMaxRecvs] = {};
  int tags[kNetMaxRecvs] = {};
  size_t got[kNetMaxRecvs] = {};
  bool used[kNetMaxRecvs] = {};
  int bound[kNetMaxRecvs] = {};  // message j of this request -> buffer index, -1 unbound
  uint64_t msgChunksLeft[kNetMaxRecvs] = {};
  int msgsLeft = 0;
  std::atomic<bool> done{false};
};

struct Task {
  Request* req;
  uint64_t seq;
  size_t total, offset, len;
  int tag;
  const char* ptr;
};

struct Conn {
  int fd = -1;
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Task> queue;  // send side
};

struct Comm {
  bool isSend = false;
  std::string peer;
  int nconns = 0;
  Conn conns[kMaxConns];
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> error{ncclSuccess};
  std::string errMsg;
  bool errWarned = false;       // a quiet error (peer closed) is logged when first reported
  int eofs = 0;                 // recv: connections that reached a clean EOF
  uint64_t nextSeq = 0;         // send: next message; recv: seqs covered by posted irecvs
  std::deque<Request*> posted;  // recv: requests with messages still to land
  std::unordered_set<Request*> live;
};

struct Pending {
  int nconns = 0;
  int have = 0;
  int fds[kMaxConns];
};

struct Listen {
  Socket sock;
  std::vector<int> handshaking;        // accepted, Hello not read yet
  std::map<uint64_t, Pending> groups;  // by connector nonce
};

struct Mr {
  void* data;
  size_t size;
};

// quiet: the peer closed between messages, which is how every comm ends; it becomes a
// warning only if a request is still waiting (checkError).
void setError(Comm* c, ncclResult_t res, const std::string& msg, bool quiet = false) {
  std::lock_guard<std::mutex> lk(c->mu);
  if (c->error.load() != ncclSuccess) return;
  c->errMsg = msg;
  c->error.store(res);
  c->errWarned = !quiet;
  if (!quiet) MK_WARN("%s", msg.c_str());
  c->cv.notify_all();
}

std::string ioWhy(NetIo io, int err) {
  if (io == NetIo::kClosed)
    return err ? std::string("connection reset (") + strerror(err) + ")"
               : std::string("connection closed (peer process exited or closed its comm)");
  return strerror(err);
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
      // Clean EOF between frames: the sender closed this connection, after every frame it
      // sent on it was consumed here. Other connections may still carry frames, so the
      // comm is finished only when all of them are; requests still pending then can
      // never complete.
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
      return;
    }
    if (io != NetIo::kOk) {
      setError(c, ncclRemoteError,
               "socket net: receive from peer " + c->peer + " failed: " + ioWhy(io, err));
      return;
    }
    if (f.magic != kFrameMagic || f.offset + f.len > f.total || f.len > kMaxChunk) {
      setError(c, ncclSystemError, "socket net: corrupt frame from peer " + c->peer);
      return;
    }
    Request* req = nullptr;
    int j = 0, buf = 0;
    {
      std::unique_lock<std::mutex> lk(c->mu);
      c->cv.wait(lk, [&] { return c->stop.load() || f.seq < c->nextSeq; });
      if (c->stop.load()) return;
      for (Request* r : c->posted) {
        if (f.seq >= r->baseSeq && f.seq < r->baseSeq + (uint64_t)r->n) req = r;
      }
      if (req == nullptr) {
        lk.unlock();
        setError(c, ncclInternalError, "socket net: no receive for message from " + c->peer);
        return;
      }
      j = (int)(f.seq - req->baseSeq);
      if (req->bound[j] < 0) {
        int pick = -1;
        for (int i = 0; i < req->n && pick < 0; i++)
          if (!req->used[i] && req->tags[i] == f.tag) pick = i;
        std::string bad;
        if (pick < 0) {
          bad = "socket net: message with tag " + std::to_string(f.tag) + " from " + c->peer +
                " matches no posted receive buffer";
        } else if (f.total > req->cap[pick]) {
          bad = "socket net: message of " + std::to_string(f.total) + " bytes from " + c->peer +
                " exceeds the receive buffer (" + std::to_string(req->cap[pick]) + " bytes)";
        }
        if (!bad.empty()) {
          lk.unlock();
          setError(c, ncclInvalidUsage, bad);
          return;
        }
        req->bound[j] = pick;
        req->used[pick] = true;
        req->got[pick] = f.total;
        req->msgChunksLeft[j] = numChunks(f.total, c->nconns);
      }
      buf = req->bound[j];
    }
    if (f.len) {
      io = netRecvAll(conn->fd, static_cast<char*>(req->data[buf]) + f.offset, f.len, &c->stop,
                      &err);
      if (io == NetIo::kAborted) return;
      if (io != NetIo::kOk) {
        setError(c, ncclRemoteError,
                 "socket net: receive from peer " + c->peer + " failed: " + ioWhy(io, err));
        return;
      }
    }
    std::lock_guard<std::mutex> lk(c->mu);
    if (--req->msgChunksLeft[j] == 0 && --req->msgsLeft == 0) {
      for (auto it = c->posted.begin(); it != c->posted.end(); ++it)
        if (*it == req) {
          c->posted.erase(it);
          break;
        }
      req->done.store(true, std::memory_order_release);
    }
  }
}

ncclResult_t connectOne(const SocketAddress& addr, int* outFd) {
  Socket sock;
  socketInit(&sock, nullptr, netTimeoutMs());
  // The listener existed when its handle was made, but the peer may still be starting
  // up on a slow host: retry refusals until the deadline.
  NCCLCHECK(socketConnect(&sock, &addr, /*retryRefused=*/true));
  *outFd = sock.fd;
  return netTuneSocket(sock.fd);
}

void startThreads(Comm* c) {
  for (int i = 0; i < c->nconns; i++) {
    Conn* conn = &c->conns[i];
    conn->thread = c->isSend ? std::thread(sendThread, c, conn) : std::thread(recvThread, c, conn);
  }
}

void destroyComm(Comm* c) {
  c->stop.store(true);
  {
    std::lock_guard<std::mutex> lk(c->mu);
    c->cv.notify_all();
  }
  for (int i = 0; i < c->nconns; i++) {
    {
      std::lock_guard<std::mutex> lk(c->conns[i].mu);
      c->conns[i].cv.notify_all();
    }
  }
  for (int i = 0; i < c->nconns; i++) {
    if (c->conns[i].thread.joinable()) c->conns[i].thread.join();
    if (c->conns[i].fd >= 0) close(c->conns[i].fd);
  }
  for (Request* r : c->live) delete r;
  delete c;
}

class SocketNet : public Net {
 public:
  explicit SocketNet(std::vector<NetIf> ifs) : ifs_(std::move(ifs)) {}
  const char* name() const override { return "socket"; }

  ncclResult_t devices(int* ndev) override {
    *ndev = (int)ifs_.size();
    return ncclSuccess;
  }

  ncclResult_t getProperties(int dev, NetProperties* p) override {
    MK_ARGCHECK(dev >= 0 && dev < (int)ifs_.size(), "socket net: bad device %d", dev);
    *p = NetProperties();
    p->name = ifs_[dev].name;
    std::string sys = "/sys/class/net/" + ifs_[dev].name;
    char real[PATH_MAX];
    if (realpath((sys + "/device").c_str(), real)) p->pciPath = real;
    std::ifstream speed(sys + "/speed");
    int mbps = 0;
    if (speed >> mbps && mbps > 0) p->speedMbps = mbps;
    p->ptrSupport = NCCL_PTR_HOST;
    p->maxRecvs = kNetMaxRecvs;
    p->maxComms = 65536;
    p->maxP2pBytes = NCCL_MAX_NET_SIZE_BYTES;
    p->maxCollBytes = NCCL_MAX_NET_SIZE_BYTES;
    p->guid = (uint64_t)dev;
    return ncclSuccess;
  }

  ncclResult_t listen(int dev, void* handle, void** listenComm) override {
    MK_ARGCHECK(dev >= 0 && dev < (int)ifs_.size(), "socket net: bad device %d", dev);
    MK_ARGCHECK(handle && listenComm, "socket net: listen with NULL handle/comm");
    SocketAddress addr = ifs_[dev].addr;
    socketAddressSetPort(&addr, 0);
    Listen* l = new Listen();
    socketInit(&l->sock, nullptr, netTimeoutMs());
    ncclResult_t res = socketListen(&l->sock, &addr);
    if (res != ncclSuccess) {
      delete l;
      return res;
    }
    SockHandle h;
    memset(&h, 0, sizeof(h));
    h.magic = kHandleMagic;
    socketAddressToWire(&l->sock.addr, &h.addr);
    memset(handle, 0, kNetHandleSize);
    memcpy(handle, &h, sizeof(h));
    *listenComm = l;
    char str[kSocketAddrStrLen];
    MK_INFO(kNet, "socket net: listening on %s (%s)",
            socketAddressToString(&l->sock.addr, str, sizeof(str)), ifs_[dev].name.c_str());
    return ncclSuccess;
  }

  ncclResult_t connect(int dev, void* handle, void** sendComm) override {
    *sendComm = nullptr;
    SockHandle h;
    memcpy(&h, handle, sizeof(h));
    MK_ARGCHECK(h.magic == kHandleMagic, "socket net: connect handle is not a socket handle");
    SocketAddress addr;
    NCCLCHECK(socketAddressFromWire(&h.addr, &addr));
    char str[kSocketAddrStrLen];
    int n = (int)MK_PARAM_INT(SocketNConns);
    if (n < 1) n = 1;
    if (n > kMaxConns) n = kMaxConns;
    Comm* c = new Comm();
    c->isSend = true;
    c->peer = socketAddressToString(&addr, str, sizeof(str));
    c->nconns = n;
    static std::atomic<uint64_t> counter{0};
    std::random_device rd;
    uint64_t nonce = ((uint64_t)rd() << 32) ^ rd() ^ (counter.fetch_add(1) << 48) ^ getpid();
    for (int i = 0; i < n; i++) {
      ncclResult_t res = connectOne(addr, &c->conns[i].fd);
      if (res != ncclSuccess) {
        destroyComm(c);
        return res;
      }
      Hello hello = {kHelloMagic, nonce, (uint32_t)i, (uint32_t)n};
      int err = 0;
      if (netSendAll(c->conns[i].fd, &hello, sizeof(hello), nullptr, &err) != NetIo::kOk) {
        MK_WARN("socket net: handshake with %s failed: %s", c->peer.c_str(), strerror(err));
        destroyComm(c);
        return ncclRemoteError;
      }
    }
    startThreads(c);
    *sendComm = c;
    MK_INFO(kNet, "socket net: connected to %s with %d connection(s)", c->peer.c_str(), n);
    return ncclSuccess;
  }

  ncclResult_t accept(void* listenComm, void** recvComm) override {
    *recvComm = nullptr;
    Listen* l = static_cast<Listen*>(listenComm);
    for (;;) {
      Socket s;
      bool accepted = false;
      NCCLCHECK(socketTryAccept(&l->sock, &s, &accepted));
      if (!accepted) break;
      NCCLCHECK(netTuneSocket(s.fd));
      l->handshaking.push_back(s.fd);
    }
    // Read the Hello of every connection whose Hello has fully arrived.
    for (size_t i = 0; i < l->handshaking.size();) {
      int fd = l->handshaking[i];
      Hello hello;
      ssize_t r = recv(fd, &hello, sizeof(hello), MSG_PEEK);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        i++;
        continue;
      }
      if (r > 0 && r < (ssize_t)sizeof(hello)) {
        i++;
        continue;
      }
      l->handshaking.erase(l->handshaking.begin() + i);
      if (r <= 0 || recv(fd, &hello, sizeof(hello), 0) != (ssize_t)sizeof(hello) ||
          hello.magic != kHelloMagic || hello.nconns < 1 || hello.nconns > kMaxConns ||
          hello.index >= hello.nconns) {
        MK_INFO(kNet, "socket net: dropping a connection without a valid handshake");
        close(fd);
        continue;
      }
      Pending& p = l->groups[hello.nonce];
      if (p.nconns == 0) {
        p.nconns = (int)hello.nconns;
        for (int k = 0; k < kMaxConns; k++) p.fds[k] = -1;
      }
      if (p.fds[hello.index] >= 0)
        close(p.fds[hello.index]);
      else
        p.have++;
      p.fds[hello.index] = fd;
      if (p.have == p.nconns) {
        Comm* c = new Comm();
        c->isSend = false;
        c->nconns = p.nconns;
        for (int k = 0; k < p.nconns; k++) c->conns[k].fd = p.fds[k];
        SocketAddress pa;
        socklen_t pl = sizeof(pa);
        char str[kSocketAddrStrLen] = "?";
        if (getpeername(p.fds[0], &pa.sa, &pl) == 0) socketAddressToString(&pa, str, sizeof(str));
        c->peer = str;
        l->groups.erase(hello.nonce);
        startThreads(c);
        *recvComm = c;
        MK_INFO(kNet, "socket net: accepted %s with %d connection(s)", c->peer.c_str(), c->nconns);
        return ncclSuccess;
      }
    }
    return ncclSuccess;
  }

  ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) override {
    if (type != NCCL_PTR_HOST) {
      MK_WARN("socket net: cannot register GPU memory (type %d); use host buffers", type);
      return ncclInvalidArgument;
    }
    *mhandle = new Mr{data, size};
    return ncclSuccess;
  }
  ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                           void** mhandle) override {
    return regMr(comm, data, size, type, mhandle);
  }
  ncclResult_t deregMr(void* comm, void* mhandle) override {
    delete static_cast<Mr*>(mhandle);
    return ncclSuccess;
  }

  ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                     void** request) override {
    Comm* c = static_cast<Comm*>(sendComm);
    *request = nullptr;
    NCCLCHECK(checkError(c));
    std::lock_guard<std::mutex> lk(c->mu);
    if (c->live.size() >= (size_t)kMaxRequests) return ncclSuccess;  // busy: retry later
    Request* r = new Request();
    r->comm = c;
    r->isSend = true;
    r->size = size;
    uint64_t seq = c->nextSeq++;
    uint64_t nch = numChunks(size, c->nconns);
    size_t cb = chunkBytes(size, c->nconns);
    r->chunksLeft.store(nch);
    for (uint64_t i = 0; i < nch; i++) {
      size_t off = (size_t)i * cb;
      size_t len = size == 0 ? 0 : std::min(cb, size - off);
      Conn* conn = &c->conns[(seq + i) % c->nconns];
      std::lock_guard<std::mutex> ck(conn->mu);
      conn->queue.push_back(Task{r, seq, size, off, len, tag, static_cast<char*>(data) + off});
      conn->cv.notify_one();
    }
    c->live.insert(r);
    *request = r;
    return ncclSuccess;
  }

  ncclResult_t irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                     void** request) override {
    Comm* c = static_cast<Comm*>(recvComm);
    *request = nullptr;
    MK_ARGCHECK(n >= 1 && n <= kNetMaxRecvs, "socket net: irecv of %d buffers (1..%d)", n,
                kNetMaxRecvs);
    NCCLCHECK(checkError(c));
    std::lock_guard<std::mutex> lk(c->mu);
    if (c->live.size() >= (size_t)kMaxRequests) return ncclSuccess;
    Request* r = new Request();
    r->comm = c;
    r->n = n;
    r->msgsLeft = n;
    r->baseSeq = c->nextSeq;
    for (int i = 0; i < n; i++) {
      r->data[i] = data[i];
      r->cap[i] = sizes[i];
      r->tags[i] = tags ? tags[i] : 0;
      r->bound[i] = -1;
    }
    c->nextSeq += (uint64_t)n;
    c->posted.push_back(r);
    c->live.insert(r);
    c->cv.notify_all();
    *request = r;
    return ncclSuccess;
  }

  ncclResult_t iflush(void*, int, void**, int*, void**, void** request) override {
    *request = nullptr;  // host memory written by the kernel's socket layer: nothing to flush
    return ncclSuccess;
  }

  ncclResult_t test(void* request, int* done, size_t* sizes) override {
    Request* r = static_cast<Request*>(request);
    Comm* c = r->comm;
    // The comm's error first, completion second: a request that finished just before the
    // peer's close made the comm fail (EOF on every connection comes after the last frame)
    // must still report done, not the error. Reading in the other order raced with that.
    const bool failed = c->error.load(std::memory_order_acquire) != ncclSuccess;
    bool fin = r->isSend ? r->chunksLeft.load(std::memory_order_acquire) == 0
                         : r->done.load(std::memory_order_acquire);
    *done = 0;
    if (fin) {
      if (sizes) {
        if (r->isSend)
          sizes[0] = r->size;
        else
          for (int i = 0; i < r->n; i++) sizes[i] = r->got[i];
      }
      std::lock_guard<std::mutex> lk(c->mu);
      c->live.erase(r);
      delete r;
      *done = 1;
      return ncclSuccess;
    }
    return failed ? checkError(c) : ncclSuccess;
  }

  ncclResult_t closeSend(void* sendComm) override {
    if (sendComm) destroyComm(static_cast<Comm*>(sendComm));
    return ncclSuccess;
  }
  ncclResult_t closeRecv(void* recvComm) override {
    if (recvComm) destroyComm(static_cast<Comm*>(recvComm));
    return ncclSuccess;
  }
  ncclResult_t closeListen(void* listenComm) override {
    Listen* l = static_cast<Listen*>(listenComm);
    if (!l) return ncclSuccess;
    for (int fd : l->handshaking) close(fd);
    for (auto& g : l->groups)
      for (int k = 0; k < g.second.nconns; k++)
        if (g.second.fds[k] >= 0) close(g.second.fds[k]);
    socketClose(&l->sock);
    delete l;
    return ncclSuccess;
  }

 private:
  static ncclResult_t checkError(Comm* c) {
    int e = c->error.load();
    if (e == ncclSuccess) return ncclSuccess;
    std::lock_guard<std::mutex> lk(c->mu);
    if (!c->errWarned) {
      c->errWarned = true;
      MK_WARN("%s", c->errMsg.c_str());
    } else {
      setLastError(c->errMsg.c_str());
    }
    return (ncclResult_t)e;
  }

  std::vector<NetIf> ifs_;
};

}  // namespace

ncclResult_t netCreateSocket(std::unique_ptr<Net>* out) {
  std::vector<NetIf> ifs;
  NCCLCHECK(ifFind(&ifs, /*maxIfs=*/16));
  out->reset(new SocketNet(std::move(ifs)));
  return ncclSuccess;
}

}  // namespace mk
