#include "transport/ipc_socket.h"

#include <cstdint>
#include <utility>
#include <vector>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>

#include "base/checks.h"
#include "base/param.h"

namespace mk {

namespace {

constexpr uint64_t kIpcMagic = 0x6d6b2d6970632d31ull;  // "mk-ipc-1"
constexpr int kPollSliceMs = 5;                        // abort-flag polling period

struct WireHeader {
  uint64_t magic;
  uint64_t hash;
  int32_t src;
  uint32_t tag;
  uint32_t size;
  uint32_t hasFd;
};

using Clock = std::chrono::steady_clock;

bool aborted(const IpcSocket* s) {
  return s->abortFlag && __atomic_load_n(s->abortFlag, __ATOMIC_ACQUIRE) != 0;
}

int64_t msLeft(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
}

socklen_t makeAddr(const char* name, sockaddr_un* addr) {
  memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  size_t len = strnlen(name, kIpcNameLen - 1);
  // Abstract namespace: sun_path[0] = '\0', then the name (not NUL-terminated).
  memcpy(addr->sun_path + 1, name, len);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + len);
}

// Reads one datagram if one is there. *got = false when the queue is empty.
ncclResult_t recvOne(IpcSocket* s, bool* got) {
  *got = false;
  struct {
    WireHeader hdr;
    char payload[kIpcMaxPayload];
  } buf;
  union {
    cmsghdr align;
    char space[CMSG_SPACE(sizeof(int) * 4)];
  } ctrl;
  iovec iov = {&buf, sizeof(buf)};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl.space;
  msg.msg_controllen = sizeof(ctrl.space);
  ssize_t n;
  do {
    n = recvmsg(s->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return ncclSuccess;
    MK_WARN("IPC socket %s: recvmsg failed: %s", s->name, strerror(errno));
    return ncclSystemError;
  }
  *got = true;
  // Collect every passed descriptor; we keep at most one.
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < nfd; i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.push_back(fd);
      }
    }
  }
  auto drop = [&](const char* why) {
    for (int fd : fds) close(fd);
    // Rate-limited: anyone in the network namespace can send to an abstract name, and a line
    // per datagram would let them flood the log.
    MK_WARN_RATELIMITED(1000, "IPC socket %s: dropped a message (%s)", s->name, why);
    return ncclSuccess;
  };
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) return drop("truncated");
  if (n < (ssize_t)sizeof(WireHeader)) return drop("short header");
  if (buf.hdr.magic != kIpcMagic) return drop("bad magic");
  if (buf.hdr.hash != s->hash) return drop("message of another communicator");
  if (buf.hdr.size > kIpcMaxPayload || n != (ssize_t)(sizeof(WireHeader) + buf.hdr.size))
    return drop("bad payload size");
  if (fds.size() != (buf.hdr.hasFd ? 1u : 0u)) return drop("unexpected descriptor count");
  IpcMessage m;
  m.src = buf.hdr.src;
  m.tag = buf.hdr.tag;
  m.fd = fds.empty() ? -1 : fds[0];
  m.data.assign(buf.payload, buf.payload + buf.hdr.size);
  s->pending.push_back(std::move(m));
  return ncclSuccess;
}

// Drains everything queued on the socket into s->pending.
ncclResult_t drain(IpcSocket* s) {
  bool got = true;
  while (got) NCCLCHECK(recvOne(s, &got));
  return ncclSuccess;
}

}  // namespace

uint64_t ipcSocketNonce() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v)) return v;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, &v, sizeof(v));
    close(fd);
    if (n == (ssize_t)sizeof(v)) return v;
  }
  v = (uint64_t)Clock::now().time_since_epoch().count();
  return v ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&v;
}

void ipcSocketName(char* out, int rank, uint64_t nonce) {
  snprintf(out, kIpcNameLen, "mkernel-%d-%016" PRIx64, rank, nonce);
}

ncclResult_t ipcSocketInit(IpcSocket* s, const char* name, int rank, uint64_t hash,
                           const uint32_t* abortFlag, int64_t timeoutMs) {
  MK_ARGCHECK(s != nullptr && name != nullptr && name[0] != '\0',
              "ipcSocketInit: null socket or empty name");
  MK_ARGCHECK(strlen(name) < kIpcNameLen, "ipcSocketInit: name '%s' longer than %zu", name,
              kIpcNameLen - 1);
  s->pending.clear();
  s->rank = rank;
  s->hash = hash;
  s->abortFlag = abortFlag;
  s->timeoutMs = timeoutMs > 0 ? timeoutMs : MK_PARAM_INT(BootstrapTimeoutS) * 1000;
  if (s->timeoutMs <= 0) s->timeoutMs = 120000;
  snprintf(s->name, kIpcNameLen, "%s", name);
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    MK_WARN("IPC socket: socket(AF_UNIX) failed: %s", strerror(errno));
    return ncclSystemError;
  }
  sockaddr_un addr;
  socklen_t len = makeAddr(name, &addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    MK_WARN("IPC socket: bind to abstract name '%s' failed: %s", name, strerror(errno));
    close(fd);
    return ncclSystemError;
  }
  s->fd = fd;
  MK_TRACE(kP2p, "IPC socket %s bound (rank %d)", s->name, rank);
  return ncclSuccess;
}

ncclResult_t ipcSocketSend(IpcSocket* s, const char* peerName, uint32_t tag, int fd,
                           const void* data, size_t size) {
  MK_ARGCHECK(s != nullptr && s->fd >= 0, "ipcSocketSend: socket not initialised");
  MK_ARGCHECK(peerName != nullptr && peerName[0] != '\0', "ipcSocketSend: no peer name");
  MK_ARGCHECK(size <= kIpcMaxPayload, "ipcSocketSend: payload of %zu bytes exceeds %zu", size,
              kIpcMaxPayload);
  MK_ARGCHECK(size == 0 || data != nullptr, "ipcSocketSend: null payload");
  struct {
    WireHeader hdr;
    char payload[kIpcMaxPayload];
  } buf;
  buf.hdr = {kIpcMagic, s->hash, s->rank, tag, (uint32_t)size, fd >= 0 ? 1u : 0u};
  if (size) memcpy(buf.payload, data, size);
  union {
    cmsghdr align;
    char space[CMSG_SPACE(sizeof(int))];
  } ctrl;
  memset(&ctrl, 0, sizeof(ctrl));
  sockaddr_un addr;
  socklen_t alen = makeAddr(peerName, &addr);
  iovec iov = {&buf, sizeof(WireHeader) + size};
  msghdr msg = {};
  msg.msg_name = &addr;
  msg.msg_namelen = alen;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = ctrl.space;
    msg.msg_controllen = sizeof(ctrl.space);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(s->timeoutMs);
  int lastErr = 0;
  for (;;) {
    if (aborted(s)) {
      MK_WARN("IPC socket %s: send to %s aborted", s->name, peerName);
      return ncclInternalError;
    }
    ssize_t n = sendmsg(s->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n == (ssize_t)iov.iov_len) return ncclSuccess;
    if (n >= 0) {
      MK_WARN("IPC socket %s: short datagram to %s (%zd bytes)", s->name, peerName, n);
      return ncclSystemError;
    }
    lastErr = errno;
    // EAGAIN: the receiver's queue is full; ECONNREFUSED/ENOENT: nobody bound the name yet.
    if (lastErr != EINTR && lastErr != EAGAIN && lastErr != EWOULDBLOCK &&
        lastErr != ECONNREFUSED && lastErr != ENOENT && lastErr != ENOBUFS) {
      MK_WARN("IPC socket %s: sendmsg to %s failed: %s", s->name, peerName, strerror(lastErr));
      return ncclSystemError;
    }
    if (msLeft(deadline) <= 0) {
      MK_WARN("IPC socket %s: send to %s timed out after %" PRId64 " ms (%s)", s->name, peerName,
              s->timeoutMs, strerror(lastErr));
      return ncclRemoteError;
    }
    // While we wait for room, take in what others send us (they may be waiting on us).
    NCCLCHECK(drain(s));
    pollfd p = {s->fd, POLLIN, 0};
    int wait = (int)std::min<int64_t>(1, std::max<int64_t>(msLeft(deadline), 0));
    poll(&p, 1, wait);
  }
}

ncclResult_t ipcSocketRecv(IpcSocket* s, int srcRank, uint32_t tag, int* fd, void* data,
                           size_t size) {
  MK_ARGCHECK(s != nullptr && s->fd >= 0, "ipcSocketRecv: socket not initialised");
  MK_ARGCHECK(size == 0 || data != nullptr, "ipcSocketRecv: null buffer");
  if (fd) *fd = -1;
  Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(s->timeoutMs);
  for (;;) {
    NCCLCHECK(drain(s));
    auto it = std::find_if(s->pending.begin(), s->pending.end(),
                           [&](const IpcMessage& m) { return m.src == srcRank && m.tag == tag; });
    if (it != s->pending.end()) {
      IpcMessage m = std::move(*it);
      s->pending.erase(it);
      if (m.data.size() != size) {
        if (m.fd >= 0) close(m.fd);
        MK_WARN("IPC socket %s: message (rank %d, tag %u) has %zu bytes, expected %zu", s->name,
                srcRank, tag, m.data.size(), size);
        return ncclInternalError;
      }
      if (size) memcpy(data, m.data.data(), size);
      if (fd)
        *fd = m.fd;
      else if (m.fd >= 0)
        close(m.fd);
      return ncclSuccess;
    }
    if (aborted(s)) {
      MK_WARN("IPC socket %s: receive from rank %d aborted", s->name, srcRank);
      return ncclInternalError;
    }
    int64_t left = msLeft(deadline);
    if (left <= 0) {
      MK_WARN("IPC socket %s: timed out after %" PRId64 " ms waiting for rank %d (tag %u)", s->name,
              s->timeoutMs, srcRank, tag);
      return ncclRemoteError;
    }
    pollfd p = {s->fd, POLLIN, 0};
    int r = poll(&p, 1, (int)std::min<int64_t>(left, kPollSliceMs));
    if (r < 0 && errno != EINTR) {
      MK_WARN("IPC socket %s: poll failed: %s", s->name, strerror(errno));
      return ncclSystemError;
    }
  }
}

ncclResult_t ipcSocketClose(IpcSocket* s) {
  if (s == nullptr) return ncclSuccess;
  for (IpcMessage& m : s->pending)
    if (m.fd >= 0) close(m.fd);
  s->pending.clear();
  if (s->fd >= 0) {
    // Descriptors still queued in the kernel are closed with the socket.
    close(s->fd);
    s->fd = -1;
  }
  return ncclSuccess;
}

}  // namespace mk
