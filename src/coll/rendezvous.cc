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
// Spinning (with yield) before sleeping on the condition variable: threads released by the
// same collective arrive within microseconds of each other.
constexpr auto kSpin = std::chrono::microseconds(50);

enum SlotState : int { kAbsent = 0, kJoined = 1, kLeft = 2 };

struct Slot {
  std::atomic<int> state{kAbsent};
  std::atomic<uint64_t> owner{0};  // id of the thread that last issued on this rank (0: none)
  std::atomic<uint64_t> colls{0};  // collectives posted
  std::unique_ptr<std::atomic<uint64_t>[]> sent, recvd;  // [n] sends to / receives from slot q
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
  std::mutex mu;  // guards sleeping only; counters are atomics
  std::condition_variable cv;

  void wake() {
    { std::lock_guard<std::mutex> g(mu); }
    cv.notify_all();
  }
};

namespace {

// Slots this thread drives: released when it exits, so that a thread that later drives those
// ranks alone (a test's main thread after its workers) is not made to wait for a dead owner.
struct Owned {
  std::vector<std::pair<std::weak_ptr<RdvClique>, int>> v;
  ~Owned() {
    uint64_t me = threadId();
    for (auto& e : v) {
      std::shared_ptr<RdvClique> c = e.first.lock();
      if (!c) continue;
      uint64_t expect = me;
      if (c->slots[e.second].owner.compare_exchange_strong(expect, 0)) c->wake();
    }
  }
  void add(const std::shared_ptr<RdvClique>& c, int slot) {
    if (v.size() >= 64)
      v.erase(std::remove_if(v.begin(), v.end(), [](auto& e) { return e.first.expired(); }),
              v.end());
    v.emplace_back(c, slot);
  }
};
thread_local Owned tlsOwned;

std::mutex& registryMu() {
  static std::mutex* m = new std::mutex();
  return *m;
}
std::map<std::pair<uint64_t, int>, std::weak_ptr<RdvClique>>& registry() {
  static auto* m = new std::map<std::pair<uint64_t, int>, std::weak_ptr<RdvClique>>();
  return *m;
}

// What one launching comm of a call waits for.
struct Need {
  ncclComm* comm;
  std::shared_ptr<RdvClique> c;
  int slot;
  uint64_t colls;                               // 0: no collective in this call
  std::vector<std::pair<int, uint64_t>> sends;  // (peer slot, receives it must have posted)
  std::vector<std::pair<int, uint64_t>> recvs;  // (peer slot, sends it must have posted)
};

// Slot q's contribution to need is missing.
bool missing(const Need& n, int q) {
  const Slot& s = n.c->slots[q];
  if (n.colls > 0 && s.colls.load(std::memory_order_acquire) < n.colls) return true;
  for (auto& p : n.sends)
    if (p.first == q && s.recvd[n.slot].load(std::memory_order_acquire) < p.second) return true;
  for (auto& p : n.recvs)
    if (p.first == q && s.sent[n.slot].load(std::memory_order_acquire) < p.second) return true;
  return false;
}

// -1: satisfied; otherwise the first slot still waited for. *left: that slot's rank is gone.
int pending(const Need& n, bool graceOver, bool* left) {
  const uint64_t me = threadId();
  *left = false;
  for (int q = 0; q < n.c->n; q++) {
    if (q == n.slot || !missing(n, q)) continue;
    const Slot& s = n.c->slots[q];
    uint64_t owner = s.owner.load(std::memory_order_acquire);
    int state = s.state.load(std::memory_order_acquire);
    if (owner == me) continue;  // this thread drives it: it comes later or in this group
    if (state == kLeft) {
      *left = true;
      return q;
    }
    if (state == kJoined && owner == 0 && graceOver) continue;
    return q;
  }
  return -1;
}

ncclResult_t fail(ncclComm* comm, ncclResult_t res, const std::string& msg) {
  MK_WARN("%s", msg.c_str());
  commSetAsyncError(comm, res, msg.c_str());
  return res;
}

ncclResult_t waitFor(const Need& n, const char* api) {
  ncclComm* comm = n.comm;
  const auto t0 = Clock::now();
  const int64_t ms = MK_PARAM_INT(TimeoutMs);
  const bool bounded = ms > 0;
  const auto deadline = t0 + std::chrono::milliseconds(bounded ? ms : 0);
  bool left = false;
  for (;;) {
    const auto now = Clock::now();
    int q = pending(n, now - t0 >= kGrace, &left);
    if (q < 0) return ncclSuccess;
    const int peer = n.c->rankOfSlot[q];
    if (left)
      return fail(comm, ncclRemoteError,
                  std::string(api) + ": rank " + std::to_string(comm->rank) + ": rank " +
                      std::to_string(peer) +
                      " (same process and GPU) was destroyed or aborted before issuing its "
                      "matching call");
    if (comm->abortFlag && __atomic_load_n(comm->abortFlag, __ATOMIC_ACQUIRE) != 0)
      return fail(comm, ncclSystemError,
                  std::string(api) + ": rank " + std::to_string(comm->rank) +
                      ": aborted while waiting for rank " + std::to_string(peer) +
                      " to issue its matching call");
    if (bounded && now >= deadline) {
      char buf[512];
      snprintf(buf, sizeof(buf),
               "%s: rank %d waited %.1f s for rank %d (a thread of this process on GPU %d) to "
               "issue its matching call; it never did (MKERNEL_TIMEOUT_MS=%lld). A thread that "
               "drives several ranks must issue their calls inside one "
               "ncclGroupStart/ncclGroupEnd",
               api, comm->rank, std::chrono::duration<double>(now - t0).count(), peer, n.c->dev,
               (long long)ms);
      return fail(comm, ncclRemoteError, buf);
    }
    if (now - t0 < kSpin) {
      std::this_thread::yield();
      continue;
    }
    // Woken by every post and owner change; the timed wait bounds abort and grace latency.
    std::unique_lock<std::mutex> lk(n.c->mu);
    bool dummy = false;
    if (pending(n, Clock::now() - t0 >= kGrace, &dummy) < 0) return ncclSuccess;
    n.c->cv.wait_for(lk, std::chrono::milliseconds(2));
  }
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
    std::lock_guard<std::mutex> g(registryMu());
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
      for (int s = 0; s < c->n; s++) {
        c->slots[s].sent.reset(new std::atomic<uint64_t>[c->n]);
        c->slots[s].recvd.reset(new std::atomic<uint64_t>[c->n]);
        for (int q = 0; q < c->n; q++) {
          c->slots[s].sent[q].store(0);
          c->slots[s].recvd[q].store(0);
        }
      }
      reg[key] = c;
    }
    c->slots[mine].state.store(kJoined, std::memory_order_release);
  }
  c->wake();
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
  c->slots[slot].state.store(kLeft, std::memory_order_release);
  c->wake();
}

ncclResult_t rdvArrive(const std::vector<RdvWork>& works, const char* api) {
  const uint64_t me = threadId();
  std::vector<Need> needs;
  for (const RdvWork& w : works) {
    CollState* cs = w.comm->coll;
    if (cs == nullptr || !cs->rdv) continue;
    const std::shared_ptr<RdvClique>& c = cs->rdv;
    const int slot = cs->rdvSlot;
    Slot& s = c->slots[slot];
    if (s.owner.load(std::memory_order_relaxed) != me) {
      s.owner.store(me, std::memory_order_release);
      tlsOwned.add(c, slot);
    }
    // Only this thread writes this slot's counters (one thread uses a comm at a time).
    Need n{w.comm, c, slot, 0, {}, {}};
    if (w.colls > 0) n.colls = s.colls.fetch_add(w.colls, std::memory_order_acq_rel) + w.colls;
    if (w.p2p) {
      for (const CollArgs& a : *w.p2p) {
        int q = a.root >= 0 && a.root < (int)c->slotOf.size() ? c->slotOf[a.root] : -1;
        if (q < 0 || q == slot) continue;  // another process or GPU (no shared context); self
        bool send = a.type == CollType::kSend;
        uint64_t v = (send ? s.sent[q] : s.recvd[q]).fetch_add(1, std::memory_order_acq_rel) + 1;
        auto& list = send ? n.sends : n.recvs;
        auto it = std::find_if(list.begin(), list.end(), [&](auto& p) { return p.first == q; });
        if (it == list.end())
          list.emplace_back(q, v);
        else
          it->second = v;
      }
    }
    c->wake();
    if (w.launches) needs.push_back(std::move(n));
  }
  for (const Need& n : needs) NCCLCHECK(waitFor(n, api));
  return ncclSuccess;
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
