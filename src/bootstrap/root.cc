#include "bootstrap/root.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <map>
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
  // The parameter's range (params.def) keeps this product far from overflow; saturate anyway.
  int64_t s = MK_PARAM_INT(BootstrapTimeoutS);
  return saturatingMul(s < 1 ? 1 : s, 1000);
}

namespace {

// What the id's creator expects (bootstrapRootExpect), shared by the registry and the thread.
struct RootExpect {
  std::mutex mu;  // serialises setters; the root thread reads `set` first
  std::atomic<bool> set{false};
  int nranks = 0, nIds = 0, rootIdx = 0;
};

// ---------------------------------------------------------------------------------------------
// Registry: root threads are joinable (a detached thread could still be counted, or run, after
// the caller believes the bootstrap is over). The registry is leaked on purpose so that a root
// still running at exit() never meets a joinable std::thread destructor.
// ---------------------------------------------------------------------------------------------
struct RootEntry {
  uint64_t secret = 0;
  std::thread thread;
  std::shared_ptr<RootExpect> expect = std::make_shared<RootExpect>();
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

// Pending connections the root may hold: a quarter of the fd limit (it shares the process with
// the application), within [16, kBootstrapMaxPending].
size_t pendingCapacity() {
  rlimit rl;
  rlim_t cur = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 1024;
  rlim_t cap = cur / 4;
  if (cap > (rlim_t)kBootstrapMaxPending) cap = kBootstrapMaxPending;
  return cap < 16 ? 16 : (size_t)cap;
}

// ---------------------------------------------------------------------------------------------
// The root thread
// ---------------------------------------------------------------------------------------------
struct Pending {
  Socket sock;
  int64_t since = 0;  // accepted at (socketClockMs)
  RootHello hello{};
  SocketWireAddress addr{};
  size_t off = 0;  // bytes of hello + addr received
};

struct Reg {
  Socket sock;
  SocketWireAddress addr{};
};

// One (nranks, nIds, root index) claim and the ranks that made it. Memory grows with the ranks
// that arrive (each holds a connection, so the fd limit bounds it), never with the claim.
struct Claim {
  int nranks = 0, nIds = 0, rootIdx = 0, first = 0, end = 0;
  std::map<int, Reg> ranks;
  bool haveSucc = false;
  SocketWireAddress succAddr{};
  bool needSucc() const { return nIds > 1; }
  bool complete() const { return (int)ranks.size() == end - first && (!needSucc() || haveSucc); }
  bool matches(const RootHello& h) const {
    return h.nranks == nranks && h.nIds == nIds && h.rootIdx == rootIdx;
  }
};

class Root {
 public:
  Root(Socket listen, uint64_t secret, std::shared_ptr<RootExpect> expect)
      : listen_(listen), secret_(secret), expect_(std::move(expect)) {
    char buf[kSocketAddrStrLen];
    socketAddressToString(&listen_.addr, buf, sizeof(buf));
    name_ = buf;
  }
  void run();

 private:
  const char* validatePrefix(const RootHello& h, size_t have) const;
  const char* validate(const RootHello& h) const;
  // Returns false when the connection is to be dropped (*why says why).
  bool step(Pending* p, const char** why);
  void admit(Pending* p);
  void acceptSome(int64_t now);
  bool evictable(int64_t now) const {
    return !pending_.empty() && now - pending_.front()->since >= kBootstrapEvictAgeMs;
  }
  void drop(Socket* s, const char* why) {
    char peer[kSocketAddrStrLen];
    // Rate-limited: a flood would otherwise write one line per connection.
    MK_INFO_RATELIMITED(kBootstrap, 1000, "Bootstrap root %s: dropped connection from %s: %s",
                        name_.c_str(), socketAddressToString(&s->addr, peer, sizeof(peer)), why);
    socketClose(s);
  }
  void dropClaim(size_t i, const char* why);
  void applyExpectation();
  void reply(Claim& c);
  void cleanup();

  Socket listen_;
  uint64_t secret_;
  std::shared_ptr<RootExpect> expect_;
  bool expectApplied_ = false;
  int expNranks_ = 0, expNIds_ = 0, expRootIdx_ = 0;
  std::string name_;
  int64_t timeoutMs_ = 0;
  int64_t deadline_ = 0;
  size_t pendingCap_ = 16;
  int64_t listenPausedUntil_ = 0;  // accept() failed (out of fds): back off until then
  int64_t acceptBackoffMs_ = 10;
  std::deque<std::unique_ptr<Pending>> pending_;  // oldest first
  std::vector<std::unique_ptr<Claim>> claims_;
  Claim* done_ = nullptr;  // the claim that completed
};

// Judges the bytes of a hello as they arrive, so that garbage is dropped at its first wrong
// field rather than when the whole header is in (or at the deadline, if it never is).
const char* Root::validatePrefix(const RootHello& h, size_t have) const {
  if (have >= 4 && h.magic != kBootstrapIdMagic) return "bad magic (not an mkernel bootstrap peer)";
  if (have >= 6 && h.version != kBootstrapProtocolVersion) return "protocol version mismatch";
  if (have >= 8 && h.type != kRootHello && h.type != kSuccessorHello) return "unknown message type";
  if (have >= 16 && h.secret != secret_) return "wrong secret (a rank of another job?)";
  return nullptr;
}

const char* Root::validate(const RootHello& h) const {
  if (const char* why = validatePrefix(h, sizeof(h))) return why;
  if (h.payloadBytes != sizeof(SocketWireAddress)) return "bad payload size";
  if (h.nranks < 1 || h.nranks > kBootstrapMaxRanks) return "nranks out of bounds";
  if (h.nIds < 1 || h.nIds > h.nranks) return "nIds out of bounds";
  if (h.rootIdx < 0 || h.rootIdx >= h.nIds) return "root index out of bounds";
  if (h.rank < 0 || h.rank >= h.nranks) return "rank out of bounds";
  if (expectApplied_ && (h.nranks != expNranks_ || h.nIds != expNIds_ || h.rootIdx != expRootIdx_))
    return "nranks/nIds/root index differ from what the id's creator expects";
  if (h.type == kRootHello) {
    if (bootstrapRootOfRank(h.rank, h.nranks, h.nIds) != h.rootIdx)
      return "rank does not belong to this root";
  } else {
    int end = bootstrapFirstRankOfRoot(h.rootIdx + 1, h.nranks, h.nIds);
    if (h.nIds < 2 || h.rank != end % h.nranks) return "unexpected successor";
  }
  for (const auto& c : claims_) {
    if (!c->matches(h)) continue;
    if (h.type == kRootHello && c->ranks.count(h.rank)) return "duplicate rank";
    if (h.type == kSuccessorHello && c->haveSucc) return "duplicate successor";
    return nullptr;
  }
  if (claims_.size() >= (size_t)kBootstrapMaxClaims) return "too many different nranks claims";
  return nullptr;
}

// Registers a validated hello with its claim (made on first use).
void Root::admit(Pending* p) {
  const RootHello& h = p->hello;
  Claim* c = nullptr;
  for (auto& x : claims_)
    if (x->matches(h)) c = x.get();
  if (c == nullptr) {
    claims_.push_back(std::make_unique<Claim>());
    c = claims_.back().get();
    c->nranks = h.nranks;
    c->nIds = h.nIds;
    c->rootIdx = h.rootIdx;
    c->first = bootstrapFirstRankOfRoot(h.rootIdx, h.nranks, h.nIds);
    c->end = bootstrapFirstRankOfRoot(h.rootIdx + 1, h.nranks, h.nIds);
  }
  if (h.type == kRootHello) {
    Reg& r = c->ranks[h.rank];
    r.sock = p->sock;
    r.addr = p->addr;
  } else {
    c->succAddr = p->addr;
    c->haveSucc = true;
    socketClose(&p->sock);
  }
  p->sock.fd = -1;
  // Progress keeps the root alive: it gives up only after a full timeout with no newcomer.
  deadline_ = saturatingAdd(socketClockMs(), timeoutMs_);
  MK_TRACE(kBootstrap, "Bootstrap root %s: rank %d/%d registered (%s)", name_.c_str(), h.rank,
           h.nranks, h.type == kRootHello ? "hello" : "successor");
  if (c->complete()) done_ = c;
}

bool Root::step(Pending* p, const char** why) {
  bool closed = false;
  const size_t hsz = sizeof(RootHello), asz = sizeof(SocketWireAddress);
  if (p->off < hsz) {
    ncclResult_t r = socketProgressRecv(&p->sock, &p->hello, hsz, &p->off, &closed);
    if ((*why = validatePrefix(p->hello, p->off)) != nullptr) return false;
    if (r != ncclSuccess) {
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
  SocketAddress addr;
  if (socketAddressFromWire(&p->addr, &addr) != ncclSuccess) {
    *why = "bad listen address";
    return false;
  }
  // Re-check: another connection may have taken the rank meanwhile.
  if ((*why = validate(p->hello)) != nullptr) return false;
  admit(p);
  return true;
}

void Root::dropClaim(size_t i, const char* why) {
  Claim& c = *claims_[i];
  MK_INFO(kBootstrap, "Bootstrap root %s: dropping the claim of %d ranks (%zu of %d arrived): %s",
          name_.c_str(), c.nranks, c.ranks.size(), c.end - c.first, why);
  for (auto& kv : c.ranks) socketClose(&kv.second.sock);
  claims_.erase(claims_.begin() + i);
}

void Root::applyExpectation() {
  if (expectApplied_ || !expect_->set.load(std::memory_order_acquire)) return;
  {
    std::lock_guard<std::mutex> g(expect_->mu);
    expNranks_ = expect_->nranks;
    expNIds_ = expect_->nIds;
    expRootIdx_ = expect_->rootIdx;
  }
  expectApplied_ = true;
  for (size_t i = claims_.size(); i-- > 0;) {
    Claim& c = *claims_[i];
    if (c.nranks != expNranks_ || c.nIds != expNIds_ || c.rootIdx != expRootIdx_)
      dropClaim(i, "not what the id's creator expects");
  }
}

// Accepts what the listener has queued, in batches so that the others are served too. Each
// connection is read at once: a real rank's hello is usually there already.
void Root::acceptSome(int64_t now) {
  for (int k = 0; k < 1024 && done_ == nullptr; k++) {
    if (pending_.size() >= pendingCap_) {
      if (!evictable(now)) return;
      drop(&pending_.front()->sock, "evicted: no hello while the root was flooded");
      pending_.pop_front();
    }
    auto p = std::make_unique<Pending>();
    bool accepted = false;
    if (socketTryAccept(&listen_, &p->sock, &accepted) != ncclSuccess) {
      // Out of fds, most likely. A silent connection of ours is the cheapest fd to give back;
      // otherwise leave the listener alone for a while (doubling, up to 1 s) instead of
      // failing again at every wake-up.
      if (evictable(now)) {
        drop(&pending_.front()->sock, "evicted: out of file descriptors");
        pending_.pop_front();
        continue;
      }
      listenPausedUntil_ = now + acceptBackoffMs_;
      acceptBackoffMs_ = acceptBackoffMs_ * 2 > 1000 ? 1000 : acceptBackoffMs_ * 2;
      return;
    }
    if (!accepted) return;
    acceptBackoffMs_ = 10;
    p->since = now;
    const char* why = nullptr;
    if (!step(p.get(), &why))
      drop(&p->sock, why);
    else if (p->sock.fd >= 0)
      pending_.push_back(std::move(p));
  }
}

void Root::reply(Claim& c) {
  for (auto it = c.ranks.begin(); it != c.ranks.end(); ++it) {
    int r = it->first;
    auto nx = std::next(it);
    RootReply rep{};
    rep.magic = kBootstrapIdMagic;
    rep.version = kBootstrapProtocolVersion;
    rep.type = kRootReply;
    rep.nranks = c.nranks;
    rep.next = (r + 1) % c.nranks;
    rep.nextAddr = nx != c.ranks.end() ? nx->second.addr
                   : c.needSucc()      ? c.succAddr
                                       : c.ranks.begin()->second.addr;
    Socket* s = &it->second.sock;
    s->timeoutMs = kBootstrapHelloTimeoutMs;
    if (socketSend(s, &rep, sizeof(rep)) != ncclSuccess)
      MK_INFO(kBootstrap, "Bootstrap root %s: could not answer rank %d", name_.c_str(), r);
    socketClose(s);
  }
  MK_INFO(kBootstrap, "Bootstrap root %s: served ranks %d..%d of %d", name_.c_str(), c.first,
          c.end - 1, c.nranks);
}

void Root::cleanup() {
  for (auto& p : pending_) socketClose(&p->sock);
  pending_.clear();
  for (size_t i = claims_.size(); i-- > 0;) {
    if (claims_[i].get() != done_)
      dropClaim(i, done_ ? "another claim completed first" : "the root gave up");
  }
  claims_.clear();
  socketClose(&listen_);
}

void Root::run() {
  timeoutMs_ = bootstrapTimeoutMs();
  deadline_ = saturatingAdd(socketClockMs(), timeoutMs_);
  pendingCap_ = pendingCapacity();
  const int64_t helloMs =
      timeoutMs_ < kBootstrapHelloTimeoutMs ? timeoutMs_ : kBootstrapHelloTimeoutMs;
  const char* failure = nullptr;
  std::vector<pollfd> pfds;
  std::vector<std::pair<Claim*, int>> heldIdx;
  while (failure == nullptr && done_ == nullptr) {
    applyExpectation();
    int64_t now = socketClockMs();
    if (now >= deadline_) {
      failure = "timed out waiting for ranks";
      break;
    }
    int64_t wait = deadline_ - now < 100 ? deadline_ - now : 100;
    // The listener is watched only when a connection could be taken: otherwise its queue
    // would wake us up at once, again and again.
    bool pollListen =
        now >= listenPausedUntil_ && (pending_.size() < pendingCap_ || evictable(now));
    if (now < listenPausedUntil_) wait = std::min(wait, listenPausedUntil_ - now);
    if (!pending_.empty()) {
      int64_t until = pending_.front()->since + (pollListen ? helloMs : kBootstrapEvictAgeMs);
      wait = std::max<int64_t>(0, std::min(wait, until - now));
    }
    pfds.clear();
    heldIdx.clear();
    pfds.push_back({listen_.fd, (short)(pollListen ? POLLIN : 0), 0});
    for (auto& p : pending_) pfds.push_back({p->sock.fd, POLLIN, 0});
    for (auto& c : claims_)
      for (auto& kv : c->ranks) {
        pfds.push_back({kv.second.sock.fd, POLLIN, 0});
        heldIdx.push_back({c.get(), kv.first});
      }
    int rc = poll(pfds.data(), pfds.size(), (int)wait);
    if (rc < 0 && errno != EINTR) {
      failure = "poll failed";
      break;
    }
    now = socketClockMs();
    // A registered rank never writes again before the reply: readable means it went away, and
    // its claim is doomed; its other ranks learn it at once from their closed connections.
    size_t base = 1 + pending_.size();
    for (size_t k = 0; k < heldIdx.size(); k++) {
      if (pfds[base + k].revents == 0) continue;
      for (size_t i = 0; i < claims_.size(); i++) {
        if (claims_[i].get() != heldIdx[k].first) continue;
        MK_INFO(kBootstrap,
                "Bootstrap root %s: rank %d disconnected before the rendezvous completed",
                name_.c_str(), heldIdx[k].second);
        dropClaim(i, "a rank disconnected");
        if (claims_.empty()) failure = "a rank disconnected";
        break;
      }
    }
    if (failure) break;
    // Pending connections, in arrival order (kept: eviction takes the oldest).
    std::deque<std::unique_ptr<Pending>> keep;
    for (size_t i = 0; i < pending_.size(); i++) {
      Pending* p = pending_[i].get();
      const char* why = nullptr;
      bool ok = true;
      if (pfds[1 + i].revents != 0 && done_ == nullptr) ok = step(p, &why);
      if (ok && p->sock.fd >= 0 && now - p->since >= helloMs) {
        ok = false;
        why = "no complete hello in time (slow or silent peer)";
      }
      if (!ok)
        drop(&p->sock, why);
      else if (p->sock.fd >= 0)
        keep.push_back(std::move(pending_[i]));
    }
    pending_.swap(keep);
    if (pollListen && (pfds[0].revents & POLLIN) && done_ == nullptr) acceptSome(now);
  }
  if (done_ != nullptr) {
    reply(*done_);
  } else {
    MK_INFO(kBootstrap, "Bootstrap root %s: %s (%zu claims, none complete)", name_.c_str(), failure,
            claims_.size());
  }
  cleanup();
}

}  // namespace

void bootstrapRootExpect(uint64_t secret, int nranks, int nIds, int rootIdx) {
  std::shared_ptr<RootExpect> e;
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> g(reg.mu);
    for (auto& r : reg.roots)
      if (r->secret == secret && !r->done) e = r->expect;
  }
  if (!e) return;
  std::lock_guard<std::mutex> g(e->mu);
  if (e->set.load()) return;
  e->nranks = nranks;
  e->nIds = nIds;
  e->rootIdx = rootIdx;
  e->set.store(true, std::memory_order_release);
}

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
      Root root(listen, secret, entry->expect);
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
