// Host helpers of net_bench: progress lines and per-phase bounds (a watchdog thread), fatal
// exits that skip CUDA teardown (which would wait for a kernel that may never end), and
// plain TCP over loopback where every blocking call has a timeout.
#pragma once

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace netbench {

using Clock = std::chrono::steady_clock;
inline double now() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// What the program is doing now, for progress lines, failure messages and the watchdog.
struct PhaseState {
  std::mutex mu;
  std::string name = "start";
  double start = now(), bound = 0;    // bound 0: no bound (set-up before the first phase)
  double t0 = now();                  // program start
  std::vector<uint32_t*> abortFlags;  // the comms' abort flags (host memory)
};
inline PhaseState& phaseState() {
  static PhaseState s;
  return s;
}

// Stores 1 into every registered abort flag: the comms' device waits end within
// milliseconds and the kernels return (the flags are host memory: safe from any thread).
inline void setAbortFlags() {
  PhaseState& s = phaseState();
  std::vector<uint32_t*> flags;
  {
    std::lock_guard<std::mutex> g(s.mu);
    flags = s.abortFlags;
  }
  for (uint32_t* f : flags) __atomic_store_n(f, 1u, __ATOMIC_RELEASE);
}

inline std::string currentPhase() {
  PhaseState& s = phaseState();
  std::lock_guard<std::mutex> g(s.mu);
  return s.name;
}

// Fatal error: message (naming the phase), abort flags, flush, _exit. Safe from any thread.
[[noreturn]] inline void die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void die(const char* fmt, ...) {
  char m[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof(m), fmt, ap);
  va_end(ap);
  fprintf(stderr, "net_bench: FAIL in phase '%s': %s\n", currentPhase().c_str(), m);
  setAbortFlags();
  fflush(stdout);
  fflush(stderr);
  _exit(1);
}

// Starts a phase: a progress line on stderr, and the bound the watchdog enforces.
inline void beginPhase(double boundS, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
inline void beginPhase(double boundS, const char* fmt, ...) {
  char m[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof(m), fmt, ap);
  va_end(ap);
  PhaseState& s = phaseState();
  double t;
  {
    std::lock_guard<std::mutex> g(s.mu);
    s.name = m;
    s.start = now();
    s.bound = boundS;
    t = s.start - s.t0;
  }
  fprintf(stderr, "[net_bench +%6.1f s] %s (bound %.0f s)\n", t, m, boundS);
}

inline double phaseElapsed() {
  PhaseState& s = phaseState();
  std::lock_guard<std::mutex> g(s.mu);
  return now() - s.start;
}

// The last resort for calls that have no deadline of their own (cudaMemcpy behind a kernel
// that never ends, comm init or teardown, ...): when a phase runs graceS past its bound,
// say which one, set the abort flags, give kernels a second to leave, and exit with 3.
inline void startWatchdog(double graceS) {
  std::thread([graceS] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      PhaseState& s = phaseState();
      std::string name;
      double bound, ran;
      {
        std::lock_guard<std::mutex> g(s.mu);
        name = s.name;
        bound = s.bound;
        ran = now() - s.start;
      }
      if (bound <= 0 || ran <= bound + graceS) continue;
      fprintf(stderr,
              "net_bench: FAIL phase '%s' exceeded its bound of %.0f s (running %.0f s, blocked "
              "in a call without a deadline of its own); setting the comms' abort flags and "
              "exiting\n",
              name.c_str(), bound, ran);
      setAbortFlags();
      std::this_thread::sleep_for(std::chrono::seconds(1));
      fflush(stdout);
      fflush(stderr);
      _exit(3);
    }
  }).detach();
}

// ---- plain TCP over loopback, every wait bounded by timeoutS -------------------------------
inline void setIoTimeout(int fd, double timeoutS) {
  timeval tv;
  tv.tv_sec = (time_t)timeoutS;
  tv.tv_usec = (suseconds_t)((timeoutS - (double)tv.tv_sec) * 1e6);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

inline int listenLoopback(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket: %s", strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(fd, (sockaddr*)&a, sizeof(a)) != 0 || listen(fd, 256) != 0)
    die("bind/listen on 127.0.0.1: %s", strerror(errno));
  socklen_t l = sizeof(a);
  getsockname(fd, (sockaddr*)&a, &l);
  *port = ntohs(a.sin_port);
  return fd;
}

// A connected pair of TCP sockets over loopback: {sender end, receiver end}, TCP_NODELAY,
// send/receive timeouts of timeoutS.
inline std::pair<int, int> tcpPair(int lfd, int port, double timeoutS) {
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0) die("socket: %s", strerror(errno));
  setIoTimeout(c, timeoutS);  // also bounds connect()
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(c, (sockaddr*)&a, sizeof(a)) != 0)
    die("connect to 127.0.0.1:%d: %s", port, strerror(errno));
  pollfd p{lfd, POLLIN, 0};
  int r = poll(&p, 1, (int)(timeoutS * 1000));
  if (r <= 0) die("accept on 127.0.0.1:%d: %s", port, r == 0 ? "timed out" : strerror(errno));
  int s = accept(lfd, nullptr, nullptr);
  if (s < 0) die("accept: %s", strerror(errno));
  setIoTimeout(s, timeoutS);
  int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return {c, s};
}

inline void sendAll(int fd, const char* p, size_t n) {
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      die("TCP send: no progress within the socket timeout (receiver stuck?)");
    if (k <= 0) die("TCP send: %s", k == 0 ? "sent nothing" : strerror(errno));
    p += k, n -= (size_t)k;
  }
}
inline void recvAll(int fd, char* p, size_t n) {
  while (n) {
    ssize_t k = recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      die("TCP recv: nothing arrived within the socket timeout (sender stuck?)");
    if (k <= 0) die("TCP recv: %s", k == 0 ? "peer closed the connection" : strerror(errno));
    p += k, n -= (size_t)k;
  }
}

}  // namespace netbench
