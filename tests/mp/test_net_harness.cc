// Multi-process harness for the net and proxy tests: the gtest process forks n ranks and
// serves as their out-of-band hub (all-to-all, barrier) over socketpairs, standing in for
// the bootstrap. A rank that dies makes pending hub operations fail instead of hang.
#include "mp/test_net_harness.inl"

#include <cstdint>
#include <functional>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace mknet {
namespace {

struct HubReq {
  uint32_t op;  // 1 alltoall, 2 barrier
  uint32_t nranks;
  uint64_t bytes;
};

bool writeAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t r = write(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r, n -= (size_t)r;
  }
  return true;
}
bool readAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r, n -= (size_t)r;
  }
  return true;
}

}  // namespace

ncclResult_t hubAllToAll(const Ctx& ctx, const void* send, void* recv, size_t bytes) {
  HubReq q = {1, (uint32_t)ctx.nranks, bytes};
  if (!writeAll(ctx.hubFd, &q, sizeof(q)) || !writeAll(ctx.hubFd, send, bytes * ctx.nranks))
    return ncclRemoteError;
  uint32_t status = 1;
  if (!readAll(ctx.hubFd, &status, sizeof(status)) || status != 0) return ncclRemoteError;
  return readAll(ctx.hubFd, recv, bytes * ctx.nranks) ? ncclSuccess : ncclRemoteError;
}

ncclResult_t hubBarrier(const Ctx& ctx) {
  HubReq q = {2, (uint32_t)ctx.nranks, 0};
  if (!writeAll(ctx.hubFd, &q, sizeof(q))) return ncclRemoteError;
  uint32_t status = 1;
  return readAll(ctx.hubFd, &status, sizeof(status)) && status == 0 ? ncclSuccess : ncclRemoteError;
}

std::vector<int> runRanks(int nranks, const std::function<int(const Ctx&)>& body, int timeoutSec) {
  std::vector<int> fds(nranks, -1);
  std::vector<pid_t> pids(nranks, -1);
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < nranks; r++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) abort();
    pid_t pid = fork();
    if (pid == 0) {
      for (int k = 0; k < r; k++) close(fds[k]);
      close(sv[0]);
      Ctx ctx{r, nranks, sv[1]};
      int rc = body(ctx);
      if (::testing::Test::HasFailure() && rc == 0) rc = 1;
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    close(sv[1]);
    fds[r] = sv[0];
    pids[r] = pid;
  }
  std::vector<int> codes(nranks, -1);
  std::vector<bool> alive(nranks, true), pending(nranks, false);
  std::vector<HubReq> reqs(nranks);
  std::vector<std::vector<char>> payload(nranks);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSec);
  int running = nranks;
  while (running > 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "ranks still running after " << timeoutSec << " s: killing them";
      for (int r = 0; r < nranks; r++)
        if (codes[r] == -1) kill(pids[r], SIGKILL);
    }
    for (int r = 0; r < nranks; r++) {
      if (codes[r] != -1) continue;
      int st;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        running--;
      }
    }
    std::vector<pollfd> pfds;
    for (int r = 0; r < nranks; r++)
      if (alive[r] && !pending[r]) pfds.push_back({fds[r], POLLIN, 0});
    poll(pfds.data(), pfds.size(), 20);
    for (auto& p : pfds) {
      if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      int r = 0;
      while (fds[r] != p.fd) r++;
      HubReq q;
      if (!readAll(fds[r], &q, sizeof(q))) {
        alive[r] = false;
        continue;
      }
      payload[r].resize(q.op == 1 ? q.bytes * nranks : 0);
      if (!payload[r].empty() && !readAll(fds[r], payload[r].data(), payload[r].size())) {
        alive[r] = false;
        continue;
      }
      reqs[r] = q;
      pending[r] = true;
    }
    // Complete a round once every live rank asked; a dead rank fails the round.
    bool any = false, all = true, dead = false;
    for (int r = 0; r < nranks; r++) {
      any |= pending[r];
      if (alive[r])
        all &= pending[r];
      else
        dead = true;
    }
    if (!any || !all) continue;
    for (int r = 0; r < nranks; r++) {
      if (!pending[r]) continue;
      pending[r] = false;
      uint32_t status = dead ? 1 : 0;
      writeAll(fds[r], &status, sizeof(status));
      if (dead || reqs[r].op != 1) continue;
      std::vector<char> out(reqs[r].bytes * nranks);
      for (int p = 0; p < nranks; p++)
        memcpy(&out[p * reqs[r].bytes], &payload[p][r * reqs[r].bytes], reqs[r].bytes);
      writeAll(fds[r], out.data(), out.size());
    }
  }
  for (int fd : fds) close(fd);
  return codes;
}

}  // namespace mknet
