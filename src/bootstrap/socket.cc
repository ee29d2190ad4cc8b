#include "bootstrap/socket.h"

#include <cstdint>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/checks.h"
#include "base/debug.h"
#include "base/param.h"

namespace mk {

// ---------------------------------------------------------------------------------------------
// Addresses
// ---------------------------------------------------------------------------------------------

ncclResult_t socketAddressFromString(const char* str, SocketAddress* out) {
  MK_ARGCHECK(str != nullptr && out != nullptr, "socketAddressFromString: null argument");
  std::string s(str);
  std::string host, port;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    MK_ARGCHECK(close != std::string::npos, "Invalid address '%s': missing ']'", str);
    host = s.substr(1, close - 1);
    MK_ARGCHECK(close + 1 < s.size() && s[close + 1] == ':',
                "Invalid address '%s': expected [ipv6]:port", str);
    port = s.substr(close + 2);
  } else {
    size_t colon = s.rfind(':');
    MK_ARGCHECK(colon != std::string::npos,
                "Invalid address '%s': expected <ipv4>:<port>, [<ipv6>]:<port> or "
                "<hostname>:<port>",
                str);
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    MK_ARGCHECK(host.find(':') == std::string::npos,
                "Invalid address '%s': IPv6 addresses must be written [addr]:port", str);
  }
  MK_ARGCHECK(!host.empty(), "Invalid address '%s': empty host", str);
  char* end = nullptr;
  errno = 0;
  long p = port.empty() ? -1 : strtol(port.c_str(), &end, 10);
  MK_ARGCHECK(!port.empty() && errno == 0 && *end == '\0' && p >= 0 && p <= 65535,
              "Invalid address '%s': bad port '%s'", str, port.c_str());

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    MK_WARN("Invalid address '%s': cannot resolve '%s': %s", str, host.c_str(), gai_strerror(rc));
    return ncclInvalidArgument;
  }
  // The first result is what the resolver prefers (RFC 6724 ordering).
  memset(out, 0, sizeof(*out));
  bool ok = false;
  for (addrinfo* ai = res; ai != nullptr && !ok; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET || ai->ai_family == AF_INET6) {
      memcpy(out, ai->ai_addr, ai->ai_addrlen);
      ok = true;
    }
  }
  freeaddrinfo(res);
  MK_ARGCHECK(ok, "Invalid address '%s': no IPv4/IPv6 address", str);
  socketAddressSetPort(out, (int)p);
  return ncclSuccess;
}

socklen_t socketAddressLen(const SocketAddress* addr) {
  return addr->sa.sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

int socketAddressPort(const SocketAddress* addr) {
  if (addr->sa.sa_family == AF_INET) return ntohs(addr->sin.sin_port);
  if (addr->sa.sa_family == AF_INET6) return ntohs(addr->sin6.sin6_port);
  return -1;
}

void socketAddressSetPort(SocketAddress* addr, int port) {
  if (addr->sa.sa_family == AF_INET) addr->sin.sin_port = htons((uint16_t)port);
  if (addr->sa.sa_family == AF_INET6) addr->sin6.sin6_port = htons((uint16_t)port);
}

const char* socketAddressToString(const SocketAddress* addr, char* buf, size_t len) {
  if (len == 0) return buf;
  char host[NI_MAXHOST];
  int fam = addr->sa.sa_family;
  if ((fam != AF_INET && fam != AF_INET6) ||
      getnameinfo(&addr->sa, socketAddressLen(addr), host, sizeof(host), nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    snprintf(buf, len, "<invalid address, family %d>", fam);
    return buf;
  }
  if (fam == AF_INET6)
    snprintf(buf, len, "[%s]:%d", host, socketAddressPort(addr));
  else
    snprintf(buf, len, "%s:%d", host, socketAddressPort(addr));
  return buf;
}

bool socketAddressEqual(const SocketAddress* a, const SocketAddress* b) {
  if (a->sa.sa_family != b->sa.sa_family) return false;
  if (a->sa.sa_family == AF_INET)
    return a->sin.sin_port == b->sin.sin_port && a->sin.sin_addr.s_addr == b->sin.sin_addr.s_addr;
  if (a->sa.sa_family == AF_INET6)
    return a->sin6.sin6_port == b->sin6.sin6_port &&
           memcmp(&a->sin6.sin6_addr, &b->sin6.sin6_addr, sizeof(in6_addr)) == 0 &&
           a->sin6.sin6_scope_id == b->sin6.sin6_scope_id;
  return false;
}

// Wire layout: [0] 4 or 6, [1] 0, [2..3] port (big endian), [4..7] IPv6 scope id (little
// endian), [8..23] the address (IPv4 in the first 4 bytes).
void socketAddressToWire(const SocketAddress* addr, SocketWireAddress* out) {
  memset(out, 0, sizeof(*out));
  uint8_t* b = out->bytes;
  int port = socketAddressPort(addr);
  b[2] = (uint8_t)(port >> 8);
  b[3] = (uint8_t)port;
  if (addr->sa.sa_family == AF_INET) {
    b[0] = 4;
    memcpy(b + 8, &addr->sin.sin_addr, 4);
  } else if (addr->sa.sa_family == AF_INET6) {
    b[0] = 6;
    uint32_t scope = addr->sin6.sin6_scope_id;
    for (int i = 0; i < 4; i++) b[4 + i] = (uint8_t)(scope >> (8 * i));
    memcpy(b + 8, &addr->sin6.sin6_addr, 16);
  }
}

ncclResult_t socketAddressFromWire(const SocketWireAddress* in, SocketAddress* out) {
  const uint8_t* b = in->bytes;
  memset(out, 0, sizeof(*out));
  int port = (b[2] << 8) | b[3];
  if (b[0] == 4 && b[1] == 0) {
    out->sin.sin_family = AF_INET;
    memcpy(&out->sin.sin_addr, b + 8, 4);
  } else if (b[0] == 6 && b[1] == 0) {
    out->sin6.sin6_family = AF_INET6;
    uint32_t scope = 0;
    for (int i = 0; i < 4; i++) scope |= (uint32_t)b[4 + i] << (8 * i);
    out->sin6.sin6_scope_id = scope;
    memcpy(&out->sin6.sin6_addr, b + 8, 16);
  } else {
    // Quiet: the bytes may be garbage from the network; callers report in context.
    MK_INFO(kNet | kBootstrap, "Invalid encoded socket address (family byte %d)", b[0]);
    return ncclInvalidArgument;
  }
  socketAddressSetPort(out, port);
  return ncclSuccess;
}

// ---------------------------------------------------------------------------------------------
// Time and abort
// ---------------------------------------------------------------------------------------------

int64_t socketClockMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

ncclResult_t socketCheckAbort(const uint32_t* abortFlag, const char* what) {
  if (abortFlag != nullptr && __atomic_load_n(abortFlag, __ATOMIC_ACQUIRE) != 0) {
    MK_WARN("%s aborted", what);
    return ncclInternalError;
  }
  return ncclSuccess;
}

namespace {

// Both flags of a socket (socketCheckAbort on each).
ncclResult_t checkAborts(const Socket* s, const char* what) {
  NCCLCHECK(socketCheckAbort(s->abortFlag, what));
  NCCLCHECK(socketCheckAbort(s->abortFlag2, what));
  return ncclSuccess;
}

int64_t deadlineOf(const Socket* s) {
  // Saturating: a huge per-call bound must not wrap into a deadline in the past.
  return s->timeoutMs > 0 ? saturatingAdd(socketClockMs(), s->timeoutMs) : INT64_MAX;
}

bool isPeerGone(int err) {
  return err == ECONNRESET || err == EPIPE || err == ETIMEDOUT || err == ENOTCONN ||
         err == ECONNREFUSED || err == EHOSTUNREACH || err == ENETUNREACH;
}

// One non-blocking pass. Returns 1 when the peer closed (recv of 0), -1 with *err on failure,
// 0 otherwise (progress made or the kernel would block).
int progressOnce(Socket* s, SocketOp op, void* data, size_t size, size_t* offset, int* err) {
  char* p = static_cast<char*>(data);
  while (*offset < size) {
    ssize_t n = op == SocketOp::kSend
                    ? send(s->fd, p + *offset, size - *offset, MSG_NOSIGNAL | MSG_DONTWAIT)
                    : recv(s->fd, p + *offset, size - *offset, MSG_DONTWAIT);
    if (n > 0) {
      *offset += (size_t)n;
      continue;
    }
    if (n == 0 && op == SocketOp::kRecv) return 1;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    *err = n < 0 ? errno : EIO;
    return -1;
  }
  return 0;
}

ncclResult_t errorFor(Socket* s, int err, const char* what, bool warn) {
  char peer[kSocketAddrStrLen];
  socketAddressToString(&s->addr, peer, sizeof(peer));
  ncclResult_t res = isPeerGone(err) ? ncclRemoteError : ncclSystemError;
  if (warn)
    MK_WARN("Socket %s %s failed: %s", what, peer, strerror(err));
  else
    MK_INFO(kNet | kBootstrap, "Socket %s %s failed: %s", what, peer, strerror(err));
  return res;
}

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

ncclResult_t sleepWithAbort(const Socket* s, int64_t untilMs, const char* what) {
  for (;;) {
    NCCLCHECK(checkAborts(s, what));
    int64_t left = untilMs - socketClockMs();
    if (left <= 0) return ncclSuccess;
    int64_t slice = left < kSocketPollSliceMs ? left : kSocketPollSliceMs;
    timespec ts{(time_t)(slice / 1000), (long)(slice % 1000) * 1000000L};
    nanosleep(&ts, nullptr);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Sockets
// ---------------------------------------------------------------------------------------------

void socketInit(Socket* s, const uint32_t* abortFlag, int64_t timeoutMs) {
  s->fd = -1;
  memset(&s->addr, 0, sizeof(s->addr));
  s->abortFlag = abortFlag;
  s->abortFlag2 = nullptr;
  s->timeoutMs = timeoutMs;
}

void socketClose(Socket* s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
}

void socketRaiseFdLimit() {
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

ncclResult_t socketListen(Socket* s, const SocketAddress* local) {
  char name[kSocketAddrStrLen];
  socketAddressToString(local, name, sizeof(name));
  int fd = socket(local->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    MK_WARN("socket() for listening on %s failed: %s", name, strerror(errno));
    return ncclSystemError;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  SocketAddress bound = *local;
  socklen_t len = socketAddressLen(&bound);
  // A large backlog: at start-up every rank of a big job connects to the root at once, and a
  // full backlog makes Linux drop SYNs (1 s retransmit) rather than refuse.
  if (bind(fd, &bound.sa, len) != 0 || listen(fd, 16384) != 0 ||
      getsockname(fd, &bound.sa, &len) != 0) {
    MK_WARN("Cannot listen on %s: %s", name, strerror(errno));
    close(fd);
    return ncclSystemError;
  }
  s->fd = fd;
  s->addr = bound;
  MK_TRACE(kBootstrap | kNet, "Listening on %s",
           socketAddressToString(&s->addr, name, sizeof(name)));
  return ncclSuccess;
}

ncclResult_t socketConnect(Socket* s, const SocketAddress* remote, bool retryRefused) {
  char peer[kSocketAddrStrLen];
  socketAddressToString(remote, peer, sizeof(peer));
  s->addr = *remote;
  int64_t start = socketClockMs();
  int64_t deadline = deadlineOf(s);
  int64_t backoffMs = 1;
  int lastErr = 0;
  for (;;) {
    NCCLCHECK(checkAborts(s, "Socket connect"));
    int fd = socket(remote->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      MK_WARN("socket() to connect to %s failed: %s", peer, strerror(errno));
      return ncclSystemError;
    }
    setNoDelay(fd);
    int err = 0;
    int rc;
    do {
      rc = connect(fd, &remote->sa, socketAddressLen(remote));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) err = errno;
    if (err == EINPROGRESS) {
      s->fd = fd;
      bool ready = false;
      ncclResult_t res = socketPoll(s, POLLOUT, deadline, &ready);
      s->fd = -1;
      if (res != ncclSuccess) {
        close(fd);
        return res;
      }
      if (!ready) {
        err = ETIMEDOUT;
      } else {
        socklen_t len = sizeof(err);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      }
    }
    if (err == 0) {
      // A connect to a local port where nobody listens may pick that very port as its source
      // and connect to itself (TCP simultaneous open): that is a refusal, not the peer.
      SocketAddress self{};
      socklen_t slen = sizeof(self);
      if (getsockname(fd, &self.sa, &slen) == 0 && socketAddressEqual(&self, remote)) {
        err = ECONNREFUSED;
      } else {
        s->fd = fd;
        return ncclSuccess;
      }
    }
    close(fd);
    lastErr = err;
    bool retry = (err == ECONNREFUSED && retryRefused) || err == ETIMEDOUT || err == ECONNRESET ||
                 err == EAGAIN || err == EADDRINUSE || err == EADDRNOTAVAIL || err == EINTR;
    int64_t now = socketClockMs();
    if (!retry) break;
    if (now >= deadline) {
      NCCLCHECK(checkAborts(s, "Socket connect"));
      MK_WARN("Connect to %s timed out after %lld ms (last error: %s)", peer,
              (long long)(now - start), strerror(lastErr));
      return ncclRemoteError;
    }
    int64_t until = now + backoffMs < deadline ? now + backoffMs : deadline;
    NCCLCHECK(sleepWithAbort(s, until, "Socket connect"));
    backoffMs = backoffMs * 2 > 100 ? 100 : backoffMs * 2;
  }
  NCCLCHECK(checkAborts(s, "Socket connect"));
  MK_WARN("Connect to %s failed: %s", peer, strerror(lastErr));
  return isPeerGone(lastErr) ? ncclRemoteError : ncclSystemError;
}

ncclResult_t socketTryAccept(Socket* listener, Socket* out, bool* accepted) {
  *accepted = false;
  SocketAddress peer{};
  socklen_t len = sizeof(peer);
  int fd = accept4(listener->fd, &peer.sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    // The connection died in the queue, or nothing is pending: not an error of the listener.
    if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED ||
        err == EPROTO || err == EPERM || err == ENETDOWN || err == ENOPROTOOPT ||
        err == EHOSTDOWN || err == ENONET || err == EHOSTUNREACH || err == EOPNOTSUPP ||
        err == ENETUNREACH)
      return ncclSuccess;
    // Out of fds (EMFILE/ENFILE) the connection stays queued and the listener stays readable:
    // a caller that retries would log this many times a second. The caller backs off; the
    // warning says so at most once a second with a count of the repeats.
    char name[kSocketAddrStrLen];
    MK_WARN_RATELIMITED(1000, "accept() on %s failed: %s",
                        socketAddressToString(&listener->addr, name, sizeof(name)), strerror(err));
    return ncclSystemError;
  }
  setNoDelay(fd);
  socketInit(out, listener->abortFlag, listener->timeoutMs);
  out->fd = fd;
  out->addr = peer;
  *accepted = true;
  return ncclSuccess;
}

ncclResult_t socketAccept(Socket* listener, Socket* out) {
  int64_t deadline = deadlineOf(listener);
  for (;;) {
    bool ready = false;
    NCCLCHECK(socketPoll(listener, POLLIN, deadline, &ready));
    if (!ready) {
      char name[kSocketAddrStrLen];
      MK_WARN("Accept on %s timed out after %lld ms",
              socketAddressToString(&listener->addr, name, sizeof(name)),
              (long long)listener->timeoutMs);
      return ncclRemoteError;
    }
    bool accepted = false;
    NCCLCHECK(socketTryAccept(listener, out, &accepted));
    if (accepted) return ncclSuccess;
  }
}

ncclResult_t socketPoll(Socket* s, short events, int64_t deadlineMs, bool* ready) {
  *ready = false;
  for (;;) {
    NCCLCHECK(checkAborts(s, "Socket operation"));
    int64_t left = deadlineMs - socketClockMs();
    if (left <= 0) return ncclSuccess;
    pollfd pfd{s->fd, events, 0};
    int rc = poll(&pfd, 1, (int)(left < kSocketPollSliceMs ? left : kSocketPollSliceMs));
    if (rc > 0) {
      *ready = true;  // includes POLLERR/POLLHUP: the next call reports the error
      return ncclSuccess;
    }
    if (rc < 0 && errno != EINTR) {
      MK_WARN("poll() failed: %s", strerror(errno));
      return ncclSystemError;
    }
  }
}

ncclResult_t socketProgress(Socket* s, SocketOp op, void* data, size_t size, size_t* offset) {
  int err = 0;
  int rc = progressOnce(s, op, data, size, offset, &err);
  if (rc == 1) {
    char peer[kSocketAddrStrLen];
    MK_INFO(kNet | kBootstrap, "Connection closed by %s (%zu of %zu bytes received)",
            socketAddressToString(&s->addr, peer, sizeof(peer)), *offset, size);
    return ncclRemoteError;
  }
  if (rc < 0) return errorFor(s, err, op == SocketOp::kSend ? "send to" : "recv from", false);
  return ncclSuccess;
}

ncclResult_t socketProgressRecv(Socket* s, void* data, size_t size, size_t* offset, bool* closed) {
  *closed = false;
  size_t before = *offset;
  int err = 0;
  int rc = progressOnce(s, SocketOp::kRecv, data, size, offset, &err);
  if (rc == 1 && *offset == 0 && before == 0) {
    *closed = true;
    return ncclSuccess;
  }
  if (rc == 1) {
    char peer[kSocketAddrStrLen];
    MK_INFO(kNet | kBootstrap, "Connection closed by %s in the middle of a message",
            socketAddressToString(&s->addr, peer, sizeof(peer)));
    return ncclRemoteError;
  }
  if (rc < 0) return errorFor(s, err, "recv from", false);
  return ncclSuccess;
}

static ncclResult_t transfer(Socket* s, SocketOp op, void* data, size_t size) {
  NCCLCHECK(checkAborts(s, "Socket operation"));
  if (size == 0) return ncclSuccess;
  int64_t start = socketClockMs();
  int64_t deadline = deadlineOf(s);
  size_t offset = 0;
  const char* what = op == SocketOp::kSend ? "send to" : "recv from";
  for (;;) {
    int err = 0;
    int rc = progressOnce(s, op, data, size, &offset, &err);
    char peer[kSocketAddrStrLen];
    // Once the flag is up, failures it provoked elsewhere (peers closing) count as the abort.
    if (rc != 0) NCCLCHECK(checkAborts(s, "Socket operation"));
    if (rc == 1) {
      MK_WARN("Connection closed by %s (%zu of %zu bytes received)",
              socketAddressToString(&s->addr, peer, sizeof(peer)), offset, size);
      return ncclRemoteError;
    }
    if (rc < 0) return errorFor(s, err, what, true);
    if (offset == size) return ncclSuccess;
    bool ready = false;
    NCCLCHECK(socketPoll(s, op == SocketOp::kSend ? POLLOUT : POLLIN, deadline, &ready));
    if (!ready) {
      MK_WARN("Socket %s %s timed out after %lld ms (%zu of %zu bytes)", what,
              socketAddressToString(&s->addr, peer, sizeof(peer)),
              (long long)(socketClockMs() - start), offset, size);
      return ncclRemoteError;
    }
  }
}

ncclResult_t socketSend(Socket* s, const void* data, size_t size) {
  return transfer(s, SocketOp::kSend, const_cast<void*>(data), size);
}

ncclResult_t socketRecv(Socket* s, void* data, size_t size) {
  return transfer(s, SocketOp::kRecv, data, size);
}

}  // namespace mk
