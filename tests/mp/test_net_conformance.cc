// Net conformance between two processes, run against the socket backend directly and
// through libnccl-net-mkernel.so loaded by our plugin loader with each ABI version
// (v8..v11): connect/accept, tags, multi-receive, large and zero-byte messages, many
// outstanding sends (flow control), and peer death.
#include <cstdint>
#include <functional>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/checks.h"
#include "base/debug.h"
#include "base/param.h"
#include "mp/test_net_harness.inl"
#include "transport/net.h"

namespace {

using mk::Net;
using mknet::Ctx;

std::string pluginPath() {
  return std::string(MK_BUILD_DIR) + "/plugin/libnccl-net-mkernel.so";
}

void useLoopback() {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("MKERNEL_NET", "socket", 1);  // what our plugin picks inside
  setenv("MKERNEL_NET_TIMEOUT_S", "10", 1);
  mk::paramReset();
}

// "socket" or "plugin-vN".
ncclResult_t makeNet(const std::string& kind, std::unique_ptr<Net>* net) {
  if (kind == "socket") return mk::netCreateSocket(net);
  int v = atoi(kind.c_str() + strlen("plugin-v"));
  return mk::netLoadPluginVersion(pluginPath().c_str(), v, net);
}

// Rank 1 listens and receives, rank 0 connects and sends.
struct Pair {
  std::unique_ptr<Net> net;
  void* listenComm = nullptr;
  void* comm = nullptr;  // send comm on rank 0, recv comm on rank 1
  bool sender = false;

  ncclResult_t setup(const Ctx& ctx, const std::string& kind) {
    NCCLCHECK(makeNet(kind, &net));
    sender = ctx.rank == 0;
    std::vector<char> send(2 * mk::kNetHandleSize, 0), recv(2 * mk::kNetHandleSize, 0);
    if (!sender) NCCLCHECK(net->listen(0, &send[0], &listenComm));  // block 0: for rank 0
    NCCLCHECK(mknet::hubAllToAll(ctx, send.data(), recv.data(), mk::kNetHandleSize));
    if (sender)
      NCCLCHECK(mk::netConnectBlocking(net.get(), 0, &recv[1 * mk::kNetHandleSize], &comm, 10000));
    else
      NCCLCHECK(mk::netAcceptBlocking(net.get(), listenComm, &comm, 10000));
    return ncclSuccess;
  }
  ~Pair() {
    if (comm) sender ? net->closeSend(comm) : net->closeRecv(comm);
    if (listenComm) net->closeListen(listenComm);
  }
};

uint8_t pattern(size_t i, int salt) {
  return (uint8_t)((i * 131 + salt * 7 + (i >> 12)) & 0xff);
}

void fill(std::vector<uint8_t>& b, int salt) {
  for (size_t i = 0; i < b.size(); i++) b[i] = pattern(i, salt);
}
bool check(const uint8_t* b, size_t n, int salt) {
  for (size_t i = 0; i < n; i++)
    if (b[i] != pattern(i, salt)) return false;
  return true;
}

ncclResult_t sendOne(Net* net, void* comm, const void* data, size_t size, int tag) {
  void* req = nullptr;
  while (!req) NCCLCHECK(net->isend(comm, const_cast<void*>(data), size, tag, nullptr, &req));
  return mk::netWaitRequest(net, req, nullptr, 20000);
}
ncclResult_t recvOne(Net* net, void* comm, void* data, size_t size, int tag, size_t* got) {
  void* req = nullptr;
  while (!req) NCCLCHECK(net->irecv(comm, 1, &data, &size, &tag, nullptr, &req));
  return mk::netWaitRequest(net, req, got, 20000);
}

class NetConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    useLoopback();
    if (GetParam() != "socket" && access(pluginPath().c_str(), R_OK) != 0)
      GTEST_SKIP() << pluginPath() << " not built (build target nccl-net-mkernel)";
  }
  void run(const std::function<void(Pair&, const Ctx&)>& body, bool senderKilled = false,
           int timeoutSec = 60) {
    std::string kind = GetParam();
    auto codes = mknet::runRanks(
        2,
        [&](const Ctx& ctx) {
          Pair p;
          ncclResult_t res = p.setup(ctx, kind);
          EXPECT_EQ(res, ncclSuccess) << mk::lastError();
          if (res != ncclSuccess) return 2;
          body(p, ctx);
          return 0;
        },
        timeoutSec);
    EXPECT_EQ(codes[0], senderKilled ? 128 + SIGKILL : 0);
    EXPECT_EQ(codes[1], 0);
  }
};

TEST_P(NetConformance, PropertiesAndConnect) {
  std::unique_ptr<Net> net;
  ASSERT_EQ(makeNet(GetParam(), &net), ncclSuccess) << mk::lastError();
  int ndev = 0;
  ASSERT_EQ(net->devices(&ndev), ncclSuccess);
  ASSERT_GE(ndev, 1);
  mk::NetProperties props;
  ASSERT_EQ(net->getProperties(0, &props), ncclSuccess);
  EXPECT_EQ(props.name, "lo");
  EXPECT_TRUE(props.ptrSupport & NCCL_PTR_HOST);
  EXPECT_GE(props.maxRecvs, 1);
  run([](Pair& p, const Ctx&) {
    int x = 0x1234;
    if (p.sender) {
      EXPECT_EQ(sendOne(p.net.get(), p.comm, &x, sizeof(x), 1), ncclSuccess);
    } else {
      int y = 0;
      size_t got = 0;
      EXPECT_EQ(recvOne(p.net.get(), p.comm, &y, sizeof(y), 1, &got), ncclSuccess);
      EXPECT_EQ(y, 0x1234);
      EXPECT_EQ(got, sizeof(int));
    }
  });
}

TEST_P(NetConformance, TagsSizesAndZeroBytes) {
  run([](Pair& p, const Ctx&) {
    const size_t sizes[] = {0, 1, 7, 4096, 4097, 100000, 1 << 20, 0, 3 << 20};
    for (int i = 0; i < (int)(sizeof(sizes) / sizeof(sizes[0])); i++) {
      std::vector<uint8_t> buf(sizes[i] + 16);
      if (p.sender) {
        fill(buf, i);
        ASSERT_EQ(sendOne(p.net.get(), p.comm, buf.data(), sizes[i], 100 + i), ncclSuccess);
      } else {
        size_t got = 12345;
        // Posted larger than the message: the real size comes back from test().
        ASSERT_EQ(recvOne(p.net.get(), p.comm, buf.data(), buf.size(), 100 + i, &got), ncclSuccess)
            << mk::lastError();
        EXPECT_EQ(got, sizes[i]);
        EXPECT_TRUE(check(buf.data(), sizes[i], i)) << "message " << i;
      }
    }
  });
}

TEST_P(NetConformance, MultiReceiveMatchesTags) {
  std::unique_ptr<Net> probe;
  ASSERT_EQ(makeNet(GetParam(), &probe), ncclSuccess);
  mk::NetProperties props;
  ASSERT_EQ(probe->getProperties(0, &props), ncclSuccess);
  if (props.maxRecvs < 3) GTEST_SKIP() << "backend has maxRecvs " << props.maxRecvs;
  run([](Pair& p, const Ctx&) {
    const int sendTags[3] = {7, 3, 5};
    const size_t sendSizes[3] = {1000, 200000, 0};
    if (p.sender) {
      std::vector<std::vector<uint8_t>> bufs(3);
      void* reqs[3] = {};
      for (int i = 0; i < 3; i++) {
        bufs[i].resize(sendSizes[i]);
        fill(bufs[i], sendTags[i]);
        while (!reqs[i])
          ASSERT_EQ(
              p.net->isend(p.comm, bufs[i].data(), sendSizes[i], sendTags[i], nullptr, &reqs[i]),
              ncclSuccess);
      }
      for (int i = 0; i < 3; i++)
        ASSERT_EQ(mk::netWaitRequest(p.net.get(), reqs[i], nullptr, 20000), ncclSuccess);
    } else {
      int tags[3] = {3, 5, 7};
      std::vector<uint8_t> b[3];
      void* data[3];
      size_t sizes[3];
      for (int i = 0; i < 3; i++)
        b[i].assign(300000, 0xee), data[i] = b[i].data(), sizes[i] = 300000;
      void* req = nullptr;
      while (!req)
        ASSERT_EQ(p.net->irecv(p.comm, 3, data, sizes, tags, nullptr, &req), ncclSuccess);
      size_t got[3] = {};
      ASSERT_EQ(mk::netWaitRequest(p.net.get(), req, got, 20000), ncclSuccess) << mk::lastError();
      EXPECT_EQ(got[0], 200000u);  // tag 3
      EXPECT_EQ(got[1], 0u);       // tag 5
      EXPECT_EQ(got[2], 1000u);    // tag 7
      EXPECT_TRUE(check(b[0].data(), 200000, 3));
      EXPECT_TRUE(check(b[2].data(), 1000, 7));
    }
  });
}

TEST_P(NetConformance, Large64MiB) {
  run([](Pair& p, const Ctx&) {
    const size_t n = 64u << 20;
    std::vector<uint8_t> buf(n);
    void* mh = nullptr;
    ASSERT_EQ(p.net->regMr(p.comm, buf.data(), n, NCCL_PTR_HOST, &mh), ncclSuccess);
    if (p.sender) {
      fill(buf, 42);
      void* req = nullptr;
      while (!req) ASSERT_EQ(p.net->isend(p.comm, buf.data(), n, 9, mh, &req), ncclSuccess);
      ASSERT_EQ(mk::netWaitRequest(p.net.get(), req, nullptr, 30000), ncclSuccess);
    } else {
      void* data = buf.data();
      size_t size = n;
      int tag = 9;
      void* req = nullptr;
      while (!req) ASSERT_EQ(p.net->irecv(p.comm, 1, &data, &size, &tag, &mh, &req), ncclSuccess);
      size_t got = 0;
      ASSERT_EQ(mk::netWaitRequest(p.net.get(), req, &got, 30000), ncclSuccess);
      EXPECT_EQ(got, n);
      EXPECT_TRUE(check(buf.data(), n, 42));
      void* freq = nullptr;
      int isz = (int)n;
      EXPECT_EQ(p.net->iflush(p.comm, 1, &data, &isz, &mh, &freq), ncclSuccess);
      if (freq) EXPECT_EQ(mk::netWaitRequest(p.net.get(), freq, nullptr, 10000), ncclSuccess);
    }
    EXPECT_EQ(p.net->deregMr(p.comm, mh), ncclSuccess);
  });
}

// Many sends posted before the receiver posts anything: nothing is lost or reordered,
// and a full backend answers "busy" (NULL request) instead of failing.
TEST_P(NetConformance, ManyOutstandingSends) {
  run([](Pair& p, const Ctx&) {
    const int kMsgs = 400;
    const size_t kSize = 16384;
    std::vector<std::vector<uint8_t>> bufs(kMsgs, std::vector<uint8_t>(kSize));
    std::vector<void*> reqs(kMsgs, nullptr);
    if (p.sender) {
      int posted = 0;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (posted < kMsgs && std::chrono::steady_clock::now() < deadline) {
        fill(bufs[posted], posted);
        ASSERT_EQ(p.net->isend(p.comm, bufs[posted].data(), kSize, 1, nullptr, &reqs[posted]),
                  ncclSuccess);
        if (reqs[posted])
          posted++;
        else
          std::this_thread::yield();
      }
      ASSERT_EQ(posted, kMsgs);
      for (int i = 0; i < kMsgs; i++)
        ASSERT_EQ(mk::netWaitRequest(p.net.get(), reqs[i], nullptr, 20000), ncclSuccess);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let sends pile up
      int posted = 0, completed = 0;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (completed < kMsgs && std::chrono::steady_clock::now() < deadline) {
        if (posted < kMsgs) {
          void* data = bufs[posted].data();
          size_t size = kSize;
          int tag = 1;
          ASSERT_EQ(p.net->irecv(p.comm, 1, &data, &size, &tag, nullptr, &reqs[posted]),
                    ncclSuccess);
          if (reqs[posted]) posted++;
        }
        if (completed < posted) {
          int done = 0;
          ASSERT_EQ(p.net->test(reqs[completed], &done, nullptr), ncclSuccess);
          if (done) {
            EXPECT_TRUE(check(bufs[completed].data(), kSize, completed)) << completed;
            completed++;
          }
        }
      }
      EXPECT_EQ(completed, kMsgs);
    }
  });
}

// The sender dies (SIGKILL) with a receive pending: the receiver's test() fails with
// ncclRemoteError, a message naming the peer, well within the timeout.
TEST_P(NetConformance, PeerDeathDetected) {
  run(
      [](Pair& p, const Ctx&) {
        if (p.sender) {
          int x = 1;
          EXPECT_EQ(sendOne(p.net.get(), p.comm, &x, sizeof(x), 1), ncclSuccess);
          usleep(100000);
          kill(getpid(), SIGKILL);
        }
        std::vector<uint8_t> buf(1 << 20);
        size_t got = 0;
        ASSERT_EQ(recvOne(p.net.get(), p.comm, buf.data(), 4, 1, &got), ncclSuccess);
        auto t0 = std::chrono::steady_clock::now();
        ncclResult_t res = recvOne(p.net.get(), p.comm, buf.data(), buf.size(), 1, &got);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_EQ(res, ncclRemoteError);
        EXPECT_LT(s, 10.0);
        EXPECT_NE(std::string(mk::lastError()).find("peer"), std::string::npos) << mk::lastError();
      },
      /*senderKilled=*/true);
}

INSTANTIATE_TEST_SUITE_P(Backends, NetConformance,
                         ::testing::Values("socket", "plugin-v8", "plugin-v9", "plugin-v10",
                                           "plugin-v11"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
