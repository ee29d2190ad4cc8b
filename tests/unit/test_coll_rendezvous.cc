// The host rendezvous of ranks sharing a GPU in one process (coll/rendezvous.h), on fake comms
// (no GPU): a call waits for the threads of the other ranks to issue their matching calls,
// never for a rank the calling thread drives itself, only briefly for ranks no live thread
// drives, and fails (bounded) when a peer is gone, never comes, or the comm is aborted.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "coll/rendezvous.h"
#include "common/test_util.h"
#include "unit/rdv_fake_comms.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

using rdvtest::coll;
using rdvtest::FakeComms;
using rdvtest::p2p;
using rdvtest::recvFrom;
using rdvtest::sendTo;

// Each of the n threads issues one collective on its own rank at the same time.
void oneRound(FakeComms& f, int n) {
  std::vector<std::thread> th;
  std::vector<ncclResult_t> res(n, ncclInternalError);
  for (int r = 0; r < n; r++) th.emplace_back([&, r] { res[r] = coll(f[r]); });
  for (auto& t : th) t.join();
  for (int r = 0; r < n; r++) EXPECT_EQ(res[r], ncclSuccess) << r;
}

TEST(CollRendezvous, WaitsForTheThreadOfTheOtherRank) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  FakeComms f(2);
  // Both threads own their rank from here on; the worker keeps owning rank 1.
  std::atomic<int> phase{0};
  std::atomic<double> t1{-1};
  std::thread worker([&] {
    EXPECT_EQ(coll(f[1]), ncclSuccess);
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    EXPECT_EQ(coll(f[1]), ncclSuccess);
  });
  EXPECT_EQ(coll(f[0]), ncclSuccess);
  while (phase.load() != 1) std::this_thread::yield();
  auto t0 = Clock::now();
  phase = 2;
  EXPECT_EQ(coll(f[0]), ncclSuccess);  // returns only once rank 1 has issued its second call
  double waited = since(t0);
  worker.join();
  EXPECT_GE(waited, 0.35);
  EXPECT_LT(waited, 5.0);
}

TEST(CollRendezvous, OneThreadDrivingAllRanksNeverWaitsForItself) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  for (int n : {2, 4}) {
    FakeComms f(n, -1, 0x100 + n);
    // A group (all ranks in one call) returns at once.
    std::vector<mk::RdvWork> ws(n);
    for (int r = 0; r < n; r++) {
      ws[r].comm = f[r];
      ws[r].colls = 1;
      ws[r].launches = true;
    }
    auto t0 = Clock::now();
    EXPECT_EQ(mk::rdvArrive(ws, "test"), ncclSuccess);
    EXPECT_LT(since(t0), 0.19);
    // Ungrouped calls, rank after rank: the ranks are this thread's now, nothing waits.
    t0 = Clock::now();
    for (int it = 0; it < 10; it++)
      for (int r = 0; r < n; r++) EXPECT_EQ(coll(f[r]), ncclSuccess);
    EXPECT_LT(since(t0), 0.19);
  }
}

TEST(CollRendezvous, RanksNoThreadDrivesYetAreWaitedForBriefly) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  FakeComms f(3, -1, 0x200);
  // Fresh comms, one thread, no group: the first call waits the grace period for the
  // other ranks, then goes ahead (the old single-thread pattern keeps working).
  auto t0 = Clock::now();
  EXPECT_EQ(coll(f[0]), ncclSuccess);
  double first = since(t0);
  EXPECT_GE(first, 0.19);
  EXPECT_LT(first, 2.0);
  t0 = Clock::now();
  EXPECT_EQ(coll(f[1]), ncclSuccess);  // rank 0 is this thread's; rank 2 still nobody's
  EXPECT_GE(since(t0), 0.19);
  t0 = Clock::now();
  EXPECT_EQ(coll(f[2]), ncclSuccess);
  EXPECT_LT(since(t0), 0.19);
}

TEST(CollRendezvous, ARankOfADeadThreadIsNotWaitedForUntilTheTimeout) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "10000");
  FakeComms f(2, -1, 0x300);
  std::thread worker([&] { EXPECT_EQ(coll(f[1]), ncclSuccess); });
  EXPECT_EQ(coll(f[0]), ncclSuccess);
  worker.join();  // its thread is gone: rank 1 has no driver now
  auto t0 = Clock::now();
  EXPECT_EQ(coll(f[0]), ncclSuccess);  // the grace period, not the 10 s timeout
  EXPECT_LT(since(t0), 2.0);
}

TEST(CollRendezvous, SendsWaitForTheMatchingReceiveOnly) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 3;
  FakeComms f(n, -1, 0x400);
  oneRound(f, n);  // every thread owns its rank (rank 2's thread stays alive below)
  std::atomic<bool> stop{false};
  std::thread idle([&] {  // rank 2's owner thread: alive, never sends or receives
    EXPECT_EQ(coll(f[2]), ncclSuccess);
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  std::atomic<double> recvAt{-1};
  auto t0 = Clock::now();
  std::thread receiver([&] {
    EXPECT_EQ(coll(f[1]), ncclSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    recvAt = since(t0);
    EXPECT_EQ(p2p(f[1], {recvFrom(0)}), ncclSuccess);
  });
  EXPECT_EQ(coll(f[0]), ncclSuccess);
  // Rank 0 sends to rank 1 (waits for its receive) and to itself (needs nothing); rank 2
  // takes no part and is not waited for.
  EXPECT_EQ(p2p(f[0], {sendTo(1), sendTo(0), recvFrom(0)}), ncclSuccess);
  double sentAt = since(t0);
  receiver.join();
  stop = true;
  idle.join();
  EXPECT_GE(sentAt, recvAt.load());
  EXPECT_LT(sentAt, 5.0);
}

TEST(CollRendezvous, PeersInOtherProcessesAreNotWaitedFor) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  FakeComms f(2, /*other=*/1, 0x500);
  EXPECT_EQ(f[0]->coll->rdv, nullptr);  // alone on its GPU in this process: no rendezvous
  auto t0 = Clock::now();
  EXPECT_EQ(coll(f[0]), ncclSuccess);
  EXPECT_LT(since(t0), 0.1);
}

TEST(CollRendezvous, FailsWhenThePeerNeverComes) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "300");
  FakeComms f(2, -1, 0x600);
  std::atomic<bool> stop{false};
  std::thread owner([&] {  // owns rank 1 and stays alive without calling again
    EXPECT_EQ(coll(f[1]), ncclSuccess);
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  EXPECT_EQ(coll(f[0]), ncclSuccess);
  auto t0 = Clock::now();
  EXPECT_EQ(coll(f[0]), ncclRemoteError);
  EXPECT_GE(since(t0), 0.25);
  EXPECT_LT(since(t0), 3.0);
  EXPECT_EQ(f[0]->asyncResult.load(), ncclRemoteError);
  EXPECT_NE(f[0]->asyncMsg.find("rank 1"), std::string::npos) << f[0]->asyncMsg;
  stop = true;
  owner.join();
}

TEST(CollRendezvous, FailsAtOnceWhenThePeerIsDestroyedOrTheCommAborted) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  {
    FakeComms f(2, -1, 0x700);
    std::atomic<bool> stop{false};
    std::thread owner([&] {
      EXPECT_EQ(coll(f[1]), ncclSuccess);
      while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    EXPECT_EQ(coll(f[0]), ncclSuccess);
    std::thread leaver([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      mk::rdvLeave(f[1]->coll->rdv, f[1]->coll->rdvSlot);
    });
    auto t0 = Clock::now();
    EXPECT_EQ(coll(f[0]), ncclRemoteError);
    EXPECT_LT(since(t0), 3.0);
    leaver.join();
    stop = true;
    owner.join();
  }
  {
    FakeComms f(2, -1, 0x800);
    std::atomic<bool> stop{false};
    std::thread owner([&] {
      EXPECT_EQ(coll(f[1]), ncclSuccess);
      while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    EXPECT_EQ(coll(f[0]), ncclSuccess);
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      __atomic_store_n(f[0]->abortFlag, 1u, __ATOMIC_RELEASE);
    });
    auto t0 = Clock::now();
    EXPECT_EQ(coll(f[0]), ncclSystemError);
    EXPECT_LT(since(t0), 3.0);
    aborter.join();
    stop = true;
    owner.join();
  }
}

// Many threads, many rounds of collectives and send/recv rings: a call returns only after
// every rank it depends on has started its matching call, and counts never get mixed up.
TEST(CollRendezvous, ManyRoundsManyThreads) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 8, rounds = 300;
  FakeComms f(n, -1, 0x900);
  std::vector<std::atomic<int>> started(n);
  for (auto& s : started) s = 0;
  std::vector<std::thread> th;
  std::vector<std::string> errs(n);
  for (int r = 0; r < n; r++)
    th.emplace_back([&, r] {
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      for (int it = 0; it < rounds && errs[r].empty(); it++) {
        started[r] = it + 1;
        const bool ring = it % 3 == 2;
        ncclResult_t res =
            ring ? p2p(f[r], {sendTo(next), recvFrom(prev)}) : coll(f[r], 1 + it % 2);
        if (res != ncclSuccess) errs[r] = "round " + std::to_string(it) + " failed";
        for (int q = 0; q < n && errs[r].empty(); q++) {
          if (ring && q != next && q != prev) continue;
          if (started[q].load() < it + 1)
            errs[r] = "round " + std::to_string(it) + " returned before rank " + std::to_string(q) +
                      " issued its matching call";
        }
      }
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < n; r++) EXPECT_EQ(errs[r], "") << "rank " << r;
}

// rdvLaunched: once a call's kernels are launched, the caller waits until its in-process peers
// have launched their matching kernels (what follows in its stream may hold a hardware queue
// that a peer's kernel is submitted to). Every round, each thread marks "launched" right
// before rdvLaunched; after it returns, every peer of the round must have marked it.
TEST(CollRendezvous, LaunchedReturnsOnlyAfterEveryMatchingLaunch) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 8, rounds = 200;
  FakeComms f(n, -1, 0xa00);
  std::vector<std::atomic<int>> launched(n);
  for (auto& s : launched) s = 0;
  std::vector<std::thread> th;
  std::vector<std::string> errs(n);
  for (int r = 0; r < n; r++)
    th.emplace_back([&, r] {
      std::mt19937 rng(1234 + r);
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      for (int it = 0; it < rounds && errs[r].empty(); it++) {
        const bool ring = it % 3 == 2;
        const std::vector<mk::CollArgs> ops{sendTo(next), recvFrom(prev)};
        const mk::RdvWork w = rdvtest::work(f[r], ring ? 0 : 1, ring ? &ops : nullptr);
        if (mk::rdvArrive({w}, "test") != ncclSuccess) {
          errs[r] = "round " + std::to_string(it) + " failed";
          break;
        }
        // A launch that takes a while on some threads (a first launch loads the module).
        if (rng() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
        launched[r] = it + 1;
        mk::rdvLaunched({w}, true);
        for (int q = 0; q < n && errs[r].empty(); q++) {
          if (ring && q != next && q != prev) continue;
          if (launched[q].load() < it + 1)
            errs[r] = "round " + std::to_string(it) + ": returned before rank " +
                      std::to_string(q) + " launched its matching call";
        }
      }
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < n; r++) EXPECT_EQ(errs[r], "") << "rank " << r;
}

// A peer that issued its call but never gets to launch it: the wait ends at the timeout, with
// no error (the kernels' device timeouts report the peer); the comm's abort ends it at once.
TEST(CollRendezvous, LaunchedWaitIsBoundedAndAbortable) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "400");
  FakeComms f(2, -1, 0xb00);
  std::atomic<int> phase{0};
  std::thread owner([&] {  // issues its call, never marks it launched, stays alive
    EXPECT_EQ(coll(f[1]), ncclSuccess);
    phase = 1;
    while (phase.load() != 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  EXPECT_EQ(coll(f[0]), ncclSuccess);
  while (phase.load() != 1) std::this_thread::yield();
  auto t0 = Clock::now();
  mk::rdvLaunched({rdvtest::work(f[0], 1, nullptr)}, true);
  EXPECT_GE(since(t0), 0.35);
  EXPECT_LT(since(t0), 3.0);
  EXPECT_EQ(f[0]->asyncResult.load(), ncclSuccess);
  f.abortAll();
  t0 = Clock::now();
  mk::rdvLaunched({rdvtest::work(f[0], 1, nullptr)}, true);
  EXPECT_LT(since(t0), 0.2);
  phase = 2;
  owner.join();
}

// One thread driving every rank (a group, or ranks issued one after another) never waits for
// its own launches, nor for a peer that has not issued its call.
TEST(CollRendezvous, LaunchedNeverWaitsForItselfOrForUnissuedCalls) {
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  FakeComms f(3, -1, 0xc00);
  auto t0 = Clock::now();
  for (int r = 0; r < 3; r++) {
    EXPECT_EQ(coll(f[r]), ncclSuccess);
    mk::rdvLaunched({rdvtest::work(f[r], 1, nullptr)}, true);
  }
  EXPECT_LT(since(t0), 1.0);
  // Rank 0 goes first into round 2; ranks 1 and 2 are owned by this thread and have not
  // issued it: nothing to wait for.
  EXPECT_EQ(coll(f[0]), ncclSuccess);
  t0 = Clock::now();
  mk::rdvLaunched({rdvtest::work(f[0], 1, nullptr)}, true);
  EXPECT_LT(since(t0), 0.2);
}

}  // namespace
