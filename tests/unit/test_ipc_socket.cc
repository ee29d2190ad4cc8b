// Unix-domain fd passing (transport/ipc_socket.h) inside one process: content of a passed
// memfd, tag matching, bounded timeouts, abort, dropped foreign messages, no fd leaks.
#include <cstdint>
#include <vector>
#include <gtest/gtest.h>

#include "common/memfd_util.h"

#include <atomic>
#include <chrono>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <fcntl.h>
#include <string>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>

#include "base/debug.h"
#include "common/test_util.h"
#include "transport/ipc_socket.h"

namespace {

using Clock = std::chrono::steady_clock;

int64_t msSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

std::string freshName(int rank) {
  char name[mk::kIpcNameLen];
  mk::ipcSocketName(name, rank, mk::ipcSocketNonce());
  return name;
}

using mktest::makeMemfd;
using mktest::readAll;

struct Pair {
  uint64_t hash = mk::ipcSocketNonce();
  mk::IpcSocket a, b;
  std::string nameA = freshName(0), nameB = freshName(1);
  ncclResult_t init(int64_t timeoutMs, const uint32_t* abortA = nullptr,
                    const uint32_t* abortB = nullptr) {
    ncclResult_t r = mk::ipcSocketInit(&a, nameA.c_str(), 0, hash, abortA, timeoutMs);
    if (r != ncclSuccess) return r;
    return mk::ipcSocketInit(&b, nameB.c_str(), 1, hash, abortB, timeoutMs);
  }
  ~Pair() {
    mk::ipcSocketClose(&a);
    mk::ipcSocketClose(&b);
  }
};

TEST(IpcSocket, NameIsUniqueAndFits) {
  char n1[mk::kIpcNameLen], n2[mk::kIpcNameLen];
  mk::ipcSocketName(n1, 1 << 30, mk::ipcSocketNonce());
  mk::ipcSocketName(n2, 1 << 30, mk::ipcSocketNonce());
  EXPECT_LT(strlen(n1), mk::kIpcNameLen - 1);
  EXPECT_STRNE(n1, n2);
  EXPECT_EQ(strncmp(n1, "mkernel-1073741824-", 19), 0) << n1;
}

TEST(IpcSocket, PassesMemfdWithContent) {
  int fds0 = mktest::countOpenFds();
  {
    Pair p;
    ASSERT_EQ(p.init(5000), ncclSuccess);
    const std::string content =
        "peer memory travels as a file descriptor " + std::to_string(getpid());
    int fd = makeMemfd(content);
    ASSERT_GE(fd, 0);
    uint64_t payload = 0x1234567890abcdefull;
    ASSERT_EQ(mk::ipcSocketSend(&p.a, p.nameB.c_str(), 7, fd, &payload, sizeof(payload)),
              ncclSuccess);
    close(fd);  // the message holds its own reference
    uint64_t got = 0;
    int rfd = -1;
    ASSERT_EQ(mk::ipcSocketRecv(&p.b, 0, 7, &rfd, &got, sizeof(got)), ncclSuccess);
    EXPECT_EQ(got, payload);
    ASSERT_GE(rfd, 0);
    EXPECT_EQ(readAll(rfd), content);
    EXPECT_TRUE(fcntl(rfd, F_GETFD) & FD_CLOEXEC);
    close(rfd);
    // A message without an fd: *fd comes back -1.
    ASSERT_EQ(mk::ipcSocketSend(&p.b, p.nameA.c_str(), 8, -1, nullptr, 0), ncclSuccess);
    int none = 123;
    ASSERT_EQ(mk::ipcSocketRecv(&p.a, 1, 8, &none, nullptr, 0), ncclSuccess);
    EXPECT_EQ(none, -1);
  }
  EXPECT_EQ(mktest::countOpenFds(), fds0);
}

TEST(IpcSocket, MatchesRankAndTagOutOfOrder) {
  int fds0 = mktest::countOpenFds();
  {
    Pair p;
    ASSERT_EQ(p.init(5000), ncclSuccess);
    for (uint32_t tag = 1; tag <= 5; tag++) {
      int fd = makeMemfd("tag " + std::to_string(tag));
      ASSERT_GE(fd, 0);
      ASSERT_EQ(mk::ipcSocketSend(&p.a, p.nameB.c_str(), tag, fd, &tag, sizeof(tag)), ncclSuccess);
      close(fd);
    }
    for (uint32_t tag = 5; tag >= 1; tag--) {
      uint32_t got = 0;
      int rfd = -1;
      ASSERT_EQ(mk::ipcSocketRecv(&p.b, 0, tag, &rfd, &got, sizeof(got)), ncclSuccess);
      EXPECT_EQ(got, tag);
      EXPECT_EQ(readAll(rfd), "tag " + std::to_string(tag));
      close(rfd);
    }
    // Pending messages with fds are closed with the socket.
    int fd = makeMemfd("never received");
    ASSERT_EQ(mk::ipcSocketSend(&p.a, p.nameB.c_str(), 99, fd, nullptr, 0), ncclSuccess);
    close(fd);
  }
  EXPECT_EQ(mktest::countOpenFds(), fds0);
}

TEST(IpcSocket, RecvTimesOutWhenPeerNeverSends) {
  Pair p;
  ASSERT_EQ(p.init(300), ncclSuccess);
  auto t0 = Clock::now();
  int fd = -1;
  EXPECT_EQ(mk::ipcSocketRecv(&p.b, 0, 1, &fd, nullptr, 0), ncclRemoteError);
  int64_t ms = msSince(t0);
  EXPECT_GE(ms, 250);
  EXPECT_LT(ms, 3000);
  EXPECT_EQ(fd, -1);
}

TEST(IpcSocket, SendTimesOutWhenPeerNeverBinds) {
  int fds0 = mktest::countOpenFds();
  {
    Pair p;
    ASSERT_EQ(p.init(300), ncclSuccess);
    std::string nobody = freshName(9);
    int fd = makeMemfd("x");
    auto t0 = Clock::now();
    EXPECT_EQ(mk::ipcSocketSend(&p.a, nobody.c_str(), 1, fd, nullptr, 0), ncclRemoteError);
    int64_t ms = msSince(t0);
    EXPECT_GE(ms, 250);
    EXPECT_LT(ms, 3000);
    close(fd);
  }
  EXPECT_EQ(mktest::countOpenFds(), fds0);
}

TEST(IpcSocket, AbortStopsRecvAndSend) {
  uint32_t abortFlag = 0;
  Pair p;
  ASSERT_EQ(p.init(60000, &abortFlag, &abortFlag), ncclSuccess);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    __atomic_store_n(&abortFlag, 1u, __ATOMIC_RELEASE);
  });
  auto t0 = Clock::now();
  EXPECT_EQ(mk::ipcSocketRecv(&p.b, 0, 1, nullptr, nullptr, 0), ncclInternalError);
  EXPECT_LT(msSince(t0), 5000);
  t.join();
  // Already aborted: a send to a name nobody bound returns at once.
  std::string nobody = freshName(9);
  t0 = Clock::now();
  EXPECT_EQ(mk::ipcSocketSend(&p.a, nobody.c_str(), 1, -1, nullptr, 0), ncclInternalError);
  EXPECT_LT(msSince(t0), 1000);
}

TEST(IpcSocket, DropsMessagesOfAnotherComm) {
  int fds0 = mktest::countOpenFds();
  {
    Pair p;
    ASSERT_EQ(p.init(300), ncclSuccess);
    mk::IpcSocket other;
    std::string otherName = freshName(0);
    ASSERT_EQ(mk::ipcSocketInit(&other, otherName.c_str(), 0, p.hash + 1, nullptr, 300),
              ncclSuccess);
    int fd = makeMemfd("foreign");
    ASSERT_EQ(mk::ipcSocketSend(&other, p.nameB.c_str(), 1, fd, nullptr, 0), ncclSuccess);
    close(fd);
    int rfd = -1;
    EXPECT_EQ(mk::ipcSocketRecv(&p.b, 0, 1, &rfd, nullptr, 0), ncclRemoteError);
    EXPECT_EQ(rfd, -1);
    mk::ipcSocketClose(&other);
  }
  EXPECT_EQ(mktest::countOpenFds(), fds0);
}

// Abstract socket names are public (/proc/net/unix lists them) and anyone in the network
// namespace may send to them: the comm hash in each message is the only proof that the sender
// belongs to the comm, so the name must not reveal it. A forger who reads the name and tries
// every 64-bit field of it as the hash, spoofing rank 0, must not get its descriptor taken for
// rank 0's.
TEST(IpcSocket, ForgerWhoOnlyKnowsTheNameIsDropped) {
  int fds0 = mktest::countOpenFds();
  {
    Pair p;
    ASSERT_EQ(p.init(2000), ncclSuccess);
    const std::string& pub = p.nameB;  // what the forger sees
    std::vector<uint64_t> guesses;
    for (size_t i = 0; i < pub.size();) {
      size_t j = i;
      while (j < pub.size() && isxdigit((unsigned char)pub[j])) j++;
      if (j - i == 16) guesses.push_back(strtoull(pub.substr(i, 16).c_str(), nullptr, 16));
      i = j > i ? j : i + 1;
    }
    ASSERT_FALSE(guesses.empty());
    for (uint64_t g : guesses) {
      mk::IpcSocket forger;
      std::string fname = freshName(0);
      ASSERT_EQ(mk::ipcSocketInit(&forger, fname.c_str(), /*spoofed rank*/ 0, g, nullptr, 300),
                ncclSuccess);
      int fd = makeMemfd("forged");
      EXPECT_EQ(mk::ipcSocketSend(&forger, pub.c_str(), 7, fd, nullptr, 0), ncclSuccess);
      close(fd);
      mk::ipcSocketClose(&forger);
    }
    const std::string genuine = "genuine " + std::to_string(mk::ipcSocketNonce());
    int fd = makeMemfd(genuine);
    ASSERT_EQ(mk::ipcSocketSend(&p.a, pub.c_str(), 7, fd, nullptr, 0), ncclSuccess);
    close(fd);
    int rfd = -1;
    ASSERT_EQ(mk::ipcSocketRecv(&p.b, 0, 7, &rfd, nullptr, 0), ncclSuccess);
    ASSERT_GE(rfd, 0);
    EXPECT_EQ(readAll(rfd), genuine) << "a forged descriptor was taken for rank 0's";
    close(rfd);
  }
  EXPECT_EQ(mktest::countOpenFds(), fds0);
}

// Anyone in the network namespace can send to an abstract name, so dropped datagrams are
// attacker-controlled: each one must not cost a log line (the log would be the flood's target).
TEST(IpcSocket, FloodOfForeignDatagramsLogsRarely) {
  char path[] = "/tmp/mk_ipc_flood_XXXXXX";
  int lfd = mkstemp(path);
  ASSERT_GE(lfd, 0);
  close(lfd);
  const int kForged = 2000;
  // Earlier tests' drops may have used this second of the rate limit: start a fresh one so
  // that the flood's first drop is printed.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  {
    mktest::ScopedEnv level("NCCL_DEBUG", "WARN");
    mktest::ScopedEnv file("NCCL_DEBUG_FILE", path);
    mk::logReset();
    Pair p;
    ASSERT_EQ(p.init(1500), ncclSuccess);
    std::thread rx([&] {  // drains (and drops) while waiting for a message that never comes
      EXPECT_EQ(mk::ipcSocketRecv(&p.b, 0, 99, nullptr, nullptr, 0), ncclRemoteError);
    });
    mk::IpcSocket forger;
    std::string fname = freshName(0);
    ASSERT_EQ(
        mk::ipcSocketInit(&forger, fname.c_str(), 0, p.hash ^ mk::ipcSocketNonce(), nullptr, 1000),
        ncclSuccess);
    int sent = 0;
    for (int i = 0; i < kForged; i++)
      sent += mk::ipcSocketSend(&forger, p.nameB.c_str(), 99, -1, &i, sizeof(i)) == ncclSuccess;
    mk::ipcSocketClose(&forger);
    rx.join();
    EXPECT_EQ(sent, kForged);
  }
  mk::logReset();
  std::ifstream in(path);
  std::string line;
  int printed = 0;
  while (std::getline(in, line)) printed += line.find("dropped a message") != std::string::npos;
  unlink(path);
  EXPECT_GE(printed, 1) << "the drops were not reported at all";
  EXPECT_LE(printed, 4) << "one log line per forged datagram";
}

TEST(IpcSocket, BadArgumentsAndSizeMismatch) {
  Pair p;
  ASSERT_EQ(p.init(300), ncclSuccess);
  std::vector<char> big(mk::kIpcMaxPayload + 1);
  EXPECT_EQ(mk::ipcSocketSend(&p.a, p.nameB.c_str(), 1, -1, big.data(), big.size()),
            ncclInvalidArgument);
  EXPECT_EQ(mk::ipcSocketSend(&p.a, "", 1, -1, nullptr, 0), ncclInvalidArgument);
  std::string longName(mk::kIpcNameLen + 5, 'x');
  mk::IpcSocket s;
  EXPECT_EQ(mk::ipcSocketInit(&s, longName.c_str(), 0, 1, nullptr, 100), ncclInvalidArgument);
  // The same name twice: the second bind fails.
  EXPECT_EQ(mk::ipcSocketInit(&s, p.nameA.c_str(), 0, p.hash, nullptr, 100), ncclSystemError);
  EXPECT_EQ(s.fd, -1);
  // Payload size mismatch is an error, and any passed fd is closed.
  int fds0 = mktest::countOpenFds();
  uint64_t v = 1;
  int fd = makeMemfd("x");
  ASSERT_EQ(mk::ipcSocketSend(&p.a, p.nameB.c_str(), 3, fd, &v, sizeof(v)), ncclSuccess);
  close(fd);
  uint32_t small = 0;
  int rfd = -1;
  EXPECT_EQ(mk::ipcSocketRecv(&p.b, 0, 3, &rfd, &small, sizeof(small)), ncclInternalError);
  EXPECT_EQ(rfd, -1);
  EXPECT_EQ(mktest::countOpenFds(), fds0);
  // Operations on a closed socket.
  mk::IpcSocket closed;
  EXPECT_EQ(mk::ipcSocketSend(&closed, p.nameB.c_str(), 1, -1, nullptr, 0), ncclInvalidArgument);
  EXPECT_EQ(mk::ipcSocketRecv(&closed, 0, 1, nullptr, nullptr, 0), ncclInvalidArgument);
  EXPECT_EQ(mk::ipcSocketClose(&closed), ncclSuccess);
}

// Both sides send far more than a datagram queue holds (net.unix.max_dgram_qlen is often
// 10) before receiving anything: the send loop must drain its own socket to make progress.
TEST(IpcSocket, SendBeforeRecvDoesNotDeadlock) {
  int fds0 = mktest::countOpenFds();
  {
    Pair p;
    ASSERT_EQ(p.init(20000), ncclSuccess);
    constexpr int kMsgs = 200;
    auto side = [](mk::IpcSocket* me, const std::string& peer, int peerRank,
                   std::atomic<int>* errors) {
      for (int i = 0; i < kMsgs; i++) {
        int fd = makeMemfd("m" + std::to_string(i));
        if (mk::ipcSocketSend(me, peer.c_str(), (uint32_t)i, fd, &i, sizeof(i)) != ncclSuccess)
          (*errors)++;
        close(fd);
      }
      for (int i = kMsgs - 1; i >= 0; i--) {
        int got = -1, rfd = -1;
        if (mk::ipcSocketRecv(me, peerRank, (uint32_t)i, &rfd, &got, sizeof(got)) != ncclSuccess ||
            got != i || readAll(rfd) != "m" + std::to_string(i))
          (*errors)++;
        if (rfd >= 0) close(rfd);
      }
    };
    std::atomic<int> errors{0};
    auto t0 = Clock::now();
    std::thread ta(side, &p.a, p.nameB, 1, &errors);
    std::thread tb(side, &p.b, p.nameA, 0, &errors);
    ta.join();
    tb.join();
    EXPECT_EQ(errors.load(), 0);
    EXPECT_LT(msSince(t0), 15000);
  }
  EXPECT_EQ(mktest::countOpenFds(), fds0);
}

}  // namespace
