// Host rendezvous of the in-process ranks of a comm that share a GPU (coll/rendezvous.h).
#include "coll/rendezvous.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "base/checks.h"
#include "base/param.h"
#include "coll/coll_state.h"
#include "comm/comm.h"

namespace mk {

namespace {
using Clock = std::chrono::steady_clock;

// How long a peer that no live thread has driven yet is waited for. Long enough for threads
// released together (a barrier, the end of a collective init) to reach their first call; a
// single thread issuing its ranks one after another pays it once per peer it has not driven.
constexpr auto kGrace = std::chrono::milliseconds(200);
// Polling (with yield) before sleeping on the condition variable: threads released by the
// same collective arrive within microseconds of each other.
constexpr auto kSpin = std::chrono::microseconds(50);

enum SlotState : int { kAbsent = 0, kJoined = 1, kLeft = 2 };

// One lock and one condition variable for every clique of the process: whether a call may
// launch depends on the calls its peers wait in, possibly of other comms (a group spanning
// comms), and that chain must be read as one consistent snapshot.
std::mutex& boardMu() {
  static std::mutex* m = new std::mutex();
  return *m;
}
std::condition_variable& boardCv() {
  static std::condition_variable* c = new std::condition_variable();
  return *c;
}

struct Counts {
  uint64_t colls = 0;                 // collectives
  std::vector<uint64_t> sent, recvd;  // [n]: sends to / receives from slot q
};

struct Call;

struct Slot {
  std::atomic<int> state{kAbsent};
  std::atomic<uint64_t> owner{0};  // id of the thread that last issued on this rank (0: none)
  // Guarded by boardMu:
  Counts posted;                  // everything this rank has issued
  Counts launched;                // of which its thread has launched (rdvLaunched)
  Counts before;                  // what it had issued before the call it waits in
  const Call* waiting = nullptr;  // that call (null: not waiting)
  // Its call that failed in the rendezvous (timeout, abort, a peer gone): the operations in
  // (failLo, failHi] are never launched, so calls that need them fail at once too.
  bool failed = false;
  Counts failLo, failHi;
};

uint64_t threadId() {
  static std::atomic<uint64_t> next{1};
  thread_local uint64_t id = next.fetch_add(1);
  return id;
}
}  // namespace

struct RdvClique {
  int n = 0;
  int dev = -1;
  std::vector<int> rankOfSlot;  // global ranks, ascending
  std::vector<int> slotOf;      // [nRanks] slot or -1
  std::unique_ptr<Slot[]> slots;
};

namespace {

// What a call needs from slot q of clique c: q must have issued its v-th collective
// (kDepColl), its v-th receive from slot `from` (kDepSendTo: `from` sends to q), or its v-th
// send to slot `from` (kDepRecvFrom).
enum DepKind { kDepColl, kDepSendTo, kDepRecvFrom };
struct Dep {
  RdvClique* c;
  int q;
  int from;
  DepKind kind;
  uint64_t v;
};

uint64_t countOf(const Counts& k, const Dep& d) {
  switch (d.kind) {
    case kDepColl:
      return k.colls;
    case kDepSendTo:
      return k.recvd[d.from];
    case kDepRecvFrom:
      return k.sent[d.from];
  }
  return 0;
}

// Dependency d falls into a call of its slot that failed in the rendezvous: never launched.
bool inFailedCall(const Slot& s, const Dep& d) {
  return s.failed && countOf(s.failLo, d) < d.v && d.v <= countOf(s.failHi, d);
}

// One thread's pending call: what its launches wait for.
struct Call {
  uint64_t thread = 0;
  Clock::time_point t0;
  std::vector<Dep> deps;
  std::vector<std::pair<RdvClique*, int>> slots;  // the ranks it issues on
};

struct Verdict {
  bool ready = true;
  bool left = false;    // the missing rank was destroyed or aborted
  bool failed = false;  // its matching call gave up waiting (it will never launch)
  bool direct = false;  // the missing rank is a peer of the call itself
  RdvClique* c = nullptr;
  int q = -1;
};

// The call each thread is waiting in (guarded by boardMu).
std::map<uint64_t, const Call*>& waitingCalls() {
  static auto* m = new std::map<uint64_t, const Call*>();
  return *m;
}

Verdict missing(bool direct, const Dep& d, bool gone, bool failed) {
  Verdict v;
  v.ready = false;
  v.left = gone;
  v.failed = failed;
  v.direct = direct;
  v.c = d.c;
  v.q = d.q;
  return v;
}

// The calls a call's kernels depend on: itself, and every call still waiting here that holds
// an operation matched by a call of the set (its peer launches only when that wait ends).
// Operations not issued yet are collected in `unissued`; a match on a rank that was destroyed,
// or that belongs to a call that failed here, ends the walk (*bad).
struct Closure {
  std::vector<const Call*> calls;
  std::vector<std::pair<const Call*, const Dep*>> unissued;
};
bool closureOf(const Call* start, Closure* out, Verdict* bad) {
  out->calls.assign(1, start);
  out->unissued.clear();
  for (size_t i = 0; i < out->calls.size(); i++) {
    const Call* call = out->calls[i];
    for (const Dep& d : call->deps) {
      const Slot& s = d.c->slots[d.q];
      if (countOf(s.posted, d) < d.v) {
        if (s.state.load(std::memory_order_acquire) == kLeft) {
          *bad = missing(call == start, d, true, false);
          return false;
        }
        out->unissued.emplace_back(call, &d);
        continue;
      }
      if (inFailedCall(s, d)) {
        *bad = missing(call == start, d, false, true);
        return false;
      }
      const Call* w = s.waiting;
      if (w != nullptr && countOf(s.before, d) < d.v &&
          std::find(out->calls.begin(), out->calls.end(), w) == out->calls.end())
        out->calls.push_back(w);
    }
  }
  return true;
}

// Thread `from` waits here for something that only thread `me` can issue, directly or through
// other waiting threads: the edges are the unissued operations in each waiting thread's
// closure, by the threads that drive them.
bool waitsForMe(uint64_t from, uint64_t me) {
  const auto& waiting = waitingCalls();
  std::vector<uint64_t> todo{from};
  Closure cl;
  Verdict ignored;
  for (size_t i = 0; i < todo.size(); i++) {
    auto it = waiting.find(todo[i]);
    if (it == waiting.end()) continue;  // not waiting: it waits for nobody here
    if (!closureOf(it->second, &cl, &ignored)) continue;
    for (const auto& u : cl.unissued) {
      const uint64_t owner = u.second->c->slots[u.second->q].owner.load(std::memory_order_acquire);
      if (owner == me) return true;
      if (owner != 0 && owner != todo[i] &&
          std::find(todo.begin(), todo.end(), owner) == todo.end())
        todo.push_back(owner);
    }
  }
  return false;
}

// A call may launch once nothing its kernels depend on, directly or through the calls they
// match (closureOf), is left to another thread that might be blocked outside mkernel: such a
// thread may sit in a device-wide synchronisation that waits for our kernel. Waiting only for
// the direct peers deadlocked a ring of 4: rank 0 launched once ranks 1 and 3 had posted, rank
// 1 still waited for rank 2, and rank 2's thread sat in cudaDeviceSynchronize behind rank 0's
// kernel. An operation not issued yet is waited for, except
//  - on a rank this thread drives: it comes later from this thread (one thread driving several
//    ranks outside a group);
//  - on a rank no live thread has driven yet, after the grace period (single-thread patterns);
//  - on a rank whose thread waits here for this thread in turn (a cycle of host waits: ranks
//    issuing one call at a time what a peer groups, each needing, through the peer's group,
//    the other's next call). Everyone in such a cycle is inside mkernel, so all go ahead.
Verdict evaluate(const Call& mine, Clock::time_point now) {
  Closure cl;
  Verdict bad;
  if (!closureOf(&mine, &cl, &bad)) return bad;
  for (const auto& u : cl.unissued) {
    const Call* call = u.first;
    const Dep& d = *u.second;
    const Slot& s = d.c->slots[d.q];
    const uint64_t owner = s.owner.load(std::memory_order_acquire);
    if (owner == mine.thread) continue;
    if (owner == 0) {
      if (s.state.load(std::memory_order_acquire) == kJoined && now - call->t0 >= kGrace) continue;
    } else if (waitsForMe(owner, mine.thread)) {
      continue;
    }
    return missing(call == &mine, d, false, false);
  }
  return Verdict{};
}

// Slots this thread drives: released when it exits, so that a thread that later drives those
// ranks alone (a test's main thread after its workers) is not made to wait for a dead owner.
struct Owned {
  std::vector<std::pair<std::weak_ptr<RdvClique>, int>> v;
  ~Owned() {
    if (v.empty()) return;
    uint64_t me = threadId();
    std::lock_guard<std::mutex> g(boardMu());
    for (auto& e : v) {
      std::shared_ptr<RdvClique> c = e.first.lock();
      if (!c) continue;
      uint64_t expect = me;
      c->slots[e.second].owner.compare_exchange_strong(expect, 0);
    }
    boardCv().notify_all();
  }
  void add(const std::shared_ptr<RdvClique>& c, int slot) {
    if (v.size() >= 64)
      v.erase(std::remove_if(v.begin(), v.end(), [](auto& e) { return e.first.expired(); }),
              v.end());
    v.emplace_back(c, slot);
  }
};
thread_local Owned tlsOwned;

std::map<std::pair<uint64_t, int>, std::weak_ptr<RdvClique>>& registry() {
  static auto* m = new std::map<std::pair<uint64_t, int>, std::weak_ptr<RdvClique>>();
  return *m;
}

ncclResult_t fail(ncclComm* comm, ncclResult_t res, const std::string& msg) {
  MK_WARN("%s", msg.c_str());
  commSetAsyncError(comm, res, msg.c_str());
  return res;
}

// What the call that `slot` issued last (between its `before` and `posted` counts) needs
// from the other slots of c. The i-th send from p to q matches q's i-th receive from p, as
// NCCL matches them: the last operation per peer and direction says how far that peer must
// have come.
void depsOf(RdvClique* c, int slot, bool colls, std::vector<Dep>* deps) {
  const Slot& s = c->slots[slot];
  for (int q = 0; q < c->n; q++) {
    if (q == slot) continue;
    if (colls) deps->push_back({c, q, slot, kDepColl, s.posted.colls});
    if (s.posted.sent[q] > s.before.sent[q])
      deps->push_back({c, q, slot, kDepSendTo, s.posted.sent[q]});
    if (s.posted.recvd[q] > s.before.recvd[q])
      deps->push_back({c, q, slot, kDepRecvFrom, s.posted.recvd[q]});
  }
}

// Posts what the works issue (under the board lock) and returns the call's dependencies.
void post(const std::vector<RdvWork>& works, Call* call, std::vector<ncclComm*>* launching) {
  const uint64_t me = call->thread;
  for (const RdvWork& w : works) {
    CollState* cs = w.comm->coll;
    if (cs == nullptr || !cs->rdv) continue;
    RdvClique* c = cs->rdv.get();
    const int slot = cs->rdvSlot;
    Slot& s = c->slots[slot];
    if (s.owner.load(std::memory_order_relaxed) != me) {
      s.owner.store(me, std::memory_order_release);
      tlsOwned.add(cs->rdv, slot);
    }
    const auto key = std::make_pair(c, slot);
    if (std::find(call->slots.begin(), call->slots.end(), key) == call->slots.end()) {
      s.before = s.posted;
      call->slots.push_back(key);
    }
    s.posted.colls += w.colls;
    if (w.p2p) {
      for (const CollArgs& a : *w.p2p) {
        int q = a.root >= 0 && a.root < (int)c->slotOf.size() ? c->slotOf[a.root] : -1;
        if (q < 0 || q == slot) continue;  // another process or GPU (no shared context); self
        (a.type == CollType::kSend ? s.posted.sent[q] : s.posted.recvd[q])++;
      }
    }
    if (!w.launches) continue;
    launching->push_back(w.comm);
    depsOf(c, slot, w.colls > 0, &call->deps);
  }
}

// Every dependency is on a rank this thread drives itself (none inside a failed call, none on
// a destroyed rank): one thread driving all ranks in a group, as nccl-tests -g N and the
// benchmarks do. evaluate() lets such a call through too; this answers without registering a
// waiting call and walking closures, on the host path of every small grouped collective.
bool ownDeps(const Call& call) {
  for (const Dep& d : call.deps) {
    const Slot& s = d.c->slots[d.q];
    if (s.owner.load(std::memory_order_relaxed) != call.thread) return false;
    if (inFailedCall(s, d)) return false;
    if (countOf(s.posted, d) < d.v && s.state.load(std::memory_order_acquire) == kLeft)
      return false;  // destroyed before issuing: evaluate() names it
  }
  return true;
}

}  // namespace

ncclResult_t rdvJoin(ncclComm* comm, std::shared_ptr<RdvClique>* out, int* slot) {
  out->reset();
  *slot = -1;
  const RankInfo& me = comm->peerInfo[comm->rank];
  std::vector<int> ranks;
  for (int r = 0; r < comm->nRanks; r++) {
    const RankInfo& p = comm->peerInfo[r];
    if (p.hostHash == me.hostHash && p.pidHash == me.pidHash && p.cudaDev == comm->cudaDev)
      ranks.push_back(r);
  }
  if (ranks.size() <= 1) return ncclSuccess;
  const int mine = (int)(std::find(ranks.begin(), ranks.end(), comm->rank) - ranks.begin());
  std::shared_ptr<RdvClique> c;
  {
    std::lock_guard<std::mutex> g(boardMu());
    auto& reg = registry();
    // Forget cliques whose ranks are all gone.
    for (auto it = reg.begin(); it != reg.end();) it = it->second.expired() ? reg.erase(it) : ++it;
    const auto key = std::make_pair(comm->commHash, comm->cudaDev);
    auto it = reg.find(key);
    if (it != reg.end()) c = it->second.lock();
    // A clique of another comm with the same hash (or this slot taken) is not ours.
    if (c &&
        (c->rankOfSlot != ranks || c->slots[mine].state.load(std::memory_order_acquire) != kAbsent))
      c.reset();
    if (!c) {
      c = std::make_shared<RdvClique>();
      c->n = (int)ranks.size();
      c->dev = comm->cudaDev;
      c->rankOfSlot = ranks;
      c->slotOf.assign(comm->nRanks, -1);
      for (int s = 0; s < c->n; s++) c->slotOf[ranks[s]] = s;
      c->slots.reset(new Slot[c->n]);
      for (int s = 0; s < c->n; s++)
        for (Counts* k : {&c->slots[s].posted, &c->slots[s].before, &c->slots[s].launched}) {
          k->sent.assign(c->n, 0);
          k->recvd.assign(c->n, 0);
        }
      reg[key] = c;
    }
    c->slots[mine].state.store(kJoined, std::memory_order_release);
    boardCv().notify_all();
  }
  *out = c;
  *slot = mine;
  MK_INFO(kColl | kInit,
          "rank %d: %d ranks of this comm share GPU %d in this process (slot %d): calls wait on "
          "the host for the matching calls of the threads that drive them",
          comm->rank, c->n, comm->cudaDev, mine);
  return ncclSuccess;
}

void rdvLeave(const std::shared_ptr<RdvClique>& c, int slot) {
  if (!c || slot < 0 || slot >= c->n) return;
  std::lock_guard<std::mutex> g(boardMu());
  c->slots[slot].state.store(kLeft, std::memory_order_release);
  boardCv().notify_all();
}

ncclResult_t rdvArrive(const std::vector<RdvWork>& works, const char* api) {
  Call call;
  call.thread = threadId();
  call.t0 = Clock::now();
  std::vector<ncclComm*> launching;
  std::unique_lock<std::mutex> lk(boardMu());
  post(works, &call, &launching);
  if (call.deps.empty() || ownDeps(call)) {
    boardCv().notify_all();
    return ncclSuccess;
  }
  for (auto& e : call.slots) e.first->slots[e.second].waiting = &call;
  waitingCalls()[call.thread] = &call;
  boardCv().notify_all();

  const int64_t ms = MK_PARAM_INT(TimeoutMs);
  const bool bounded = ms > 0;
  const auto deadline = call.t0 + std::chrono::milliseconds(bounded ? ms : 0);
  ncclComm* comm = launching.front();
  ncclResult_t res = ncclSuccess;
  std::string msg;
  for (;;) {
    const auto now = Clock::now();
    const Verdict v = evaluate(call, now);
    if (v.ready) break;
    // The comm of the call that the missing rank belongs to names the failure.
    comm = launching.front();
    for (ncclComm* lc : launching)
      if (lc->coll->rdv.get() == v.c) comm = lc;
    const int peer = v.c->rankOfSlot[v.q];
    const std::string who = std::string(api) + ": rank " + std::to_string(comm->rank) + ": rank " +
                            std::to_string(peer) + (v.direct ? "" : " (waited for by a peer)");
    if (v.left || v.failed) {
      res = ncclRemoteError;
      msg = who + (v.left ? " (same process and GPU) was destroyed or aborted before issuing its "
                            "matching call"
                          : " (same process and GPU) gave up waiting for its own peers: its "
                            "matching call failed");
      break;
    }
    ncclComm* aborted = nullptr;
    for (ncclComm* lc : launching)
      if (lc->abortFlag && __atomic_load_n(lc->abortFlag, __ATOMIC_ACQUIRE) != 0) aborted = lc;
    if (aborted != nullptr) {
      comm = aborted;
      res = ncclSystemError;
      msg = std::string(api) + ": rank " + std::to_string(comm->rank) +
            ": aborted while waiting for rank " + std::to_string(peer) +
            " to issue its matching call";
      break;
    }
    if (bounded && now >= deadline) {
      char buf[640];
      snprintf(buf, sizeof(buf),
               "%s: rank %d waited %.1f s for rank %d%s (a thread of this process on GPU %d) to "
               "issue its matching call; it never did (MKERNEL_TIMEOUT_MS=%lld). A thread that "
               "drives several ranks must issue their calls inside one "
               "ncclGroupStart/ncclGroupEnd",
               api, comm->rank, std::chrono::duration<double>(now - call.t0).count(), peer,
               v.direct ? "" : ", which a peer's call waits for", v.c->dev, (long long)ms);
      res = ncclRemoteError;
      msg = buf;
      break;
    }
    if (now - call.t0 < kSpin) {
      lk.unlock();
      std::this_thread::yield();
      lk.lock();
      continue;
    }
    // Woken by every post, pass and owner change; the timed wait bounds abort and grace.
    boardCv().wait_for(lk, std::chrono::milliseconds(2));
  }
  waitingCalls().erase(call.thread);
  for (auto& e : call.slots) {
    Slot& s = e.first->slots[e.second];
    if (s.waiting == &call) s.waiting = nullptr;
    if (res != ncclSuccess) {  // nothing of this call is launched
      s.failed = true;
      s.failLo = s.before;
      s.failHi = s.posted;
    }
  }
  boardCv().notify_all();
  lk.unlock();
  return res == ncclSuccess ? ncclSuccess : fail(comm, res, msg);
}

namespace {
// Whether a peer's matching operation (dependency d of a call of thread `me`) still has to be
// launched by a thread that will launch it without anything from `me`: it was issued (a
// call that rdvArrive let through for an unissued operation did so because that operation
// needs `me` first), its rank lives, its call did not fail, and its thread is not waiting
// here for `me`.
bool launchPending(const Dep& d, uint64_t me) {
  const Slot& s = d.c->slots[d.q];
  if (countOf(s.launched, d) >= d.v || countOf(s.posted, d) < d.v) return false;
  if (s.state.load(std::memory_order_acquire) == kLeft) return false;
  if (inFailedCall(s, d)) return false;
  const uint64_t owner = s.owner.load(std::memory_order_acquire);
  if (owner == 0 || owner == me) return false;
  return !waitsForMe(owner, me);
}
}  // namespace

void rdvLaunched(const std::vector<RdvWork>& works, bool wait) {
  const uint64_t me = threadId();
  std::vector<Dep> deps;
  std::vector<ncclComm*> comms;
  std::unique_lock<std::mutex> lk(boardMu());
  for (const RdvWork& w : works) {
    CollState* cs = w.comm->coll;
    if (cs == nullptr || !cs->rdv) continue;
    Slot& s = cs->rdv->slots[cs->rdvSlot];
    s.launched = s.posted;
    if (!w.launches || !wait) continue;
    depsOf(cs->rdv.get(), cs->rdvSlot, w.colls > 0, &deps);
    comms.push_back(w.comm);
  }
  boardCv().notify_all();
  if (deps.empty()) return;
  const int64_t ms = MK_PARAM_INT(TimeoutMs);
  const auto t0 = Clock::now();
  for (;;) {
    bool pending = false;
    for (const Dep& d : deps) pending = pending || launchPending(d, me);
    if (!pending) return;
    for (ncclComm* c : comms)
      if (c->abortFlag && __atomic_load_n(c->abortFlag, __ATOMIC_ACQUIRE) != 0) return;
    const auto now = Clock::now();
    // The kernels are launched: a peer that never launches is reported by their device
    // timeouts, with the peer and the operation named; here the call just stops waiting.
    if (ms > 0 && now - t0 >= std::chrono::milliseconds(ms)) return;
    if (now - t0 < kSpin) {
      lk.unlock();
      std::this_thread::yield();
      lk.lock();
      continue;
    }
    boardCv().wait_for(lk, std::chrono::milliseconds(2));
  }
}

ncclResult_t rdvArriveOne(ncclComm* comm, const char* api) {
  if (comm == nullptr || comm->coll == nullptr || !comm->coll->rdv) return ncclSuccess;
  RdvWork w;
  w.comm = comm;
  w.colls = 1;
  w.launches = true;
  return rdvArrive({w}, api);
}

}  // namespace mk
