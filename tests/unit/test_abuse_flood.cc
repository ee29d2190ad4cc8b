// The bootstrap root under a connection flood (no secret needed): thousands of silent
// connections, connections that stall inside a hello, and a stream of garbage senders. Real
// ranks must still complete the rendezvous within a couple of seconds of the flood's own pace.
// Loopback only; the flood's size follows RLIMIT_NOFILE (the soft limit is raised to the hard
// one; each flood connection costs two fds here, the client's and the root's).
#include <cstdint>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_impl.h"
#include "bootstrap/proto.h"
#include "bootstrap/root.h"
#include "bootstrap/unique_id.h"
#include "common/test_util.h"

using namespace mk;
using mktest::ScopedEnv;

namespace {

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int raiseFdLimit() {
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  getrlimit(RLIMIT_NOFILE, &rl);
  return rl.rlim_cur > 1000000 ? 1000000 : (int)rl.rlim_cur;
}

// A non-blocking connect; the kernel finishes the handshake (or retries a dropped SYN) alone.
int startConnect(const SocketAddress& to) {
  int fd = socket(to.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, &to.sa, socketAddressLen(&to)) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends what fits now; a flood client never waits.
void sendSome(int fd, const void* p, size_t n) {
  pollfd w{fd, POLLOUT, 0};
  if (poll(&w, 1, 20) == 1 && (w.revents & POLLOUT)) (void)!send(fd, p, n, MSG_NOSIGNAL);
}

struct RankRun {
  double seconds = 0;
  int ok = 0;
};

// n ranks in threads: init, allgather, check, close.
RankRun runRanks(const ncclUniqueId& id, int n) {
  RankRun out;
  std::atomic<int> ok{0};
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> t;
  for (int r = 0; r < n; r++)
    t.emplace_back([&, r] {
      Bootstrap* b = nullptr;
      if (bootstrapInit(&id, 1, r, n, nullptr, &b) != ncclSuccess) return;
      std::vector<int> v(n, -1);
      v[r] = 1000 + r;
      bool good = bootstrapAllGather(b, v.data(), sizeof(int)) == ncclSuccess;
      for (int i = 0; i < n && good; i++) good = v[i] == 1000 + i;
      if (bootstrapClose(b) == ncclSuccess && good) ok++;
    });
  for (auto& x : t) x.join();
  out.seconds = secondsSince(t0);
  out.ok = ok.load();
  return out;
}

// Garbage senders: open, send random bytes (some start like a real hello and stall), keep a
// bounded number open, repeat until stopped.
struct GarbageFlood {
  std::atomic<bool> stop{false};
  std::atomic<long> sent{0};
  std::thread th;
  void start(const SocketAddress& to, uint64_t seed, int maxOpen) {
    th = std::thread([this, to, seed, maxOpen] {
      std::mt19937_64 rng(seed);
      std::deque<int> open;
      std::vector<uint8_t> junk(256);
      while (!stop.load()) {
        int fd = startConnect(to);
        if (fd >= 0) {
          size_t n = 1 + rng() % junk.size();
          for (auto& x : junk) x = (uint8_t)rng();
          if (rng() % 4 == 0) {  // a real-looking prefix (magic, version), then nothing
            uint32_t magic = kBootstrapIdMagic;
            uint16_t version = kBootstrapProtocolVersion;
            memcpy(junk.data(), &magic, 4);
            memcpy(junk.data() + 4, &version, 2);
            n = 6;
          }
          sendSome(fd, junk.data(), n);
          open.push_back(fd);
          sent++;
        }
        while ((int)open.size() > maxOpen || (fd < 0 && !open.empty())) {
          close(open.front());
          open.pop_front();
        }
      }
      for (int fd : open) close(fd);
    });
  }
  void finish() {
    stop = true;
    if (th.joinable()) th.join();
  }
};

}  // namespace

TEST(AbuseFlood, RealRanksGetThroughThousandsOfSilentAndGarbageConnections) {
  // Bounded: the old root needed (flood / 256) x 5 s; it fails here at the rank timeout.
  ScopedEnv t("MKERNEL_BOOTSTRAP_TIMEOUT_S", "15");
  const int nofile = raiseFdLimit();
  const int nRanks = 4;
  const int kGarbageOpen = 128;
  // Client fd + root fd per silent connection, plus the garbage flood, ranks and slack.
  // Twice the root's pending table where fds allow (it holds min(4096, RLIMIT_NOFILE / 4)), so
  // that the root has to evict.
  const int nSilent = std::min(8192, (nofile - 4 * kGarbageOpen - 512) / 2);
  ASSERT_GE(nSilent, 256) << "RLIMIT_NOFILE " << nofile << " is too small for a flood test";
  printf("[flood] RLIMIT_NOFILE %d: %d silent connections, garbage flood of <= %d open\n", nofile,
         nSilent, kGarbageOpen);

  // Without a flood.
  ncclUniqueId id;
  ASSERT_EQ(bootstrapGetUniqueId(&id), ncclSuccess);
  RankRun base = runRanks(id, nRanks);
  ASSERT_EQ(base.ok, nRanks);
  ASSERT_EQ(bootstrapRootsWait(5000), 0);

  // With one: silent connections first (a third stall after a valid-looking prefix), then a
  // stream of garbage senders that runs while the ranks arrive.
  ASSERT_EQ(bootstrapGetUniqueId(&id), ncclSuccess);
  BootstrapId d;
  ASSERT_EQ(bootstrapIdDecode(&id, &d), ncclSuccess);
  auto f0 = std::chrono::steady_clock::now();
  std::vector<int> silent;
  const uint32_t magic = kBootstrapIdMagic;
  for (int i = 0; i < nSilent; i++) {
    int fd = startConnect(d.root);
    if (fd < 0) continue;
    if (i % 3 == 0) sendSome(fd, &magic, sizeof(magic));
    silent.push_back(fd);
  }
  double floodSeconds = secondsSince(f0);
  GarbageFlood garbage;
  garbage.start(d.root, mktest::testSeed(), kGarbageOpen);
  RankRun hit = runRanks(id, nRanks);
  garbage.finish();
  printf(
      "[flood] %zu silent connections opened in %.3f s; %ld garbage connections during the "
      "rendezvous\n",
      silent.size(), floodSeconds, garbage.sent.load());
  printf("[flood] rendezvous of %d ranks: %.3f s without the flood, %.3f s with it\n", nRanks,
         base.seconds, hit.seconds);
  EXPECT_GT(silent.size(), (size_t)nSilent * 9 / 10);
  EXPECT_EQ(hit.ok, nRanks);
  EXPECT_LT(hit.seconds, 3.0 + floodSeconds);
  for (int fd : silent) close(fd);
  EXPECT_EQ(bootstrapRootsWait(5000), 0);
}

// The same against a rank's own listener (its port is not secret either): new peer connections
// made after the flood started (the barrier's second round connects to rank - 2) get through.
TEST(AbuseFlood, RankListenerFloodDoesNotStallPeers) {
  ScopedEnv t("MKERNEL_BOOTSTRAP_TIMEOUT_S", "15");
  const int nofile = raiseFdLimit();
  const int n = 3;
  const int nSilent = std::min(2048, (nofile - 512) / 2);
  ncclUniqueId id;
  ASSERT_EQ(bootstrapGetUniqueId(&id), ncclSuccess);
  std::vector<Bootstrap*> bs(n, nullptr);
  std::vector<std::thread> th;
  for (int r = 0; r < n; r++)
    th.emplace_back(
        [&, r] { EXPECT_EQ(bootstrapInit(&id, 1, r, n, nullptr, &bs[r]), ncclSuccess); });
  for (auto& x : th) x.join();
  th.clear();
  ASSERT_TRUE(bs[0] && bs[1] && bs[2]);
  std::vector<int> silent;
  for (int i = 0; i < nSilent; i++) {
    int fd = startConnect(bs[1]->listen.addr);
    if (fd >= 0) silent.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let them reach the listener
  auto t0 = std::chrono::steady_clock::now();
  std::atomic<int> ok{0};
  for (int r = 0; r < n; r++)
    th.emplace_back([&, r] { ok += bootstrapBarrier(bs[r]) == ncclSuccess; });
  for (auto& x : th) x.join();
  double s = secondsSince(t0);
  printf("[flood] barrier of %d ranks with %zu silent connections on rank 1's listener: %.3f s\n",
         n, silent.size(), s);
  EXPECT_EQ(ok.load(), n);
  EXPECT_LT(s, 3.0);
  for (int fd : silent) close(fd);
  for (auto* b : bs) EXPECT_EQ(bootstrapClose(b), ncclSuccess);
}
