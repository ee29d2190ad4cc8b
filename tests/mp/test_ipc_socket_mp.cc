// Unix-domain fd passing between processes (transport/ipc_socket.h): a memfd and a pipe
// travel from a child to its parent, all-to-all among several processes, and a peer
// that dies or never shows up gives a bounded error.
#include <cstdint>
#include <gtest/gtest.h>

#include "common/memfd_util.h"

#include <chrono>
#include <csignal>
#include <cstring>
#include <string>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "common/test_util.h"
#include "transport/ipc_socket.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> names(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; i++) {
    char name[mk::kIpcNameLen];
    mk::ipcSocketName(name, i, mk::ipcSocketNonce());
    out.push_back(name);
  }
  return out;
}

using mktest::makeMemfd;
using mktest::readAll;

// Waits for every child; kills those still running at the deadline. Returns the number of
// children that did not exit with status 0.
int waitChildren(const std::vector<pid_t>& pids, int timeoutMs) {
  int bad = 0;
  auto deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
  for (pid_t pid : pids) {
    int status = 0;
    for (;;) {
      pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) break;
      if (Clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ADD_FAILURE() << "child " << pid << " did not finish in time";
        break;
      }
      usleep(2000);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) bad++;
  }
  return bad;
}

std::string msgContent(int from, int to, int k) {
  return "from " + std::to_string(from) + " to " + std::to_string(to) + " #" + std::to_string(k);
}

TEST(IpcSocketMp, ChildPassesMemfdAndPipeToParent) {
  int fds0 = mktest::countOpenFds();
  uint64_t hash = mk::ipcSocketNonce();
  std::vector<std::string> n = names(2);
  const std::string content(100000, 'q');  // larger than a page
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int rc = 0;
    mk::IpcSocket s;
    if (mk::ipcSocketInit(&s, n[1].c_str(), 1, hash, nullptr, 10000) != ncclSuccess) _exit(10);
    int mfd = makeMemfd(content);
    int pipefd[2];
    if (mfd < 0 || pipe(pipefd) != 0) _exit(11);
    int32_t kind = 1;
    if (mk::ipcSocketSend(&s, n[0].c_str(), 1, mfd, &kind, sizeof(kind)) != ncclSuccess) rc = 12;
    kind = 2;
    if (mk::ipcSocketSend(&s, n[0].c_str(), 2, pipefd[0], &kind, sizeof(kind)) != ncclSuccess)
      rc = 13;
    close(mfd);
    close(pipefd[0]);
    if (write(pipefd[1], "ping", 4) != 4) rc = 14;
    close(pipefd[1]);
    int32_t ack = 0;
    if (mk::ipcSocketRecv(&s, 0, 3, nullptr, &ack, sizeof(ack)) != ncclSuccess || ack != 42)
      rc = 15;
    mk::ipcSocketClose(&s);
    _exit(rc);
  }
  mk::IpcSocket s;
  ASSERT_EQ(mk::ipcSocketInit(&s, n[0].c_str(), 0, hash, nullptr, 10000), ncclSuccess);
  int32_t kind = 0;
  int mfd = -1, rfd = -1;
  EXPECT_EQ(mk::ipcSocketRecv(&s, 1, 1, &mfd, &kind, sizeof(kind)), ncclSuccess);
  EXPECT_EQ(kind, 1);
  ASSERT_GE(mfd, 0);
  EXPECT_EQ(readAll(mfd), content);
  EXPECT_EQ(mk::ipcSocketRecv(&s, 1, 2, &rfd, &kind, sizeof(kind)), ncclSuccess);
  EXPECT_EQ(kind, 2);
  ASSERT_GE(rfd, 0);
  char buf[8] = {};
  EXPECT_EQ(read(rfd, buf, 4), 4);
  EXPECT_STREQ(buf, "ping");
  close(mfd);
  close(rfd);
  int32_t ack = 42;
  EXPECT_EQ(mk::ipcSocketSend(&s, n[1].c_str(), 3, -1, &ack, sizeof(ack)), ncclSuccess);
  EXPECT_EQ(waitChildren({pid}, 30000), 0);
  mk::ipcSocketClose(&s);
  EXPECT_EQ(mktest::countOpenFds(), fds0);
}

// Every process sends kMsgs fds to every other before receiving any: more than a datagram
// queue holds, so this also checks that senders drain their own sockets while they wait.
TEST(IpcSocketMp, AllToAllAmongFourProcesses) {
  constexpr int kProcs = 4, kMsgs = 40;
  uint64_t hash = mk::ipcSocketNonce();
  std::vector<std::string> n = names(kProcs);
  std::vector<pid_t> pids;
  for (int me = 0; me < kProcs; me++) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid != 0) {
      pids.push_back(pid);
      continue;
    }
    int rc = 0;
    mk::IpcSocket s;
    if (mk::ipcSocketInit(&s, n[me].c_str(), me, hash, nullptr, 20000) != ncclSuccess) _exit(10);
    for (int k = 0; k < kMsgs && rc == 0; k++) {
      for (int to = 0; to < kProcs; to++) {
        if (to == me) continue;
        int fd = makeMemfd(msgContent(me, to, k));
        if (fd < 0 ||
            mk::ipcSocketSend(&s, n[to].c_str(), (uint32_t)k, fd, &k, sizeof(k)) != ncclSuccess)
          rc = 11;
        if (fd >= 0) close(fd);
      }
    }
    for (int from = 0; from < kProcs && rc == 0; from++) {
      if (from == me) continue;
      for (int k = kMsgs - 1; k >= 0; k--) {
        int got = -1, fd = -1;
        if (mk::ipcSocketRecv(&s, from, (uint32_t)k, &fd, &got, sizeof(got)) != ncclSuccess) {
          rc = 12;
          break;
        }
        if (got != k || fd < 0 || readAll(fd) != msgContent(from, me, k)) rc = 13;
        if (fd >= 0) close(fd);
      }
    }
    if (!s.pending.empty()) rc = 14;
    mk::ipcSocketClose(&s);
    _exit(rc);
  }
  EXPECT_EQ(waitChildren(pids, 60000), 0);
}

TEST(IpcSocketMp, PeerThatExitsGivesBoundedErrors) {
  int fds0 = mktest::countOpenFds();
  uint64_t hash = mk::ipcSocketNonce();
  std::vector<std::string> n = names(2);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    mk::IpcSocket s;
    if (mk::ipcSocketInit(&s, n[1].c_str(), 1, hash, nullptr, 1000) != ncclSuccess) _exit(10);
    mk::ipcSocketClose(&s);
    _exit(0);  // never sends
  }
  ASSERT_EQ(waitChildren({pid}, 30000), 0);
  mk::IpcSocket s;
  ASSERT_EQ(mk::ipcSocketInit(&s, n[0].c_str(), 0, hash, nullptr, 400), ncclSuccess);
  auto t0 = Clock::now();
  EXPECT_EQ(mk::ipcSocketRecv(&s, 1, 1, nullptr, nullptr, 0), ncclRemoteError);
  int fd = makeMemfd("lost");
  EXPECT_EQ(mk::ipcSocketSend(&s, n[1].c_str(), 1, fd, nullptr, 0), ncclRemoteError);
  close(fd);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  EXPECT_GE(ms, 700);
  EXPECT_LT(ms, 5000);
  mk::ipcSocketClose(&s);
  EXPECT_EQ(mktest::countOpenFds(), fds0);
}

}  // namespace
