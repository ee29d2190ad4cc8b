// Raw bootstrap clients for the CPU tests that attack the root: a hand-made hello, a raw
// connection that sends arbitrary bytes, and a bounded check that the other side closed.
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include "bootstrap/proto.h"

namespace bstest {

using namespace mk;

// A raw client connection that sends `bytes` (may be empty).
inline Socket rawSend(const SocketAddress& to, const void* bytes, size_t n) {
  Socket s;
  socketInit(&s, nullptr, 2000);
  EXPECT_EQ(socketConnect(&s, &to), ncclSuccess);
  if (n > 0) EXPECT_EQ(socketSend(&s, bytes, n), ncclSuccess);
  return s;
}

// True when the other side closes (EOF or reset) within ms.
inline bool closedWithin(Socket* s, int ms) {
  int64_t deadline = socketClockMs() + ms;
  for (;;) {
    pollfd p{s->fd, POLLIN, 0};
    int64_t left = deadline - socketClockMs();
    if (left <= 0) return false;
    if (poll(&p, 1, (int)left) > 0) {
      char c[256];
      ssize_t r = recv(s->fd, c, sizeof(c), MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN)) return true;
    }
  }
}

struct Hello {
  RootHello h;
  SocketWireAddress a;
};

inline Hello validHello(uint64_t secret, int rank, int nranks) {
  Hello m;
  memset(&m, 0, sizeof(m));
  m.h.magic = kBootstrapIdMagic;
  m.h.version = kBootstrapProtocolVersion;
  m.h.type = kRootHello;
  m.h.secret = secret;
  m.h.rank = rank;
  m.h.nranks = nranks;
  m.h.nIds = 1;
  m.h.rootIdx = 0;
  m.h.payloadBytes = sizeof(SocketWireAddress);
  SocketAddress a;
  socketAddressFromString("127.0.0.1:9", &a);
  socketAddressToWire(&a, &m.a);
  return m;
}

}  // namespace bstest
