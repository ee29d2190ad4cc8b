#include "transport/net_sockutil.h"

#include <atomic>
#include <cstdint>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <poll.h>
#include <unistd.h>

#include <cstring>

#include "base/checks.h"
#include "transport/net.h"

namespace mk {

ncclResult_t netTuneSocket(int fd) {
  int flags = fcntl(fd, F_GETFL);
  SYSCHECK(fcntl(fd, F_SETFL, flags | O_NONBLOCK), "fcntl(O_NONBLOCK)");
  int one = 1;
  SYSCHECK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)), "setsockopt(TCP_NODELAY)");
  SYSCHECK(setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)), "setsockopt(SO_KEEPALIVE)");
  // Keepalive probes (idle peer) and the unacknowledged-data timeout (busy peer) both
  // fire within about netTimeoutMs().
  int64_t ms = netTimeoutMs();
  int idle = (int)(ms / 3000) > 0 ? (int)(ms / 3000) : 1;
  int intvl = (int)(ms / 6000) > 0 ? (int)(ms / 6000) : 1;
  int cnt = 3;
  unsigned int user = (unsigned int)ms;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof(user));
  return ncclSuccess;
}

static constexpr int kPollSliceMs = 50;

NetIo netSendAll(int fd, const void* buf, size_t len, const std::atomic<bool>* stop, int* err) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n, len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      *err = errno;
      return (errno == EPIPE || errno == ECONNRESET) ? NetIo::kClosed : NetIo::kError;
    }
    for (;;) {
      if (stop && stop->load(std::memory_order_relaxed)) return NetIo::kAborted;
      struct pollfd pfd = {fd, POLLOUT | POLLRDHUP, 0};
      int r = poll(&pfd, 1, kPollSliceMs);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        *err = errno;
        return NetIo::kError;
      }
      if (r == 0) continue;
      // The receiver never writes on a data socket, so a hang-up or readable EOF
      // means it is gone, even while our send buffer still has room.
      if (pfd.revents & (POLLRDHUP | POLLHUP)) {
        *err = ECONNRESET;
        return NetIo::kClosed;
      }
      if (pfd.revents & POLLERR) {
        int e = 0;
        socklen_t l = sizeof(e);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l);
        *err = e ? e : EIO;
        return NetIo::kError;
      }
      break;
    }
  }
  return NetIo::kOk;
}

NetIo netRecvAll(int fd, void* buf, size_t len, const std::atomic<bool>* stop, int* err) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = recv(fd, p, len, 0);
    if (n > 0) {
      p += n, len -= (size_t)n;
      continue;
    }
    if (n == 0) {
      *err = 0;
      return NetIo::kClosed;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      *err = errno;
      return errno == ECONNRESET ? NetIo::kClosed : NetIo::kError;
    }
    for (;;) {
      if (stop && stop->load(std::memory_order_relaxed)) return NetIo::kAborted;
      struct pollfd pfd = {fd, POLLIN, 0};
      int r = poll(&pfd, 1, kPollSliceMs);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        *err = errno;
        return NetIo::kError;
      }
      if (r > 0) break;
    }
  }
  return NetIo::kOk;
}

}  // namespace mk
