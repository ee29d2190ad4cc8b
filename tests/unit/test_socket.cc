// Socket layer: address parsing/formatting, exact-size transfers, timeouts, abort, peer loss.
#include <cstdint>
#include <gtest/gtest.h>
#include <poll.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/socket.h"
#include "common/test_util.h"
#include "base/debug.h"

using namespace mk;

namespace {

SocketAddress parse(const char* s) {
  SocketAddress a{};
  EXPECT_EQ(socketAddressFromString(s, &a), ncclSuccess) << s;
  return a;
}

std::string str(const SocketAddress& a) {
  char buf[kSocketAddrStrLen];
  return socketAddressToString(&a, buf, sizeof(buf));
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A connected pair on loopback: `a` connected to `b` (accepted side).
void makePair(Socket* a, Socket* b, int64_t timeoutMs, const uint32_t* abortFlag = nullptr) {
  Socket l;
  socketInit(&l, nullptr, 5000);
  SocketAddress local = parse("127.0.0.1:0");
  ASSERT_EQ(socketListen(&l, &local), ncclSuccess);
  socketInit(a, abortFlag, timeoutMs);
  ASSERT_EQ(socketConnect(a, &l.addr), ncclSuccess);
  ASSERT_EQ(socketAccept(&l, b), ncclSuccess);
  b->abortFlag = abortFlag;
  b->timeoutMs = timeoutMs;
  socketClose(&l);
}

}  // namespace

TEST(SocketAddress, ParsesAndFormats) {
  EXPECT_EQ(str(parse("127.0.0.1:1234")), "127.0.0.1:1234");
  EXPECT_EQ(str(parse("10.1.2.3:0")), "10.1.2.3:0");
  EXPECT_EQ(str(parse("[::1]:80")), "[::1]:80");
  EXPECT_EQ(str(parse("[2001:db8::5]:65535")), "[2001:db8::5]:65535");
  SocketAddress ll = parse("[fe80::1%lo]:5");
  EXPECT_EQ(ll.sa.sa_family, AF_INET6);
  EXPECT_NE(ll.sin6.sin6_scope_id, 0u);
  EXPECT_EQ(str(ll), "[fe80::1%lo]:5");
  SocketAddress host = parse("localhost:99");
  EXPECT_EQ(socketAddressPort(&host), 99);
  EXPECT_TRUE(host.sa.sa_family == AF_INET || host.sa.sa_family == AF_INET6);
}

TEST(SocketAddress, RejectsMalformed) {
  const char* bad[] = {"",           "1.2.3.4",  "1.2.3.4:", "1.2.3.4:99999",
                       "1.2.3.4:-1", "::1:80",   "[::1]80",  "[::1",
                       ":80",        "host:abc", "[]:80",    "1.2.3.4:80x"};
  for (const char* s : bad) {
    SocketAddress a;
    EXPECT_EQ(socketAddressFromString(s, &a), ncclInvalidArgument) << "'" << s << "'";
  }
}

TEST(SocketAddress, WireRoundTrip) {
  for (const char* s : {"192.0.2.7:4242", "[2001:db8::1]:1", "[fe80::2%lo]:65000"}) {
    SocketAddress a = parse(s), b{};
    SocketWireAddress w;
    socketAddressToWire(&a, &w);
    ASSERT_EQ(socketAddressFromWire(&w, &b), ncclSuccess);
    EXPECT_TRUE(socketAddressEqual(&a, &b)) << s;
    EXPECT_EQ(str(b), str(a));
  }
  SocketWireAddress junk;
  memset(&junk, 0xab, sizeof(junk));
  SocketAddress out;
  EXPECT_EQ(socketAddressFromWire(&junk, &out), ncclInvalidArgument);
}

TEST(Socket, SendRecvExactBytesBothWays) {
  Socket a, b;
  makePair(&a, &b, 10000);
  std::mt19937_64 rng(mktest::testSeed());
  // Bigger than the socket buffers: both sides must interleave (threads here).
  std::vector<uint8_t> ab(2 << 20), ba(3 << 20 | 7), gotAb(ab.size()), gotBa(ba.size());
  for (auto& x : ab) x = (uint8_t)rng();
  for (auto& x : ba) x = (uint8_t)rng();
  std::thread t([&] {
    EXPECT_EQ(socketSend(&b, ba.data(), ba.size()), ncclSuccess);
    EXPECT_EQ(socketRecv(&b, gotAb.data(), gotAb.size()), ncclSuccess);
  });
  EXPECT_EQ(socketSend(&a, ab.data(), ab.size()), ncclSuccess);
  EXPECT_EQ(socketRecv(&a, gotBa.data(), gotBa.size()), ncclSuccess);
  t.join();
  EXPECT_EQ(ab, gotAb);
  EXPECT_EQ(ba, gotBa);
  EXPECT_EQ(socketSend(&a, nullptr, 0), ncclSuccess);
  socketClose(&a);
  socketClose(&b);
}

TEST(Socket, RecvTimesOutWithPeerInMessage) {
  Socket a, b;
  makePair(&a, &b, 300);
  char buf[16];
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(socketRecv(&a, buf, sizeof(buf)), ncclRemoteError);
  double s = since(t0);
  EXPECT_GE(s, 0.25);
  EXPECT_LT(s, 3.0);
  std::string err = lastError();
  EXPECT_NE(err.find("timed out"), std::string::npos) << err;
  EXPECT_NE(err.find("127.0.0.1:"), std::string::npos) << err;
  // A partial message also times out (the timeout bounds the whole transfer).
  EXPECT_EQ(socketSend(&b, buf, 4), ncclSuccess);
  EXPECT_EQ(socketRecv(&a, buf, sizeof(buf)), ncclRemoteError);
  socketClose(&a);
  socketClose(&b);
}

TEST(Socket, PeerCloseIsRemoteErrorAndNoSigpipe) {
  Socket a, b;
  makePair(&a, &b, 5000);
  char buf[64] = {};
  EXPECT_EQ(socketSend(&b, buf, 10), ncclSuccess);
  socketClose(&b);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(socketRecv(&a, buf, sizeof(buf)), ncclRemoteError);  // 10 of 64 bytes, then EOF
  EXPECT_LT(since(t0), 1.0);
  std::string err = lastError();
  EXPECT_NE(err.find("closed by"), std::string::npos) << err;
  // Writing to the dead peer: EPIPE/ECONNRESET as ncclRemoteError; SIGPIPE would kill us.
  std::vector<char> big(1 << 20);
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < 20 && res == ncclSuccess; i++) res = socketSend(&a, big.data(), big.size());
  EXPECT_EQ(res, ncclRemoteError);
  socketClose(&a);
}

TEST(Socket, AbortInterruptsRecvSendConnectAccept) {
  uint32_t flag = 0;
  Socket a, b;
  makePair(&a, &b, 60000, &flag);
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    __atomic_store_n(&flag, 1, __ATOMIC_RELEASE);
  });
  char buf[8];
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(socketRecv(&a, buf, sizeof(buf)), ncclInternalError);
  double s = since(t0);
  setter.join();
  EXPECT_LT(s, 1.0);
  EXPECT_NE(std::string(lastError()).find("aborted"), std::string::npos);
  // Everything else returns at once while the flag is set.
  std::vector<char> big(1 << 20);
  EXPECT_EQ(socketSend(&a, big.data(), big.size()), ncclInternalError);
  Socket l, c;
  socketInit(&l, &flag, 60000);
  SocketAddress local = parse("127.0.0.1:0");
  ASSERT_EQ(socketListen(&l, &local), ncclSuccess);
  EXPECT_EQ(socketAccept(&l, &c), ncclInternalError);
  socketInit(&c, &flag, 60000);
  EXPECT_EQ(socketConnect(&c, &l.addr), ncclInternalError);
  socketClose(&l);
  socketClose(&a);
  socketClose(&b);
}

TEST(Socket, ConnectRetriesRefusedUntilListenerAppears) {
  Socket probe;
  socketInit(&probe, nullptr, 1000);
  SocketAddress local = parse("127.0.0.1:0");
  ASSERT_EQ(socketListen(&probe, &local), ncclSuccess);
  SocketAddress addr = probe.addr;
  socketClose(&probe);  // the port is free again: connects are refused for now
  std::atomic<bool> ok{false};
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Socket l, c;
    socketInit(&l, nullptr, 5000);
    if (socketListen(&l, &addr) != ncclSuccess) return;
    ok = socketAccept(&l, &c) == ncclSuccess;
    socketClose(&c);
    socketClose(&l);
  });
  Socket s;
  socketInit(&s, nullptr, 5000);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(socketConnect(&s, &addr), ncclSuccess);
  EXPECT_GE(since(t0), 0.2);
  late.join();
  EXPECT_TRUE(ok.load());
  socketClose(&s);
}

TEST(Socket, ConnectRefusedTimesOutOrFailsFast) {
  Socket probe;
  socketInit(&probe, nullptr, 1000);
  SocketAddress local = parse("127.0.0.1:0");
  ASSERT_EQ(socketListen(&probe, &local), ncclSuccess);
  SocketAddress addr = probe.addr;
  socketClose(&probe);
  Socket s;
  socketInit(&s, nullptr, 300);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(socketConnect(&s, &addr), ncclRemoteError);
  double t = since(t0);
  EXPECT_GE(t, 0.25);
  EXPECT_LT(t, 2.0);
  EXPECT_NE(std::string(lastError()).find("timed out"), std::string::npos);
  t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(socketConnect(&s, &addr, /*retryRefused=*/false), ncclRemoteError);
  EXPECT_LT(since(t0), 0.2);
  EXPECT_EQ(s.fd, -1);
}

// TCP "simultaneous open": a connect to a local port where nobody listens can pick that very
// port as its source port and connect to itself. A rank retrying the root of NCCL_COMM_ID
// before it is up would then read its own hello back as the root's answer. Reproduced
// deterministically in a private network namespace of this thread whose ephemeral port range
// is the one port we connect to.
TEST(Socket, ConnectNeverReturnsAConnectionToItself) {
  const int port = 40000;  // even: connect() prefers even source ports
  ncclResult_t res = ncclSuccess;
  std::string skip;
  int64_t fdAfter = -2;
  std::thread t([&] {
    if (unshare(CLONE_NEWNET) != 0) {
      skip = std::string("cannot make a network namespace: ") + strerror(errno);
      return;
    }
    int ctl = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq ifr{};
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
    bool up = ctl >= 0 && ioctl(ctl, SIOCGIFFLAGS, &ifr) == 0;
    ifr.ifr_flags |= IFF_UP;
    up = up && ioctl(ctl, SIOCSIFFLAGS, &ifr) == 0;
    if (ctl >= 0) close(ctl);
    int rf = open("/proc/sys/net/ipv4/ip_local_port_range", O_WRONLY | O_CLOEXEC);
    std::string range = std::to_string(port) + " " + std::to_string(port);
    bool ranged = rf >= 0 && write(rf, range.data(), range.size()) == (ssize_t)range.size();
    if (rf >= 0) close(rf);
    if (!up || !ranged) {
      skip = "cannot set up loopback or the port range in the new network namespace";
      return;
    }
    SocketAddress to = parse(("127.0.0.1:" + std::to_string(port)).c_str());
    Socket s;
    socketInit(&s, nullptr, 500);
    res = socketConnect(&s, &to);
    fdAfter = s.fd;
    socketClose(&s);
  });
  t.join();
  if (!skip.empty()) GTEST_SKIP() << skip;
  EXPECT_EQ(res, ncclRemoteError) << "connected although nobody listens (to itself)";
  EXPECT_EQ(fdAfter, -1);
}

TEST(Socket, AcceptTimesOut) {
  Socket l, c;
  socketInit(&l, nullptr, 200);
  SocketAddress local = parse("127.0.0.1:0");
  ASSERT_EQ(socketListen(&l, &local), ncclSuccess);
  EXPECT_NE(socketAddressPort(&l.addr), 0);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(socketAccept(&l, &c), ncclRemoteError);
  EXPECT_LT(since(t0), 2.0);
  bool accepted = true;
  EXPECT_EQ(socketTryAccept(&l, &c, &accepted), ncclSuccess);
  EXPECT_FALSE(accepted);
  socketClose(&l);
}

TEST(Socket, ProgressReportsCleanCloseAtBoundary) {
  Socket a, b;
  makePair(&a, &b, 2000);
  uint32_t v = 0x12345678, got = 0;
  size_t off = 0;
  bool closed = false;
  ASSERT_EQ(socketProgressRecv(&a, &got, sizeof(got), &off, &closed), ncclSuccess);
  EXPECT_EQ(off, 0u);  // nothing yet, would block
  EXPECT_FALSE(closed);
  ASSERT_EQ(socketSend(&b, &v, sizeof(v)), ncclSuccess);
  socketClose(&b);
  bool ready = false;
  ASSERT_EQ(socketPoll(&a, POLLIN, socketClockMs() + 2000, &ready), ncclSuccess);
  EXPECT_TRUE(ready);
  ASSERT_EQ(socketProgressRecv(&a, &got, sizeof(got), &off, &closed), ncclSuccess);
  EXPECT_EQ(off, sizeof(got));
  EXPECT_EQ(got, v);
  off = 0;
  ASSERT_EQ(socketProgressRecv(&a, &got, sizeof(got), &off, &closed), ncclSuccess);
  EXPECT_TRUE(closed);
  socketClose(&a);
}

TEST(Socket, Ipv6Loopback) {
  Socket l;
  socketInit(&l, nullptr, 2000);
  SocketAddress local = parse("[::1]:0");
  if (socketListen(&l, &local) != ncclSuccess) GTEST_SKIP() << "no IPv6 loopback here";
  Socket a, b;
  socketInit(&a, nullptr, 2000);
  ASSERT_EQ(socketConnect(&a, &l.addr), ncclSuccess);
  ASSERT_EQ(socketAccept(&l, &b), ncclSuccess);
  EXPECT_EQ(str(b.addr).rfind("[::1]:", 0), 0u) << str(b.addr);
  uint64_t x = 42, y = 0;
  EXPECT_EQ(socketSend(&a, &x, sizeof(x)), ncclSuccess);
  EXPECT_EQ(socketRecv(&b, &y, sizeof(y)), ncclSuccess);
  EXPECT_EQ(y, 42u);
  socketClose(&a);
  socketClose(&b);
  socketClose(&l);
}

TEST(Socket, NoFdLeaks) {
  int base = mktest::countOpenFds();
  for (int i = 0; i < 50; i++) {
    Socket a, b;
    makePair(&a, &b, 1000);
    socketClose(&a);
    socketClose(&b);
  }
  Socket s;
  socketInit(&s, nullptr, 50);
  SocketAddress nowhere = parse("127.0.0.1:1");
  EXPECT_NE(socketConnect(&s, &nowhere), ncclSuccess);
  EXPECT_EQ(mktest::countOpenFds(), base);
}
