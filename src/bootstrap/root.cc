#include "bootstrap/root.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <poll.h>
#include <pthread.h>

#include <condition_variable>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bootstrap/proto.h"
#include "base/checks.h"
#include "base/debug.h"
#include "base/param.h"

namespace mk {

int64_t bootstrapTimeoutMs() {
  int64_t s = MK_PARAM_INT(BootstrapTimeoutS);
  return (s < 1 ? 1 : s) * 1000;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Registry: root threads are joinable (a detached thread could still be counted, or run, after
// the caller believes the bootstrap is over). The registry is leaked on purpose so that a root
// still running at exit() never meets a joinable std::thread destructor.
// ---------------------------------------------------------------------------------------------
struct RootEntry {
  uint64_t secret = 0;
  std::thread thread;
  bool done = false;    // guarded by Registry::mu
  bool joined = false;  // guarded by joinMu
  std::mutex joinMu;
};

struct Registry {
  std::mutex mu;
  std::condition_variable cv;
  std::list<std::shared_ptr<RootEntry>> roots;
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

void joinEntry(const std::shared_ptr<RootEntry>& e) {
  {
    std::lock_guard<std::mutex> g(e->joinMu);
    if (!e->joined) {
      e->thread.join();
      e->joined = true;
    }
  }
  Registry& reg = registry();
  std::lock_guard<std::mutex> g(reg.mu);
  reg.roots.remove(e);
}

// ---------------------------------------------------------------------------------------------
// The root thread
// ---------------------------------------------------------------------------------------------
struct Pending {
  Socket sock;
  int64_t deadline = 0;
  RootHello hello{};
  SocketWireAddress addr{};
  size_t off = 0;  // bytes of hello + addr received
};

class Root {
 public:
  Root(Socket listen, uint64_t secret) : listen_(listen), secret_(secret) {
    char buf[kSocketAddrStrLen];
    socketAddressToString(&listen_.addr, buf, sizeof(buf));
    name_ = buf;
  }
  void run();

 private:
  const char* validate(const RootHello& h) const;
  // Returns false when the connection is to be dropped (*why says why).
  bool step(Pending* p, const char** why);
  const char* accept(Pending* p);
  void drop(Pending* p, const char* why) {
    char peer[kSocketAddrStrLen];
    MK_INFO(kBootstrap, "Bootstrap root %s: dropped connection from %s: %s", name_.c_str(),
            socketAddressToString(&p->sock.addr, peer, sizeof(peer)), why);
    socketClose(&p->sock);
  }
  bool complete() const {
    return nranks_ > 0 && nHave_ == end_ - first_ && (!needSucc_ || haveSucc_);
  }
  void reply();
  void cleanup();

  Socket listen_;
  uint64_t secret_;
  std::string name_;
  int64_t timeoutMs_ = 0;
  int64_t deadline_ = 0;
  // Learned from the first valid hello; all later ones must agree.
  int nranks_ = -1, nIds_ = 0, rootIdx_ = 0, first_ = 0, end_ = 0;
  bool needSucc_ = false, haveSucc_ = false;
  SocketWireAddress succAddr_{};
  std::vector<Socket> held_;  // per rank of the group: its connection, awaiting the reply
  std::vector<SocketWireAddress> addrs_;
  int nHave_ = 0;
  std::vector<std::unique_ptr<Pending>> pending_;
};

const char* Root::validate(const RootHello& h) const {
  if (h.magic != kBootstrapIdMagic) return "bad magic (not an mkernel bootstrap peer)";
  if (h.version != kBootstrapProtocolVersion) return "protocol version mismatch";
  if (h.secret != secret_) return "wrong secret (a rank of another job?)";
  if (h.type != kRootHello && h.type != kSuccessorHello) return "unknown message type";
  if (h.payloadBytes != sizeof(SocketWireAddress)) return "bad payload size";
  if (h.nranks < 1 || h.nranks > kBootstrapMaxRanks) return "nranks out of bounds";
  if (h.nIds < 1 || h.nIds > h.nranks) return "nIds out of bounds";
  if (h.rootIdx < 0 || h.rootIdx >= h.nIds) return "root index out of bounds";
  if (h.rank < 0 || h.rank >= h.nranks) return "rank out of bounds";
  if (nranks_ > 0 && (h.nranks != nranks_ || h.nIds != nIds_ || h.rootIdx != rootIdx_))
    return "nranks/nIds/root index differ from earlier ranks";
  if (h.type == kRootHello) {
    if (bootstrapRootOfRank(h.rank, h.nranks, h.nIds) != h.rootIdx)
      return "rank does not belong to this root";
    if (nranks_ > 0 && held_[h.rank - first_].fd >= 0) return "duplicate rank";
  } else {
    int end = bootstrapFirstRankOfRoot(h.rootIdx + 1, h.nranks, h.nIds);
    if (h.nIds < 2 || h.rank != end % h.nranks) return "unexpected successor";
    if (haveSucc_) return "duplicate successor";
  }
  return nullptr;
}

const char* Root::accept(Pending* p) {
  SocketAddress addr;
  if (socketAddressFromWire(&p->addr, &addr) != ncclSuccess) return "bad listen address";
  const RootHello& h = p->hello;
  if (nranks_ < 0) {
    nranks_ = h.nranks;
    nIds_ = h.nIds;
    rootIdx_ = h.rootIdx;
    first_ = bootstrapFirstRankOfRoot(rootIdx_, nranks_, nIds_);
    end_ = bootstrapFirstRankOfRoot(rootIdx_ + 1, nranks_, nIds_);
    needSucc_ = nIds_ > 1;
    held_.resize(end_ - first_);
    for (Socket& s : held_) socketInit(&s, nullptr, kBootstrapHelloTimeoutMs);
    addrs_.resize(end_ - first_);
  }
  if (h.type == kRootHello) {
    held_[h.rank - first_] = p->sock;
    addrs_[h.rank - first_] = p->addr;
    nHave_++;
  } else {
    succAddr_ = p->addr;
    haveSucc_ = true;
    socketClose(&p->sock);
  }
  p->sock.fd = -1;
  // Progress keeps the root alive: it gives up only after a full timeout with no newcomer.
  deadline_ = socketClockMs() + timeoutMs_;
  MK_TRACE(kBootstrap, "Bootstrap root %s: rank %d/%d registered (%s)", name_.c_str(), h.rank,
           h.nranks, h.type == kRootHello ? "hello" : "successor");
  return nullptr;
}

bool Root::step(Pending* p, const char** why) {
  bool closed = false;
  const size_t hsz = sizeof(RootHello), asz = sizeof(SocketWireAddress);
  if (p->off < hsz) {
    if (socketProgressRecv(&p->sock, &p->hello, hsz, &p->off, &closed) != ncclSuccess) {
      *why = "connection error or closed mid-message";
      return false;
    }
    if (closed) {
      *why = "closed without a message (port scan?)";
      return false;
    }
    if (p->off < hsz) return true;
    // Judge the header before reading what it announces.
    if ((*why = validate(p->hello)) != nullptr) return false;
  }
  size_t aoff = p->off - hsz;
  if (socketProgressRecv(&p->sock, &p->addr, asz, &aoff, &closed) != ncclSuccess || closed) {
    *why = "connection error or closed mid-message";
    return false;
  }
  p->off = hsz + aoff;
  if (aoff < asz) return true;
  // Re-check: another connection may have fixed nranks or taken the rank meanwhile.
  if ((*why = validate(p->hello)) != nullptr) return false;
  if ((*why = accept(p)) != nullptr) return false;
  return true;
}

void Root::reply() {
  for (int r = first_; r < end_; r++) {
    Socket* s = &held_[r - first_];
    RootReply rep{};
    rep.magic = kBootstrapIdMagic;
    rep.version = kBootstrapProtocolVersion;
    rep.type = kRootReply;
    rep.nranks = nranks_;
    rep.next = (r + 1) % nranks_;
    rep.nextAddr = r + 1 < end_ ? addrs_[r + 1 - first_] : needSucc_ ? succAddr_ : addrs_[0];
    if (socketSend(s, &rep, sizeof(rep)) != ncclSuccess)
      MK_INFO(kBootstrap, "Bootstrap root %s: could not answer rank %d", name_.c_str(), r);
    socketClose(s);
  }
  MK_INFO(kBootstrap, "Bootstrap root %s: served ranks %d..%d of %d", name_.c_str(), first_,
          end_ - 1, nranks_);
}

void Root::cleanup() {
  for (auto& p : pending_) socketClose(&p->sock);
  pending_.clear();
  for (Socket& s : held_) socketClose(&s);
  socketClose(&listen_);
}

void Root::run() {
  timeoutMs_ = bootstrapTimeoutMs();
  deadline_ = socketClockMs() + timeoutMs_;
  const char* failure = nullptr;
  std::vector<pollfd> pfds;
  std::vector<int> heldIdx;
  while (failure == nullptr && !complete()) {
    int64_t now = socketClockMs();
    if (now >= deadline_) {
      failure = "timed out waiting for ranks";
      break;
    }
    int64_t wait = deadline_ - now < 100 ? deadline_ - now : 100;
    bool pollListen = pending_.size() < (size_t)kBootstrapMaxPending;
    pfds.clear();
    heldIdx.clear();
    pfds.push_back({listen_.fd, (short)(pollListen ? POLLIN : 0), 0});
    for (auto& p : pending_) {
      pfds.push_back({p->sock.fd, POLLIN, 0});
      if (p->deadline - now < wait) wait = p->deadline - now < 0 ? 0 : p->deadline - now;
    }
    for (size_t i = 0; i < held_.size(); i++) {
      if (held_[i].fd < 0) continue;
      pfds.push_back({held_[i].fd, POLLIN, 0});
      heldIdx.push_back((int)i);
    }
    int rc = poll(pfds.data(), pfds.size(), (int)wait);
    if (rc < 0 && errno != EINTR) {
      failure = "poll failed";
      break;
    }
    now = socketClockMs();
    // A registered rank never writes again before the reply: readable means it went away.
    size_t base = 1 + pending_.size();
    for (size_t k = 0; k < heldIdx.size(); k++) {
      if (pfds[base + k].revents != 0) {
        MK_INFO(kBootstrap,
                "Bootstrap root %s: rank %d disconnected before the rendezvous "
                "completed; giving up",
                name_.c_str(), first_ + heldIdx[k]);
        failure = "a rank disconnected";
      }
    }
    if (failure) break;
    // Walk pending connections; new ones are appended after this loop, so indices hold.
    size_t n = pending_.size();
    std::vector<std::unique_ptr<Pending>> keep;
    for (size_t i = 0; i < n; i++) {
      Pending* p = pending_[i].get();
      const char* why = nullptr;
      bool ok = true;
      if (pfds[1 + i].revents != 0) ok = step(p, &why);
      if (ok && p->sock.fd >= 0 && now >= p->deadline) {
        ok = false;
        why = "no complete hello in time (slow or silent peer)";
      }
      if (!ok)
        drop(p, why);
      else if (p->sock.fd >= 0)
        keep.push_back(std::move(pending_[i]));
    }
    pending_.swap(keep);
    if (pollListen && (pfds[0].revents & POLLIN)) {
      while (pending_.size() < (size_t)kBootstrapMaxPending) {
        auto p = std::make_unique<Pending>();
        bool accepted = false;
        if (socketTryAccept(&listen_, &p->sock, &accepted) != ncclSuccess) {
          // Out of fds, most likely: back off a little and let pending ones finish.
          poll(nullptr, 0, 10);
          break;
        }
        if (!accepted) break;
        p->deadline =
            now + (timeoutMs_ < kBootstrapHelloTimeoutMs ? timeoutMs_ : kBootstrapHelloTimeoutMs);
        pending_.push_back(std::move(p));
      }
    }
  }
  if (failure == nullptr) {
    reply();
  } else {
    MK_INFO(kBootstrap, "Bootstrap root %s: %s (%d of %d ranks of its group arrived)",
            name_.c_str(), failure, nHave_, nranks_ > 0 ? end_ - first_ : -1);
  }
  cleanup();
}

}  // namespace

ncclResult_t bootstrapRootStart(uint64_t secret, const SocketAddress* local, SocketAddress* bound) {
  bootstrapRootsReap();
  socketRaiseFdLimit();
  Socket listen;
  socketInit(&listen, nullptr, kBootstrapHelloTimeoutMs);
  NCCLCHECK(socketListen(&listen, local));
  *bound = listen.addr;
  auto entry = std::make_shared<RootEntry>();
  entry->secret = secret;
  Registry& reg = registry();
  std::lock_guard<std::mutex> g(reg.mu);
  try {
    entry->thread = std::thread([listen, secret, entry] {
      pthread_setname_np(pthread_self(), "mk-boot-root");
      Root root(listen, secret);
      root.run();
      Registry& r = registry();
      std::lock_guard<std::mutex> lk(r.mu);
      entry->done = true;
      r.cv.notify_all();
    });
  } catch (const std::exception& e) {
    Socket l = listen;
    socketClose(&l);
    MK_WARN("Cannot start the bootstrap root thread: %s", e.what());
    return ncclSystemError;
  }
  reg.roots.push_back(entry);
  char buf[kSocketAddrStrLen];
  MK_INFO(kBootstrap, "Bootstrap root listening on %s",
          socketAddressToString(bound, buf, sizeof(buf)));
  return ncclSuccess;
}

void bootstrapRootJoin(uint64_t secret) {
  Registry& reg = registry();
  std::shared_ptr<RootEntry> e;
  {
    std::unique_lock<std::mutex> lk(reg.mu);
    for (auto& r : reg.roots)
      if (r->secret == secret) e = r;
    if (!e) return;
    // Our reply has arrived, so the root is only answering the others and closing sockets; the
    // bound is a safety net, an unfinished root is left to bootstrapRootsReap.
    if (!reg.cv.wait_for(lk, std::chrono::milliseconds(kBootstrapHelloTimeoutMs + 1000),
                         [&] { return e->done; }))
      return;
  }
  joinEntry(e);
}

int bootstrapRootsReap() {
  Registry& reg = registry();
  std::vector<std::shared_ptr<RootEntry>> done;
  int running = 0;
  {
    std::lock_guard<std::mutex> g(reg.mu);
    for (auto& r : reg.roots) {
      if (r->done)
        done.push_back(r);
      else
        running++;
    }
  }
  for (auto& e : done) joinEntry(e);
  return running;
}

int bootstrapRootsWait(int64_t timeoutMs) {
  Registry& reg = registry();
  {
    std::unique_lock<std::mutex> lk(reg.mu);
    reg.cv.wait_for(lk, std::chrono::milliseconds(timeoutMs), [&] {
      for (auto& r : reg.roots)
        if (!r->done) return false;
      return true;
    });
  }
  return bootstrapRootsReap();
}

// ---------------------------------------------------------------------------------------------
// Rank side
// ---------------------------------------------------------------------------------------------
namespace {

ncclResult_t sendHello(Socket* s, const BootstrapId& id, uint16_t type, int rank, int nranks,
                       int nIds, int rootIdx, const SocketAddress* myAddr) {
  struct {
    RootHello h;
    SocketWireAddress a;
  } msg;
  static_assert(sizeof(msg) == sizeof(RootHello) + sizeof(SocketWireAddress), "packed");
  memset(&msg, 0, sizeof(msg));
  msg.h.magic = kBootstrapIdMagic;
  msg.h.version = kBootstrapProtocolVersion;
  msg.h.type = type;
  msg.h.secret = id.secret;
  msg.h.rank = rank;
  msg.h.nranks = nranks;
  msg.h.nIds = nIds;
  msg.h.rootIdx = rootIdx;
  msg.h.payloadBytes = sizeof(SocketWireAddress);
  socketAddressToWire(myAddr, &msg.a);
  NCCLCHECK(socketConnect(s, &id.root, /*retryRefused=*/true));
  NCCLCHECK(socketSend(s, &msg, sizeof(msg)));
  return ncclSuccess;
}

}  // namespace

ncclResult_t bootstrapRootRendezvous(const BootstrapId* ids, int nIds, int rank, int nranks,
                                     const SocketAddress* myAddr, const uint32_t* abortFlag,
                                     int64_t timeoutMs, SocketAddress* nextAddr) {
  ncclResult_t res = ncclSuccess;
  int g = bootstrapRootOfRank(rank, nranks, nIds);
  char rootName[kSocketAddrStrLen];
  socketAddressToString(&ids[g].root, rootName, sizeof(rootName));
  Socket root, succ;
  socketInit(&root, abortFlag, timeoutMs);
  socketInit(&succ, abortFlag, timeoutMs);
  RootReply rep{};
  NCCLCHECKGOTO(sendHello(&root, ids[g], kRootHello, rank, nranks, nIds, g, myAddr), res, fail);
  if (nIds > 1 && rank == bootstrapFirstRankOfRoot(g, nranks, nIds)) {
    int pg = bootstrapRootOfRank((rank + nranks - 1) % nranks, nranks, nIds);
    NCCLCHECKGOTO(sendHello(&succ, ids[pg], kSuccessorHello, rank, nranks, nIds, pg, myAddr), res,
                  fail);
    socketClose(&succ);
  }
  NCCLCHECKGOTO(socketRecv(&root, &rep, sizeof(rep)), res, fail);
  if (rep.magic != kBootstrapIdMagic || rep.version != kBootstrapProtocolVersion ||
      rep.type != kRootReply || rep.nranks != nranks || rep.next != (rank + 1) % nranks ||
      socketAddressFromWire(&rep.nextAddr, nextAddr) != ncclSuccess) {
    MK_WARN("Bootstrap rank %d/%d: invalid answer from the root at %s", rank, nranks, rootName);
    res = ncclRemoteError;
    goto fail;
  }
  socketClose(&root);
  return ncclSuccess;
fail:
  socketClose(&root);
  socketClose(&succ);
  if (res != ncclInternalError)  // an abort already said so
    MK_WARN(
        "Bootstrap rank %d/%d: rendezvous with the root at %s failed (did all %d ranks call "
        "init with the same id? MKERNEL_BOOTSTRAP_TIMEOUT_S=%lld)",
        rank, nranks, rootName, nranks, (long long)(timeoutMs / 1000));
  return res;
}

}  // namespace mk
