// The host rendezvous follows chains of waiting calls (coll/rendezvous.h). A rank's kernel
// spins until its peers' kernels run, and a peer launches only when its own host wait ends,
// so a call must not launch before every rank of that chain has issued its part. Waiting for
// the direct peers only deadlocked the send/recv ring of 4 and 8 threads on the H200 (rank 0
// launched, rank 1 still waited for rank 2, whose thread sat in cudaDeviceSynchronize behind
// rank 0's kernel). Proven here on fake comms, and against a CPU model of the GPU: a kernel
// runs until the kernels it depends on are launched, and a device-wide synchronisation waits
// for every kernel launched before it. With the rendezvous no synchronisation waits for long,
// whatever the mix of collectives, rings, pairs and groups, one or two ranks per thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "coll/rendezvous.h"
#include "common/test_util.h"
#include "unit/rdv_fake_comms.h"

namespace {

using namespace rdvtest;
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Runs body(r) on n threads that keep their rank: thread r first issues one collective on it
// (`first`, default coll(f[r])) and waits until every thread has, as nccl-tests' threads drive
// their ranks from their first call on. The time origin of body is when all got there.
void crew(int n, const std::function<ncclResult_t(int)>& first,
          const std::function<void(int, Clock::time_point)>& body) {
  std::atomic<int> ready{0};
  std::atomic<int64_t> origin{0};
  std::vector<std::thread> th;
  for (int r = 0; r < n; r++)
    th.emplace_back([&, r] {
      EXPECT_EQ(first(r), ncclSuccess) << "rank " << r << ": first collective";
      if (++ready == n) origin = Clock::now().time_since_epoch().count();
      const auto until = Clock::now() + std::chrono::seconds(10);
      while (origin.load() == 0 && Clock::now() < until) std::this_thread::yield();
      body(r, Clock::time_point(Clock::duration(origin.load())));
    });
  for (auto& t : th) t.join();
}
void crew(FakeComms& f, int n, const std::function<void(int, Clock::time_point)>& body) {
  crew(
      n, [&](int r) { return coll(f[r]); }, body);
}

std::vector<mk::CollArgs> ringOps(int r, int n) {
  return {sendTo((r + 1) % n), recvFrom((r + n - 1) % n)};
}

// Ring of n threads; rank `slow` issues its part `delayMs` late. No rank may return before
// the slow rank has issued, since every kernel of the ring depends on it through the chain.
void ringWithOneLateRank(int n, int slow, int delayMs) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  FakeComms f(n, -1, 0x1000 + n);
  std::vector<double> back(n, -1);
  std::atomic<double> postedAt{-1};
  std::vector<ncclResult_t> res(n, ncclInternalError);
  crew(f, n, [&](int r, Clock::time_point t0) {
    const std::vector<mk::CollArgs> ops = ringOps(r, n);
    if (r == slow) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
      postedAt = since(t0);
    }
    res[r] = p2p(f[r], ops);
    back[r] = since(t0);
  });
  for (int r = 0; r < n; r++) {
    EXPECT_EQ(res[r], ncclSuccess) << "rank " << r;
    EXPECT_GE(back[r], postedAt.load())
        << "rank " << r << " of " << n << " returned before rank " << slow << " issued its part";
    EXPECT_LT(back[r], 5.0) << "rank " << r;
  }
}

TEST(CollRendezvousChain, RingWaitsForEveryRankOfTheRing) {
  ringWithOneLateRank(4, 2, 300);
  ringWithOneLateRank(8, 5, 300);
  ringWithOneLateRank(5, 0, 300);
}

// Two independent pairs: the chain of a pair ends at the pair, so a late pair does not hold
// up the other one (the rendezvous does not degenerate into "wait for every rank").
TEST(CollRendezvousChain, PairsDoNotWaitForOtherPairs) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 4;
  FakeComms f(n, -1, 0x2000);
  std::vector<double> back(n, -1), posted(n, -1);
  std::vector<ncclResult_t> res(n, ncclInternalError);
  crew(f, n, [&](int r, Clock::time_point t0) {
    const std::vector<mk::CollArgs> ops{sendTo(r ^ 1), recvFrom(r ^ 1)};
    if (r >= 2) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    posted[r] = since(t0);
    res[r] = p2p(f[r], ops);
    back[r] = since(t0);
  });
  for (int r = 0; r < n; r++) EXPECT_EQ(res[r], ncclSuccess) << r;
  EXPECT_LT(back[0], posted[2]);
  EXPECT_LT(back[1], posted[3]);
  EXPECT_GE(back[2], posted[3]);
  EXPECT_GE(back[3], posted[2]);
}

// The chain crosses comms: rank 1's group receives from rank 0 on comm A and sends to rank 2
// on comm B, so rank 0's send on A waits until rank 2 has issued its receive on B.
TEST(CollRendezvousChain, ChainThroughAGroupOnAnotherComm) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 3;
  FakeComms a(n, -1, 0x3a00), b(n, -1, 0x3b00);
  std::atomic<double> postedAt{-1};
  std::vector<double> back(n, -1);
  auto both = [&](int r) {  // every thread drives rank r of both comms
    return mk::rdvArrive({work(a[r], 1, nullptr), work(b[r], 1, nullptr)}, "test");
  };
  crew(n, both, [&](int r, Clock::time_point t0) {
    if (r == 0) {
      EXPECT_EQ(p2p(a[0], {sendTo(1)}), ncclSuccess);
    } else if (r == 1) {
      const std::vector<mk::CollArgs> onA{recvFrom(0)}, onB{sendTo(2)};
      EXPECT_EQ(mk::rdvArrive({work(a[1], 0, &onA), work(b[1], 0, &onB)}, "test"), ncclSuccess);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      postedAt = since(t0);
      EXPECT_EQ(p2p(b[2], {recvFrom(1)}), ncclSuccess);
    }
    back[r] = since(t0);
  });
  EXPECT_GE(back[0], postedAt.load());
  EXPECT_GE(back[1], postedAt.load());
  EXPECT_LT(back[0], 5.0);
}

// A call in the chain fails (here: its comm is aborted while it waits for a rank that never
// comes): its kernels are never launched, so the calls that need it fail at once too instead
// of launching kernels that would spin until the device timeout.
TEST(CollRendezvousChain, AFailedCallInTheChainFailsItsDependents) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 4;
  FakeComms f(n, -1, 0x4000);
  std::atomic<bool> stop{false};
  std::vector<std::atomic<double>> back(n);
  for (auto& b : back) b = -1;
  std::vector<ncclResult_t> res(n, ncclInternalError);
  std::thread control([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    __atomic_store_n(f[1]->abortFlag, 1u, __ATOMIC_RELEASE);  // rank 1 gives up (abort)
    // Rank 0 needs rank 1's call, rank 3 needs rank 0's: all are done within moments.
    const auto until = Clock::now() + std::chrono::seconds(5);
    while ((back[0] < 0 || back[1] < 0 || back[3] < 0) && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    f.abortAll();  // (ends the waits if they were not)
    stop = true;
  });
  crew(f, n, [&](int r, Clock::time_point t0) {
    if (r == 2) {  // alive, never issues its part of the ring
      while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    res[r] = p2p(f[r], ringOps(r, n));
    back[r] = since(t0);
  });
  control.join();
  EXPECT_EQ(res[1], ncclSystemError);
  EXPECT_EQ(res[0], ncclRemoteError);
  EXPECT_GE(back[0], 0.25);
  EXPECT_LT(back[0], 3.0) << "rank 0 waited for its own timeout instead of failing with rank 1";
  EXPECT_LT(back[1], 3.0);
  EXPECT_NE(f[0]->asyncMsg.find("rank 1"), std::string::npos) << f[0]->asyncMsg;
  EXPECT_EQ(res[3], ncclRemoteError);
  EXPECT_LT(back[3], 3.0);
}

// Calls that wait for each other's later calls through a peer's group never form a cycle of
// host waits: threads waiting here for each other go ahead. Rank 0 groups two collectives;
// ranks 1 and 2 issue them one call at a time, so each one's first call depends (through rank
// 0's group) on the other's second call.
TEST(CollRendezvousChain, SomeRanksGroupWhatOthersIssueOneByOne) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 3;
  FakeComms f(n, -1, 0x6000);
  std::vector<double> took(n, -1);
  crew(f, n, [&](int r, Clock::time_point) {
    for (int rep = 0; rep < 20; rep++) {
      const auto t0 = Clock::now();
      if (r == 0) {
        EXPECT_EQ(coll(f[0], 2), ncclSuccess);
      } else {
        EXPECT_EQ(coll(f[r]), ncclSuccess);
        EXPECT_EQ(coll(f[r]), ncclSuccess);
      }
      took[r] = std::max(took[r], since(t0));
    }
  });
  for (int r = 0; r < n; r++) EXPECT_LT(took[r], 2.0) << "rank " << r;
}

// Rank 0 sends to rank 2, then to rank 1; rank 1 receives from rank 0, then sends to rank 2;
// rank 2 receives from both in one group. Rank 1's first call needs rank 0's second, which
// (through rank 2's group) needs rank 1's second: neither waits for the other for long.
TEST(CollRendezvousChain, NoCycleOfHostWaitsThroughAGroup) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 3;
  FakeComms f(n, -1, 0x7000);
  std::vector<double> back(n, -1);
  crew(f, n, [&](int r, Clock::time_point t0) {
    if (r == 0) {
      EXPECT_EQ(p2p(f[0], {sendTo(2)}), ncclSuccess);
      EXPECT_EQ(p2p(f[0], {sendTo(1)}), ncclSuccess);
    } else if (r == 1) {
      EXPECT_EQ(p2p(f[1], {recvFrom(0)}), ncclSuccess);
      EXPECT_EQ(p2p(f[1], {sendTo(2)}), ncclSuccess);
    } else {
      EXPECT_EQ(p2p(f[2], {recvFrom(0), recvFrom(1)}), ncclSuccess);
    }
    back[r] = since(t0);
  });
  for (int r = 0; r < n; r++) EXPECT_LT(back[r], 2.0) << "rank " << r;
}

// ---- against a model of the GPU -------------------------------------------------------

// What the kernels of the ranks have launched, and the kernels still running. A kernel runs
// until the operations it matches are launched on the peers (the i-th collective of every
// rank, the i-th send from p to q with q's i-th receive from p), as mkernel's kernels spin on
// their peers' flags.
class GpuModel {
 public:
  explicit GpuModel(int n)
      : colls_(n, 0),
        sent_(n, std::vector<uint64_t>(n, 0)),
        recvd_(n, std::vector<uint64_t>(n, 0)) {}
  // Rank r's launches of one call: a kernel per collective, one for its sends and receives.
  void launch(int r, uint64_t colls, const std::vector<mk::CollArgs>& ops) {
    std::lock_guard<std::mutex> g(mu_);
    const int n = (int)colls_.size();
    for (uint64_t i = 0; i < colls; i++) {
      Kernel k{r, {}};
      colls_[r]++;
      for (int q = 0; q < n; q++)
        if (q != r) k.reqs.push_back({q, Req::kColl, r, colls_[r]});
      live_.push_back(std::move(k));
    }
    Kernel k{r, {}};
    for (const mk::CollArgs& a : ops) {
      const int q = a.root;
      if (q == r) continue;
      if (a.type == mk::CollType::kSend)
        k.reqs.push_back({q, Req::kRecvd, r, ++sent_[r][q]});
      else
        k.reqs.push_back({q, Req::kSent, r, ++recvd_[r][q]});
    }
    if (!k.reqs.empty()) live_.push_back(std::move(k));
    live_.erase(std::remove_if(live_.begin(), live_.end(),
                               [&](const Kernel& x) { return waitsFor(x).empty(); }),
                live_.end());
    cv_.notify_all();
  }
  // cudaDeviceSynchronize: waits for every kernel launched so far, at most timeoutS; "" or
  // what a kernel still waits for.
  std::string deviceSync(double timeoutS) {
    std::unique_lock<std::mutex> lk(mu_);
    const std::vector<Kernel> snap = live_;
    auto pending = [&]() -> std::string {
      for (const Kernel& k : snap) {
        std::string w = waitsFor(k);
        if (!w.empty()) return w;
      }
      return "";
    };
    cv_.wait_for(lk, std::chrono::duration<double>(timeoutS), [&] { return pending().empty(); });
    return pending();
  }

 private:
  struct Req {
    enum Kind { kColl, kSent, kRecvd } kind;
    int q, from;
    uint64_t v;
    Req(int q, Kind kind, int from, uint64_t v) : kind(kind), q(q), from(from), v(v) {}
  };
  struct Kernel {
    int rank;
    std::vector<Req> reqs;
  };
  std::string waitsFor(const Kernel& k) const {
    for (const Req& x : k.reqs) {
      const uint64_t have = x.kind == Req::kColl   ? colls_[x.q]
                            : x.kind == Req::kSent ? sent_[x.q][x.from]
                                                   : recvd_[x.q][x.from];
      if (have < x.v)
        return "a kernel of rank " + std::to_string(k.rank) + " still waits for rank " +
               std::to_string(x.q) + "'s matching kernel";
    }
    return "";
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> colls_;
  std::vector<std::vector<uint64_t>> sent_, recvd_;
  std::vector<Kernel> live_;
};

// One call of a rank: collectives and point-to-point operations.
struct Part {
  uint64_t colls = 0;
  std::vector<mk::CollArgs> ops;
};

// Rank r's calls in round `round`, from a plan all ranks share: collectives, a ring either
// way, pairs, a shift, a star, one pair only, a random permutation, a collective and a ring
// in one group, or two collectives and a ring that some ranks group and the others issue one
// call at a time (matched by order, as NCCL matches them).
std::vector<Part> planRound(int round, int r, int n, uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + round);
  const int kind = (int)(rng() % 10);
  std::vector<Part> calls(1);
  Part& p = calls[0];
  auto send = [&](int q) { p.ops.push_back(sendTo(q)); };
  auto recv = [&](int q) { p.ops.push_back(recvFrom(q)); };
  switch (kind) {
    case 0:
      p.colls = 1 + rng() % 2;
      break;
    case 1:
    case 8:
      if (kind == 8) p.colls = 1;
      send((r + 1) % n);
      recv((r + n - 1) % n);
      break;
    case 2:
      recv((r + 1) % n);
      send((r + n - 1) % n);
      break;
    case 3:
      if ((r ^ 1) < n) {
        send(r ^ 1);
        recv(r ^ 1);
      }
      break;
    case 4: {
      const int k = 1 + (int)(rng() % (n - 1));
      send((r + k) % n);
      recv((r + n - k) % n);
      break;
    }
    case 5:
      if (r == 0)
        for (int q = 1; q < n; q++) recv(q);
      else
        send(0);
      break;
    case 6:
      if (r == 0 || r == n - 1) {
        send(n - 1 - r);
        recv(n - 1 - r);
      }
      break;
    case 7: {
      std::vector<int> perm(n);
      for (int i = 0; i < n; i++) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      send(perm[r]);
      recv((int)(std::find(perm.begin(), perm.end(), r) - perm.begin()));
      break;
    }
    case 9:
      send((r + 1) % n);
      recv((r + n - 1) % n);
      if ((r + round) % 2 == 0) {
        p.colls = 2;
      } else {
        calls.insert(calls.begin(), 2, Part());
        calls[0].colls = calls[1].colls = 1;
      }
      break;
  }
  return calls;
}

// nThreads threads drive ranksPerThread consecutive ranks each (a thread's ranks in one call,
// like nccl-tests -t T -g G) and synchronise the device at random between rounds.
std::string runModel(int nThreads, int ranksPerThread, int rounds, uint64_t seed) {
  const int n = nThreads * ranksPerThread;
  FakeComms f(n, -1, 0x5000 + 97 * n + ranksPerThread);
  GpuModel gpu(n);
  std::mutex mu;
  std::string first;
  std::atomic<bool> stop{false};
  auto failed = [&](const std::string& e) {
    {
      std::lock_guard<std::mutex> g(mu);
      if (first.empty()) first = e;
    }
    stop = true;
    f.abortAll();  // ends the others' waits
  };
  // Every thread first issues one collective on its ranks and waits for the others to have
  // done so: from then on every rank has a live owner (no grace period for ranks nobody
  // drives yet, which a slow start could otherwise hit).
  std::atomic<int> owned{0};
  std::vector<std::thread> th;
  for (int t = 0; t < nThreads; t++)
    th.emplace_back([&, t] {
      std::mt19937_64 rng(seed + 1000003ull * t);
      std::vector<mk::RdvWork> all;
      for (int i = 0; i < ranksPerThread; i++)
        all.push_back(work(f[t * ranksPerThread + i], 1, nullptr));
      if (mk::rdvArrive(all, "model") != ncclSuccess) return failed("first collective failed");
      for (int i = 0; i < ranksPerThread; i++) gpu.launch(t * ranksPerThread + i, 1, {});
      owned++;
      const auto until = Clock::now() + std::chrono::seconds(10);
      while (owned.load() < nThreads && !stop && Clock::now() < until) std::this_thread::yield();
      for (int round = 0; round < rounds && !stop; round++) {
        const std::string where =
            "thread " + std::to_string(t) + ", round " + std::to_string(round) + ": ";
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
        if (rng() % 2 == 0) {
          std::string e = gpu.deviceSync(2.0);
          if (!e.empty()) return failed(where + "device sync before the calls: " + e);
        }
        std::vector<std::vector<Part>> parts;
        size_t nCalls = 0;
        for (int i = 0; i < ranksPerThread; i++) {
          parts.push_back(planRound(round, t * ranksPerThread + i, n, seed));
          nCalls = std::max(nCalls, parts.back().size());
        }
        for (size_t j = 0; j < nCalls; j++) {  // the j-th call of each of the thread's ranks
          std::vector<mk::RdvWork> works;
          for (int i = 0; i < ranksPerThread; i++)
            if (j < parts[i].size() && (parts[i][j].colls > 0 || !parts[i][j].ops.empty()))
              works.push_back(work(f[t * ranksPerThread + i], parts[i][j].colls, &parts[i][j].ops));
          if (works.empty()) continue;
          ncclResult_t res = mk::rdvArrive(works, "model");
          if (res != ncclSuccess)
            return failed(where + "rendezvous failed (" + std::to_string(res) + ")");
          for (int i = 0; i < ranksPerThread; i++)
            if (j < parts[i].size())
              gpu.launch(t * ranksPerThread + i, parts[i][j].colls, parts[i][j].ops);
        }
        if (rng() % 3 == 0) {
          std::string e = gpu.deviceSync(2.0);
          if (!e.empty()) return failed(where + "device sync after the calls: " + e);
        }
      }
    });
  for (auto& x : th) x.join();
  return first;
}

TEST(CollRendezvousChain, NoDeviceSyncWaitsForeverOneRankPerThread) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "10000");
  const uint64_t seed = mktest::testSeed();
  for (int n : {2, 3, 4, 5, 8}) EXPECT_EQ(runModel(n, 1, 150, seed + n), "") << n << " ranks";
}

TEST(CollRendezvousChain, NoDeviceSyncWaitsForeverTwoRanksPerThread) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "10000");
  const uint64_t seed = mktest::testSeed() ^ 0x9e3779b97f4a7c15ull;
  for (int t : {2, 3, 4}) EXPECT_EQ(runModel(t, 2, 150, seed + t), "") << t << " threads x 2 ranks";
}

}  // namespace
