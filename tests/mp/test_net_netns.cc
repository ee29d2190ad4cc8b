// One side of the socket-backend test across two network namespaces joined by a veth
// pair, driven by tests/fault/netns_test.sh (which creates the namespaces, runs a
// "server" in one and a "client" in the other, and takes the link down mid-transfer).
// Skipped unless MKNET_NETNS_ROLE is set, so it is inert in ordinary test runs.
//   phase 1: 16 messages of 8 MiB, checked byte for byte;
//   phase 2: an endless stream; the script downs the link; both sides must fail with
//            ncclRemoteError within the timeout (MKERNEL_NET_TIMEOUT_S) + slack.
#include <cstdint>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/debug.h"
#include "base/param.h"
#include "transport/net.h"

namespace {

bool fileExists(const std::string& p) {
  return access(p.c_str(), F_OK) == 0;
}

void touch(const std::string& p) {
  std::ofstream(p) << "1\n";
}

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TEST(NetNs, Role) {
  const char* role = getenv("MKNET_NETNS_ROLE");
  const char* dirEnv = getenv("MKNET_NETNS_DIR");
  if (!role || !dirEnv) GTEST_SKIP() << "driven by tests/fault/netns_test.sh only";
  std::string dir = dirEnv;
  bool server = std::string(role) == "server";
  mk::paramReset();
  std::unique_ptr<mk::Net> net;
  ASSERT_EQ(mk::netCreateSocket(&net), ncclSuccess) << mk::lastError();
  const size_t kMsg = 8u << 20;
  std::vector<uint8_t> buf(kMsg);
  void* comm = nullptr;
  void* listenComm = nullptr;
  char handle[mk::kNetHandleSize];
  std::string hfile = dir + "/handle";
  if (server) {
    ASSERT_EQ(net->listen(0, handle, &listenComm), ncclSuccess);
    {
      std::ofstream f(hfile + ".tmp", std::ios::binary);
      f.write(handle, sizeof(handle));
    }
    rename((hfile + ".tmp").c_str(), hfile.c_str());
    ASSERT_EQ(mk::netAcceptBlocking(net.get(), listenComm, &comm, 30000), ncclSuccess);
  } else {
    auto t0 = std::chrono::steady_clock::now();
    while (!fileExists(hfile) && since(t0) < 30) usleep(10000);
    std::ifstream f(hfile, std::ios::binary);
    f.read(handle, sizeof(handle));
    ASSERT_TRUE(f.good());
    ASSERT_EQ(mk::netConnectBlocking(net.get(), 0, handle, &comm, 30000), ncclSuccess);
  }
  // Phase 1: a clean transfer across the namespaces.
  for (int m = 0; m < 16; m++) {
    void* req = nullptr;
    void* data = buf.data();
    size_t size = kMsg;
    int tag = m;
    if (server) {
      while (!req) ASSERT_EQ(net->irecv(comm, 1, &data, &size, &tag, nullptr, &req), ncclSuccess);
      size_t got = 0;
      ASSERT_EQ(mk::netWaitRequest(net.get(), req, &got, 30000), ncclSuccess) << mk::lastError();
      ASSERT_EQ(got, kMsg);
      for (size_t i = 0; i < kMsg; i += 4093) ASSERT_EQ(buf[i], (uint8_t)(i + m)) << i;
    } else {
      for (size_t i = 0; i < kMsg; i++) buf[i] = (uint8_t)(i + m);
      while (!req) ASSERT_EQ(net->isend(comm, data, size, tag, nullptr, &req), ncclSuccess);
      ASSERT_EQ(mk::netWaitRequest(net.get(), req, nullptr, 30000), ncclSuccess) << mk::lastError();
    }
  }
  printf("[ netns    ] %s: phase 1 (16 x 8 MiB) ok\n", role);
  fflush(stdout);
  touch(dir + "/phase2." + role);
  // Phase 2: stream until the link goes down, then the error must come within bound.
  std::string down = dir + "/linkdown";
  auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point downAt{};
  bool sawDown = false;
  ncclResult_t res = ncclSuccess;
  while (res == ncclSuccess && since(start) < 120) {
    void* req = nullptr;
    void* data = buf.data();
    size_t size = kMsg;
    int tag = 0;
    res = server ? net->irecv(comm, 1, &data, &size, &tag, nullptr, &req)
                 : net->isend(comm, data, size, tag, nullptr, &req);
    if (res != ncclSuccess || !req) continue;
    for (int done = 0; res == ncclSuccess && !done;) {
      res = net->test(req, &done, nullptr);
      if (!sawDown && fileExists(down)) sawDown = true, downAt = std::chrono::steady_clock::now();
      if (!done) usleep(200);
    }
  }
  double after = sawDown ? since(downAt) : -1;
  printf("[ netns    ] %s: result %d after link down +%.1f s: %s\n", role, (int)res, after,
         mk::lastError());
  EXPECT_TRUE(sawDown) << "the stream ended before the link went down";
  EXPECT_EQ(res, ncclRemoteError);
  double bound = mk::netTimeoutMs() / 1000.0 * 3 + 10;
  EXPECT_LT(after, bound);
  // Leave without closing gracefully: the peer is unreachable anyway.
  if (server)
    net->closeRecv(comm), net->closeListen(listenComm);
  else
    net->closeSend(comm);
}
