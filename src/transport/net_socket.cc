// Socket (TCP) net backend: always available, the fallback and the test transport.
//
// A send/recv comm pair is MKERNEL_SOCKET_NCONNS TCP connections. Connection 0 carries
// every message of up to 128 KiB and is written and read by the caller's own isend/irecv/
// test calls (non-blocking), so small messages never wait for a helper thread to be
// scheduled; larger messages are cut into chunks striped over connections 1..n-1, each
// served by its own helper thread on both sides (net_socket_impl.h, net_socket_io.cc).
// Every frame carries {seq, total, offset, len, tag}; because each connection carries
// frames in seq order and the receiver looks a message up by seq, nothing needs a control
// channel. Receives match messages in posting order (a multi-receive of n buffers takes
// the next n seqs, placing each by tag). Flow control is TCP's: a frame's payload is read
// only once the matching irecv is posted.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "base/checks.h"
#include "base/param.h"
#include "transport/net.h"
#include "bootstrap/ifaces.h"
#include "bootstrap/socket.h"
#include "transport/net_socket_impl.h"
#include "transport/net_sockutil.h"

namespace mk {
namespace {

using sock::Comm;
using sock::Conn;
using sock::Hello;
using sock::kHelloInline;
using sock::kHelloMagic;
using sock::kMaxConns;
using sock::Request;
using sock::Task;

constexpr uint64_t kHandleMagic = 0x316b636f732d6b6dull;  // "mk-sock1"
struct SockHandle {
  uint64_t magic;
  SocketWireAddress addr;  // byte-order independent: the handle crosses hosts
};
static_assert(sizeof(SockHandle) <= kNetHandleSize, "socket handle too large");

struct Pending {
  int nconns = 0;
  int have = 0;
  uint32_t flags = 0;
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

ncclResult_t connectOne(const SocketAddress& addr, const uint32_t* abortFlag, int* outFd) {
  Socket sock;
  socketInit(&sock, abortFlag, netTimeoutMs());
  // The listener existed when its handle was made, but the peer may still be starting
  // up on a slow host: retry refusals until the deadline.
  NCCLCHECK(socketConnect(&sock, &addr, /*retryRefused=*/true));
  *outFd = sock.fd;
  return netTuneSocket(sock.fd);
}

// Helper threads for the striped connections; the inline connection is the caller's.
void startThreads(Comm* c) {
  for (int i = c->inlineConn ? 1 : 0; i < c->nconns; i++) {
    Conn* conn = &c->conns[i];
    conn->thread =
        c->isSend ? std::thread(sock::sendThread, c, conn) : std::thread(sock::recvThread, c, conn);
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
    socketInit(&l->sock, abortFlag_, netTimeoutMs());
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
    c->inlineConn = MK_PARAM_INT(SocketInline) != 0;
    c->txDefer = MK_PARAM_INT(SocketTxCoalesce) != 0;
    static std::atomic<uint64_t> counter{0};
    std::random_device rd;
    uint64_t nonce = ((uint64_t)rd() << 32) ^ rd() ^ (counter.fetch_add(1) << 48) ^ getpid();
    for (int i = 0; i < n; i++) {
      ncclResult_t res = connectOne(addr, abortFlag_, &c->conns[i].fd);
      if (res != ncclSuccess) {
        destroyComm(c);
        return res;
      }
      Hello hello = {
          kHelloMagic, nonce, (uint32_t)i, (uint32_t)n, c->inlineConn ? kHelloInline : 0u, 0};
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
      const ncclResult_t tuned = netTuneSocket(s.fd);
      if (tuned != ncclSuccess) {
        close(s.fd);  // not yet anyone's: nothing else would close it
        return tuned;
      }
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
      // Every handshake of a group must agree with the first one: one that says another
      // count (its index may lie past the group's) would complete the group with a hole in
      // it, its own fd owned by nobody.
      auto g = l->groups.find(hello.nonce);
      if (g != l->groups.end() &&
          (hello.nconns != (uint32_t)g->second.nconns || hello.flags != g->second.flags)) {
        MK_INFO(kNet, "socket net: dropping a connection whose handshake disagrees with its group");
        close(fd);
        continue;
      }
      Pending& p = l->groups[hello.nonce];
      if (p.nconns == 0) {
        p.nconns = (int)hello.nconns;
        p.flags = hello.flags;
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
        c->inlineConn = (p.flags & kHelloInline) != 0;
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
    {
      std::lock_guard<std::mutex> io(c->ioMu);  // inline frames queue in seq order
      std::lock_guard<std::mutex> lk(c->mu);
      if (c->live.size() >= (size_t)sock::kMaxRequests) return ncclSuccess;  // busy: retry
      Request* r = new Request();
      r->comm = c;
      r->isSend = true;
      r->size = size;
      uint64_t seq = c->nextSeq++;
      uint64_t nch = sock::numChunks(size, c->dataConns());
      size_t cb = sock::chunkBytes(size, c->dataConns());
      r->chunksLeft.store(nch);
      const bool inl = c->inlineConn && (size <= sock::kInlineMax || c->nconns == 1);
      // Helper connections: 1..n-1 next to an inline connection, else all of them.
      const int first = c->inlineConn ? 1 : 0;
      for (uint64_t i = 0; i < nch; i++) {
        size_t off = (size_t)i * cb;
        size_t len = size == 0 ? 0 : std::min(cb, size - off);
        Task t{r, seq, size, off, len, tag, static_cast<char*>(data) + off};
        if (inl) {
          c->txq.push_back(t);
          continue;
        }
        Conn* conn = &c->conns[first + (seq + i) % (uint64_t)(c->nconns - first)];
        std::lock_guard<std::mutex> ck(conn->mu);
        conn->queue.push_back(t);
        conn->cv.notify_one();
      }
      c->live.insert(r);
      *request = r;
    }
    // Deferred: the caller posts a batch's messages back to back and then tests them (the
    // Net contract: test() moves the inline connection), so that test writes them all at
    // once. Frames for helper connections are already queued to their threads.
    if (!c->txDefer) sock::progressInline(c);
    return ncclSuccess;
  }

  ncclResult_t irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                     void** request) override {
    Comm* c = static_cast<Comm*>(recvComm);
    *request = nullptr;
    MK_ARGCHECK(n >= 1 && n <= kNetMaxRecvs, "socket net: irecv of %d buffers (1..%d)", n,
                kNetMaxRecvs);
    NCCLCHECK(checkError(c));
    std::unique_lock<std::mutex> lk(c->mu);
    if (c->live.size() >= (size_t)sock::kMaxRequests) return ncclSuccess;
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
    lk.unlock();
    sock::progressInline(c);  // a frame waiting for this receive may land now
    return ncclSuccess;
  }

  ncclResult_t iflush(void*, int, void**, int*, void**, void** request) override {
    *request = nullptr;  // host memory written by the kernel's socket layer: nothing to flush
    return ncclSuccess;
  }

  ncclResult_t test(void* request, int* done, size_t* sizes) override {
    Request* r = static_cast<Request*>(request);
    Comm* c = r->comm;
    sock::progressInline(c);
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

  // The inline connection's reads (the ones the caller's test() pays for); the helper
  // threads' reads of large messages are not counted.
  bool recvCounts(void* recvComm, NetRecvCounts* out) override {
    Comm* c = static_cast<Comm*>(recvComm);
    if (c == nullptr || c->isSend || !c->inlineConn) return false;
    std::lock_guard<std::mutex> io(c->ioMu);
    out->calls = c->rx.calls;
    out->empty = c->rx.empty;
    out->msgs = c->rx.frames;
    return true;
  }

  // The inline connection's writes (the ones isend/test pay for); helper threads' sends of
  // large messages are not counted.
  bool sendCounts(void* sendComm, NetSendCounts* out) override {
    Comm* c = static_cast<Comm*>(sendComm);
    if (c == nullptr || !c->isSend || !c->inlineConn) return false;
    std::lock_guard<std::mutex> io(c->ioMu);
    out->calls = c->txCalls;
    out->msgs = c->txFrames;
    return true;
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
