// Socket backend, receive side: what a peer sends is checked before it is trusted. A raw
// TCP client plays the peer (the Hello and Frame wire formats of
// net_socket_impl.h), sends one good message (the harness speaks the protocol: it lands
// whole) and then something corrupt: a frame whose fields, taken at face value, put payload
// bytes outside the posted receive buffer or keep writing into it after the message
// completed, or a handshake that does not fit its group. The receive must fail with an error
// naming the peer and leave every byte around the buffer as it was; the bad connection must
// be dropped.
#include <cstdint>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/debug.h"
#include "bootstrap/socket.h"
#include "common/test_util.h"
#include "transport/net.h"
#include "transport/net_socket_impl.h"

namespace {

constexpr uint8_t kPoison = 0xa5;
constexpr int kTag = 7;

using mk::sock::Hello;  // the connector's handshake (net_socket_impl.h)
using mk::sock::kHelloInline;
using mk::sock::kHelloMagic;

// The listener side is the backend under test; sock (connection 0, the inline one) and
// helper[] are the raw peer's connections.
struct RawPeer {
  std::unique_ptr<mk::Net> net;
  void* listenComm = nullptr;
  void* recvComm = nullptr;
  mk::SocketAddress addr{};
  uint64_t nonce = 0;
  mk::Socket sock, helper[2];
  ~RawPeer() {
    if (recvComm) net->closeRecv(recvComm);
    if (listenComm) net->closeListen(listenComm);
    mk::socketClose(&sock);
    for (mk::Socket& h : helper) mk::socketClose(&h);
  }
};

void listenRaw(RawPeer* p) {
  ASSERT_EQ(mk::netCreateSocket(&p->net), ncclSuccess) << mk::lastError();
  int ndev = 0;
  ASSERT_EQ(p->net->devices(&ndev), ncclSuccess);
  ASSERT_GE(ndev, 1) << "NCCL_SOCKET_IFNAME=lo found no interface";
  char handle[mk::kNetHandleSize] = {};
  ASSERT_EQ(p->net->listen(0, handle, &p->listenComm), ncclSuccess) << mk::lastError();
  // The socket handle: a 64-bit magic, then the listener's wire address.
  mk::SocketWireAddress wa;
  memcpy(&wa, handle + sizeof(uint64_t), sizeof(wa));
  ASSERT_EQ(mk::socketAddressFromWire(&wa, &p->addr), ncclSuccess);
  p->nonce = mktest::testSeed() | 1;
}

// Connects s to the listener and sends its handshake: connection `index` of `nconns`.
void helloRaw(RawPeer* p, mk::Socket* s, uint32_t index, uint32_t nconns) {
  mk::socketInit(s, nullptr, 10000);
  ASSERT_EQ(mk::socketConnect(s, &p->addr), ncclSuccess) << mk::lastError();
  const Hello h = {kHelloMagic, p->nonce, index, nconns, kHelloInline, 0};
  ASSERT_EQ(mk::socketSend(s, &h, sizeof(h)), ncclSuccess);
}

// A recv comm of the socket backend whose peer is the raw client: nconns connections (1..3),
// sock and then helper[0..nconns-2].
void connectRaw(RawPeer* p, uint32_t nconns) {
  listenRaw(p);
  if (::testing::Test::HasFatalFailure()) return;
  for (uint32_t i = 0; i < nconns; i++) {
    helloRaw(p, i == 0 ? &p->sock : &p->helper[i - 1], i, nconns);
    if (::testing::Test::HasFatalFailure()) return;
  }
  ASSERT_EQ(mk::netAcceptBlocking(p->net.get(), p->listenComm, &p->recvComm, 10000), ncclSuccess)
      << mk::lastError();
}

// A frame and its payload on connection s.
void sendFrame(mk::Socket* s, uint64_t seq, uint64_t total, uint64_t offset, const void* data,
               uint64_t len) {
  const mk::sock::Frame f = {seq, total, offset, len, kTag, mk::sock::kFrameMagic};
  ASSERT_EQ(mk::socketSend(s, &f, sizeof(f)), ncclSuccess);
  if (len) ASSERT_EQ(mk::socketSend(s, data, len), ncclSuccess);
}

// Tests `req` until it completes or fails, bounded (10 s).
ncclResult_t waitReq(mk::Net* net, void* req, int* done, size_t* size) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    *done = 0;
    const ncclResult_t r = net->test(req, done, size);
    if (r != ncclSuccess || *done) return r;
    if (std::chrono::steady_clock::now() > end) return ncclInternalError;
    std::this_thread::yield();
  }
}

void* postRecv(RawPeer* p, void* buf, size_t cap) {
  void* d = buf;
  int tag = kTag;
  void* req = nullptr;
  EXPECT_EQ(p->net->irecv(p->recvComm, 1, &d, &cap, &tag, nullptr, &req), ncclSuccess);
  EXPECT_NE(req, nullptr);
  return req;
}

// Message 0: random bytes through the raw peer land whole (the harness speaks the protocol).
void goodMessage(RawPeer* p, std::mt19937_64* rng) {
  std::vector<uint8_t> out(1 + (*rng)() % 200), in(256, kPoison);
  for (auto& b : out) b = (uint8_t)(*rng)();
  void* req = postRecv(p, in.data(), in.size());
  ASSERT_NE(req, nullptr);
  sendFrame(&p->sock, 0, out.size(), 0, out.data(), out.size());
  int done = 0;
  size_t got = 0;
  ASSERT_EQ(waitReq(p->net.get(), req, &done, &got), ncclSuccess) << mk::lastError();
  ASSERT_EQ(done, 1);
  ASSERT_EQ(got, out.size());
  EXPECT_EQ(memcmp(in.data(), out.data(), out.size()), 0);
  for (size_t k = out.size(); k < in.size(); k++) ASSERT_EQ(in[k], kPoison) << k;
}

// Random payload bytes, none of them the poison value (so a stray write always shows).
std::vector<uint8_t> payload(std::mt19937_64* rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) {
    b = (uint8_t)(*rng)();
    if (b == kPoison) b ^= 1;
  }
  return v;
}

// The receive fails (not done, not a timeout) with an error naming the peer, and the guard
// bytes [lo, lo + loLen) and [hi, hi + hiLen) around the buffer still hold the poison.
void expectRejected(RawPeer* p, void* req, const uint8_t* lo, size_t loLen, const uint8_t* hi,
                    size_t hiLen) {
  int done = 0;
  size_t got = 0;
  const ncclResult_t r = waitReq(p->net.get(), req, &done, &got);
  EXPECT_NE(r, ncclSuccess) << "the corrupt frame was accepted (done " << done << ")";
  EXPECT_NE(r, ncclInternalError) << "no verdict within 10 s";
  EXPECT_EQ(done, 0);
  if (r != ncclSuccess && r != ncclInternalError)
    EXPECT_NE(std::string(mk::lastError()).find("peer"), std::string::npos) << mk::lastError();
  size_t bad = 0;
  for (size_t k = 0; k < loLen; k++) bad += lo[k] != kPoison;
  for (size_t k = 0; k < hiLen; k++) bad += hi[k] != kPoison;
  EXPECT_EQ(bad, 0u) << "bytes written outside the receive buffer";
}

// offset + len wraps around 2^64 to a value within total: the payload would land before the
// buffer. On the inline connection (read by the caller's test()) with nconns 1, on a helper
// connection (its own thread reads payloads straight into the buffer) with nconns 2.
void wrappedOffsetCase(uint32_t nconns) {
  mktest::ScopedEnv ifn("NCCL_SOCKET_IFNAME", "lo");
  mktest::ScopedEnv tmo("MKERNEL_NET_TIMEOUT_S", "10");
  RawPeer p;
  connectRaw(&p, nconns);
  if (::testing::Test::HasFatalFailure()) return;
  std::mt19937_64 rng(mktest::testSeed() + nconns);
  goodMessage(&p, &rng);
  if (::testing::Test::HasFatalFailure()) return;
  constexpr size_t kCap = 64, kGuard = 256;
  std::vector<uint8_t> arena(kGuard + kCap + kGuard, kPoison);
  void* req = postRecv(&p, arena.data() + kGuard, kCap);
  ASSERT_NE(req, nullptr);
  const std::vector<uint8_t> pay = payload(&rng, 32);
  mk::Socket* s = nconns == 1 ? &p.sock : &p.helper[0];
  sendFrame(s, 1, kCap, ~(uint64_t)0 - 15, pay.data(), pay.size());  // offset -16
  expectRejected(&p, req, arena.data(), kGuard, arena.data() + kGuard + kCap, kGuard);
}

TEST(SocketFrames, WrappedOffsetIsRejected) {
  wrappedOffsetCase(1);
}

TEST(SocketFrames, WrappedOffsetOnAHelperConnectionIsRejected) {
  wrappedOffsetCase(2);
}

// A later frame of a message already bound to a buffer says the message is larger than its
// first frame said (and than the buffer): its payload would land past the buffer's end.
TEST(SocketFrames, LaterFrameCannotGrowItsMessage) {
  mktest::ScopedEnv ifn("NCCL_SOCKET_IFNAME", "lo");
  mktest::ScopedEnv tmo("MKERNEL_NET_TIMEOUT_S", "10");
  RawPeer p;
  connectRaw(&p, 1);
  if (HasFatalFailure()) return;
  std::mt19937_64 rng(mktest::testSeed() + 5);
  goodMessage(&p, &rng);
  if (HasFatalFailure()) return;
  // Over kMaxChunk: the message has two frames on its one connection.
  constexpr size_t kCap = 2 * mk::sock::kMaxChunk, kGuard = 4096;
  ASSERT_EQ(mk::sock::numChunks(kCap, 1), 2u);
  std::vector<uint8_t> arena(kCap + kGuard, kPoison);
  void* req = postRecv(&p, arena.data(), kCap);
  ASSERT_NE(req, nullptr);
  const std::vector<uint8_t> pay = payload(&rng, 64);
  sendFrame(&p.sock, 1, kCap, 0, pay.data(), pay.size());         // binds the message: kCap bytes
  sendFrame(&p.sock, 1, 2 * kCap, kCap, pay.data(), pay.size());  // "2 * kCap bytes", past the end
  expectRejected(&p, req, nullptr, 0, arena.data() + kCap, kGuard);
}

// Waits up to ms for the acceptor to close `s` (EOF on a connection it never writes to).
bool closedByPeer(mk::Socket* s, int ms) {
  struct pollfd pfd = {s->fd, POLLIN, 0};
  if (poll(&pfd, 1, ms) <= 0) return false;
  char b;
  return recv(s->fd, &b, 1, MSG_DONTWAIT) == 0;
}

// Two connections of one connect() (same nonce) whose handshakes disagree on the number of
// connections: the second says index 2 of 3 while its group was opened as 2 connections. It
// must not count towards the group (a comm with a missing connection, and the stray fd owned
// by nobody); the acceptor drops it, and the group completes with a matching handshake.
TEST(SocketFrames, HandshakeDisagreeingWithItsGroupIsDropped) {
  mktest::ScopedEnv ifn("NCCL_SOCKET_IFNAME", "lo");
  mktest::ScopedEnv tmo("MKERNEL_NET_TIMEOUT_S", "10");
  RawPeer p;
  listenRaw(&p);
  if (HasFatalFailure()) return;
  helloRaw(&p, &p.sock, 0, 2);
  if (HasFatalFailure()) return;
  mk::Socket* stray = &p.helper[0];
  helloRaw(&p, stray, 2, 3);
  if (HasFatalFailure()) return;
  // Both handshakes are read within this; no comm may come out of them.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until && p.recvComm == nullptr) {
    ASSERT_EQ(p.net->accept(p.listenComm, &p.recvComm), ncclSuccess) << mk::lastError();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(p.recvComm, nullptr) << "a comm was made of a mismatched group";
  EXPECT_TRUE(closedByPeer(stray, 2000)) << "the mismatched connection was not dropped";
  if (p.recvComm) return;
  // The matching second connection completes the group; the comm carries a message.
  helloRaw(&p, &p.helper[1], 1, 2);
  if (HasFatalFailure()) return;
  ASSERT_EQ(mk::netAcceptBlocking(p.net.get(), p.listenComm, &p.recvComm, 10000), ncclSuccess)
      << mk::lastError();
  std::mt19937_64 rng(mktest::testSeed() + 2);
  goodMessage(&p, &rng);
}

// More frames for a message than its size makes (two chunks over two helper connections,
// three frames): the message must not complete while a frame bound to it is still being
// read. Helper 2 sends only the header of an extra frame (its thread binds it and waits for
// the payload); helper 1 then sends both real chunks. Were the message completed, test()
// would hand the buffer back and free the request while helper 2's thread still holds both
// (a write into a returned buffer, then a use after free). The third frame is an error.
TEST(SocketFrames, ExtraFrameForAMessageIsRejected) {
  mktest::ScopedEnv ifn("NCCL_SOCKET_IFNAME", "lo");
  mktest::ScopedEnv tmo("MKERNEL_NET_TIMEOUT_S", "10");
  RawPeer p;
  connectRaw(&p, 3);
  if (HasFatalFailure()) return;
  std::mt19937_64 rng(mktest::testSeed() + 4);
  goodMessage(&p, &rng);
  if (HasFatalFailure()) return;
  constexpr size_t kCap = 2 * mk::sock::kMaxChunk, kGuard = 4096;
  ASSERT_EQ(mk::sock::numChunks(kCap, 2), 2u);
  const size_t cb = mk::sock::chunkBytes(kCap, 2);
  std::vector<uint8_t> arena(kCap + kGuard, kPoison);
  void* req = postRecv(&p, arena.data(), kCap);
  ASSERT_NE(req, nullptr);
  const std::vector<uint8_t> pay = payload(&rng, 64);
  const mk::sock::Frame extra = {1, kCap, 0, pay.size(), kTag, mk::sock::kFrameMagic};
  ASSERT_EQ(mk::socketSend(&p.helper[1], &extra, sizeof(extra)), ncclSuccess);  // payload withheld
  std::this_thread::sleep_for(std::chrono::milliseconds(200));                  // helper 2 binds it
  sendFrame(&p.helper[0], 1, kCap, 0, pay.data(), pay.size());
  sendFrame(&p.helper[0], 1, kCap, cb, pay.data(), pay.size());
  expectRejected(&p, req, nullptr, 0, arena.data() + kCap, kGuard);
}

}  // namespace
