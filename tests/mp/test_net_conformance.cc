// Net conformance between two processes, run against the socket backend directly and
// through libnccl-net-mkernel.so loaded by our plugin loader with each ABI version
// (v8..v11): connect/accept, tags, multi-receive, large and zero-byte messages, many
// outstanding sends (flow control), and peer death; and the flush ordering (data received
// into GPU memory is read, and signals about it applied, only after its iflush completed),
// checked through a model of GPUDirect visibility layered on every backend.
#include <cstdint>
#include <functional>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/checks.h"
#include "base/debug.h"
#include "base/param.h"
#include "mp/test_net_harness.inl"
#include "transport/net.h"
#include "transport/proxy.h"

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

// "socket", "socket-1conn" (MKERNEL_SOCKET_NCONNS=1: every message on the caller-driven
// connection, no helper thread), "socket-helpers" (MKERNEL_SOCKET_INLINE=0: helper threads
// on every connection) or "plugin-vN".
ncclResult_t makeNet(const std::string& kind, std::unique_ptr<Net>* net) {
  if (kind.rfind("socket", 0) == 0) return mk::netCreateSocket(net);
  int v = atoi(kind.c_str() + strlen("plugin-v"));
  return mk::netLoadPluginVersion(pluginPath().c_str(), v, net);
}

// A model of GPUDirect RDMA visibility layered on a real backend. Receives into buffers
// registered as NCCL_PTR_CUDA land in a private staging copy and reach the buffer only
// when a later iflush on that comm completes: data a NIC wrote into GPU memory may not be
// seen by the GPU before a flush, and a flush covers every receive completed before it.
// Whoever reads received data (or applies a signal about it) without a completed flush
// finds the old bytes. Host-registered buffers behave as the backend does.
class GpuVisibilityNet : public Net {
 public:
  explicit GpuVisibilityNet(std::unique_ptr<Net> inner) : in_(std::move(inner)) {}
  std::atomic<int> flushes{0};
  std::atomic<int> badFlushes{0};  // iflush naming a buffer outside its registration

  const char* name() const override { return "gpu-visibility-model"; }
  ncclResult_t devices(int* n) override { return in_->devices(n); }
  ncclResult_t getProperties(int dev, mk::NetProperties* p) override {
    NCCLCHECK(in_->getProperties(dev, p));
    p->ptrSupport |= NCCL_PTR_CUDA;
    return ncclSuccess;
  }
  ncclResult_t listen(int dev, void* h, void** l) override { return in_->listen(dev, h, l); }
  ncclResult_t connect(int dev, void* h, void** c) override { return in_->connect(dev, h, c); }
  ncclResult_t accept(void* l, void** c) override { return in_->accept(l, c); }
  ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mh) override {
    std::unique_ptr<Mh> m(new Mh{nullptr, type == NCCL_PTR_CUDA, static_cast<char*>(data), size});
    NCCLCHECK(in_->regMr(comm, data, size, NCCL_PTR_HOST, &m->inner));
    *mh = m.release();
    return ncclSuccess;
  }
  ncclResult_t regMrDmaBuf(void*, void*, size_t, int, uint64_t, int, void**) override {
    return ncclInvalidUsage;
  }
  ncclResult_t deregMr(void* comm, void* mh) override {
    Mh* m = static_cast<Mh*>(mh);
    ncclResult_t res = m ? in_->deregMr(comm, m->inner) : ncclSuccess;
    delete m;
    return res;
  }
  ncclResult_t isend(void* comm, void* data, size_t size, int tag, void* mh,
                     void** request) override {
    void* r = nullptr;
    NCCLCHECK(in_->isend(comm, data, size, tag, mh ? static_cast<Mh*>(mh)->inner : nullptr, &r));
    *request = r ? new Req{Req::kSend, r, comm} : nullptr;
    return ncclSuccess;
  }
  ncclResult_t irecv(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs,
                     void** request) override {
    std::unique_ptr<Req> r(new Req{Req::kRecv, nullptr, comm});
    r->n = n;
    void* idata[mk::kNetMaxRecvs];
    void* imh[mk::kNetMaxRecvs];
    for (int i = 0; i < n; i++) {
      Mh* m = mhs ? static_cast<Mh*>(mhs[i]) : nullptr;
      idata[i] = data[i];
      imh[i] = m ? m->inner : nullptr;
      if (m && m->gpu) {
        r->stage[i].assign(sizes[i], 0);
        r->dst[i] = static_cast<char*>(data[i]);
        idata[i] = r->stage[i].data();
        imh[i] = nullptr;
      }
    }
    *request = nullptr;
    NCCLCHECK(in_->irecv(comm, n, idata, sizes, tags, imh, &r->inner));
    if (r->inner) *request = r.release();
    return ncclSuccess;
  }
  ncclResult_t iflush(void* comm, int n, void** data, int* sizes, void** mhs,
                      void** request) override {
    *request = nullptr;
    bool gpu = false;
    for (int i = 0; i < n; i++) {
      Mh* m = mhs ? static_cast<Mh*>(mhs[i]) : nullptr;
      if (!m || !m->gpu || sizes[i] <= 0) continue;
      gpu = true;
      char* p = static_cast<char*>(data[i]);
      if (p < m->base || p + sizes[i] > m->base + m->size) badFlushes++;
    }
    if (!gpu) return ncclSuccess;
    flushes++;
    Req* f = new Req{Req::kFlush, nullptr, comm};
    std::lock_guard<std::mutex> lk(mu_);
    f->publish.swap(landed_[comm]);
    *request = f;
    return ncclSuccess;
  }
  ncclResult_t test(void* request, int* done, size_t* sizes) override {
    Req* r = static_cast<Req*>(request);
    *done = 0;
    if (r->kind == Req::kFlush) {
      if (++r->polls < 2) return ncclSuccess;  // completes asynchronously, like a READ
      for (Landed& l : r->publish) memcpy(l.dst, l.bytes.data(), l.bytes.size());
      delete r;
      *done = 1;
      return ncclSuccess;
    }
    size_t got[mk::kNetMaxRecvs] = {};
    ncclResult_t res = in_->test(r->inner, done, got);
    if (res != ncclSuccess || !*done) {
      if (res != ncclSuccess) delete r;  // the backend freed its request
      return res;
    }
    int n = r->kind == Req::kSend ? 1 : r->n;
    if (sizes) memcpy(sizes, got, n * sizeof(size_t));
    std::lock_guard<std::mutex> lk(mu_);
    for (int i = 0; r->kind == Req::kRecv && i < n; i++) {
      if (!r->dst[i]) continue;
      r->stage[i].resize(got[i]);
      landed_[r->comm].push_back(Landed{r->dst[i], std::move(r->stage[i])});
    }
    delete r;
    return ncclSuccess;
  }
  ncclResult_t closeSend(void* c) override { return in_->closeSend(c); }
  ncclResult_t closeRecv(void* c) override {
    std::lock_guard<std::mutex> lk(mu_);
    landed_.erase(c);
    return in_->closeRecv(c);
  }
  ncclResult_t closeListen(void* l) override { return in_->closeListen(l); }

 private:
  struct Mh {
    void* inner;
    bool gpu;
    char* base;
    size_t size;
  };
  struct Landed {  // received, not yet visible
    char* dst;
    std::vector<char> bytes;
  };
  struct Req {
    enum Kind { kSend, kRecv, kFlush } kind;
    void* inner;
    void* comm;
    int n = 0;
    char* dst[mk::kNetMaxRecvs] = {};
    std::vector<char> stage[mk::kNetMaxRecvs];
    std::vector<Landed> publish;  // flush: what becomes visible when it completes
    int polls = 0;
  };
  std::unique_ptr<Net> in_;
  std::mutex mu_;
  std::map<void*, std::vector<Landed>> landed_;
};

// Rank 1 listens and receives, rank 0 connects and sends.
struct Pair {
  std::unique_ptr<Net> net;
  void* listenComm = nullptr;
  void* comm = nullptr;  // send comm on rank 0, recv comm on rank 1
  bool sender = false;

  // gpuModel: the backend under GpuVisibilityNet.
  ncclResult_t setup(const Ctx& ctx, const std::string& kind, bool gpuModel = false) {
    NCCLCHECK(makeNet(kind, &net));
    if (gpuModel) net.reset(new GpuVisibilityNet(std::move(net)));
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
    if (GetParam() == "socket-1conn")
      setenv("MKERNEL_SOCKET_NCONNS", "1", 1);
    else
      unsetenv("MKERNEL_SOCKET_NCONNS");
    if (GetParam() == "socket-helpers")
      setenv("MKERNEL_SOCKET_INLINE", "0", 1);
    else
      unsetenv("MKERNEL_SOCKET_INLINE");
    useLoopback();
    if (GetParam().rfind("socket", 0) != 0 && access(pluginPath().c_str(), R_OK) != 0)
      GTEST_SKIP() << pluginPath() << " not built (build target nccl-net-mkernel)";
  }
  void TearDown() override {
    unsetenv("MKERNEL_SOCKET_NCONNS");
    unsetenv("MKERNEL_SOCKET_INLINE");
    mk::paramReset();
  }
  void run(const std::function<void(Pair&, const Ctx&)>& body, bool senderKilled = false,
           int timeoutSec = 60, bool gpuModel = false) {
    std::string kind = GetParam();
    auto codes = mknet::runRanks(
        2,
        [&](const Ctx& ctx) {
          Pair p;
          ncclResult_t res = p.setup(ctx, kind, gpuModel);
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

// The NCCL order on the receive side: test() done, then iflush, then the data may be read.
// Through the visibility model on this backend: after test() the GPU buffer still holds
// its old bytes (so the model can catch a missing flush), after the flush the new ones;
// host buffers need no flush (NULL request). Also: iflush of the backend itself accepts a
// completed receive and either has nothing to do or completes.
TEST_P(NetConformance, ReceiveFlushThenRead) {
  const uint64_t seed = std::random_device()();
  run(
      [seed](Pair& p, const Ctx&) {
        std::mt19937_64 rng(seed);
        const int kMsgs = 6;
        for (int m = 0; m < kMsgs; m++) {
          size_t n = 1 + rng() % 300000;
          std::vector<uint8_t> want(n);
          for (auto& b : want) b = (uint8_t)rng();
          std::vector<uint8_t> buf(n);
          bool gpu = m % 3 != 2;  // every third message goes to a host buffer
          void* mh = nullptr;
          ASSERT_EQ(p.net->regMr(p.comm, buf.data(), n, gpu ? NCCL_PTR_CUDA : NCCL_PTR_HOST, &mh),
                    ncclSuccess);
          if (p.sender) {
            buf = want;
            void* req = nullptr;
            while (!req) ASSERT_EQ(p.net->isend(p.comm, buf.data(), n, 5, mh, &req), ncclSuccess);
            ASSERT_EQ(mk::netWaitRequest(p.net.get(), req, nullptr, 20000), ncclSuccess);
          } else {
            memset(buf.data(), 0xee, n);
            void* data = buf.data();
            size_t size = n;
            int tag = 5;
            void* req = nullptr;
            while (!req)
              ASSERT_EQ(p.net->irecv(p.comm, 1, &data, &size, &tag, &mh, &req), ncclSuccess);
            size_t got = 0;
            ASSERT_EQ(mk::netWaitRequest(p.net.get(), req, &got, 20000), ncclSuccess)
                << mk::lastError();
            ASSERT_EQ(got, n);
            size_t stale = 0;
            for (size_t i = 0; i < n; i++) stale += buf[i] == 0xee;
            if (gpu) EXPECT_EQ(stale, n) << "message " << m << " visible before its flush";
            int isz = (int)n;
            void* freq = nullptr;
            ASSERT_EQ(p.net->iflush(p.comm, 1, &data, &isz, &mh, &freq), ncclSuccess);
            EXPECT_EQ(freq != nullptr, gpu) << "message " << m;
            if (freq) ASSERT_EQ(mk::netWaitRequest(p.net.get(), freq, nullptr, 10000), ncclSuccess);
            EXPECT_EQ(memcmp(buf.data(), want.data(), n), 0) << "message " << m;
            auto* model = static_cast<GpuVisibilityNet*>(p.net.get());
            EXPECT_EQ(model->badFlushes.load(), 0);
          }
          ASSERT_EQ(p.net->deregMr(p.comm, mh), ncclSuccess);
        }
      },
      /*senderKilled=*/false, /*timeoutSec=*/60, /*gpuModel=*/true);
}

// The proxy over this backend with a GPU destination window (visibility model): a signal
// is applied only after a flush that covers every chunk landed before it. Each round, rank
// 0 puts two regions then sends a plain signal (no bytes of its own: a flush of only the
// signal's own data would miss the puts), then a put_signal; rank 1 checks the regions as
// soon as each signal shows, and a barrier holds the next round (and its flushes) back
// until it has.
TEST_P(NetConformance, ProxyAppliesSignalsOnlyAfterFlush) {
  const uint64_t seed = std::random_device()();
  std::string kind = GetParam();
  auto codes = mknet::runRanks(
      2,
      [&](const Ctx& ctx) {
        std::unique_ptr<Net> inner;
        EXPECT_EQ(makeNet(kind, &inner), ncclSuccess) << mk::lastError();
        if (!inner) return 2;
        auto* model = new GpuVisibilityNet(std::move(inner));
        std::unique_ptr<Net> net(model);
        const size_t kWindow = 256 << 10;
        std::vector<uint8_t> sendBuf(kWindow), recvBuf(kWindow, 0xee);
        std::vector<uint64_t> signals(2, 0);
        mk::ProxyRing* ringp = nullptr;
        EXPECT_EQ(mk::ProxyRing::create(64, mk::ProxyRingMem::kHost, &ringp), ncclSuccess);
        if (!ringp) return 2;
        std::unique_ptr<mk::ProxyRing> ring(ringp);
        mk::ProxyConfig cfg;
        cfg.rank = ctx.rank;
        cfg.nranks = 2;
        cfg.peers = {1 - ctx.rank};
        cfg.net = net.get();
        cfg.rings = {ring.get()};
        cfg.sendBuf = sendBuf.data();
        cfg.sendBytes = kWindow;
        cfg.recvBuf = recvBuf.data();
        cfg.recvBytes = kWindow;
        cfg.bufType = NCCL_PTR_CUDA;
        cfg.signals = signals.data();
        cfg.nSignals = signals.size();
        cfg.pinThread = false;
        cfg.alltoall = [ctx](const void* s, void* d, size_t b) {
          return mknet::hubAllToAll(ctx, s, d, b);
        };
        mk::Proxy* proxy = nullptr;
        EXPECT_EQ(mk::proxyCreate(cfg, &proxy), ncclSuccess) << mk::lastError();
        if (!proxy) return 2;
        auto waitSignal = [&](int slot, uint64_t v) {
          auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
          while (__atomic_load_n(&signals[slot], __ATOMIC_ACQUIRE) < v) {
            std::string msg;
            if (mk::proxyGetAsyncError(proxy, &msg) != ncclSuccess) return "proxy error: " + msg;
            if (std::chrono::steady_clock::now() > deadline) return std::string("timeout");
            std::this_thread::yield();
          }
          return std::string();
        };
        auto mismatches = [&](size_t off, size_t len) {
          size_t bad = 0;
          for (size_t i = off; i < off + len; i++) bad += recvBuf[i] != sendBuf[i];
          return bad;
        };
        std::mt19937_64 rng(seed);
        const int kRounds = 10;
        int rc = 0;
        for (uint64_t k = 1; k <= (uint64_t)kRounds && rc == 0; k++) {
          size_t a = 1 + rng() % 60000, b = 1 + rng() % 60000, c = 1 + rng() % 60000;
          for (size_t i = 0; i < a + b + c; i++) sendBuf[i] = (uint8_t)rng();  // both ranks
          if (ctx.rank == 0) {
            EXPECT_EQ(ring->put(1, 0, 0, a, 20000), ncclSuccess);
            EXPECT_EQ(ring->put(1, a, a, b, 20000), ncclSuccess);
            EXPECT_EQ(ring->signal(1, 0, k, mk::kSignalSet, 20000), ncclSuccess);
            if (mknet::hubBarrier(ctx) != ncclSuccess) rc = 3;
            EXPECT_EQ(ring->putSignal(1, a + b, a + b, c, 1, k, mk::kSignalSet, 20000),
                      ncclSuccess);
            if (rc == 0 && mknet::hubBarrier(ctx) != ncclSuccess) rc = 3;
          } else {
            std::string err = waitSignal(0, k);
            EXPECT_EQ(err, "") << "round " << k;
            EXPECT_EQ(mismatches(0, a + b), 0u) << "round " << k << ": plain signal before the "
                                                << (a + b) << " bytes of the puts were flushed";
            if (mknet::hubBarrier(ctx) != ncclSuccess) rc = 3;
            err = waitSignal(1, k);
            EXPECT_EQ(err, "") << "round " << k;
            EXPECT_EQ(mismatches(a + b, c), 0u) << "round " << k << ": put_signal before flush";
            if (rc == 0 && mknet::hubBarrier(ctx) != ncclSuccess) rc = 3;
          }
          if (::testing::Test::HasFailure()) rc = rc ? rc : 1;
        }
        if (ctx.rank == 1) {
          EXPECT_GE(model->flushes.load(), kRounds);
          EXPECT_EQ(model->badFlushes.load(), 0);
        }
        // Checked before the barrier: once past it the peer may close, and the proxy has no
        // graceful close (it reports the peer's hang-up).
        std::string msg;
        EXPECT_EQ(mk::proxyGetAsyncError(proxy, &msg), ncclSuccess) << msg;
        mknet::hubBarrier(ctx);  // neither side closes while the other still receives
        mk::proxyDestroy(proxy);
        return rc;
      },
      120);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

// A small message on the caller-driven connection costs one recv() that returns data: the
// frame header and its payload arrive together and are read together (it took two, header
// then payload, before the socket backend read ahead). One message in flight at a time, so
// that each is counted on its own; sizes drawn afresh, every byte checked. Backends that do
// not count (plugins, helper threads only) check the data alone.
TEST_P(NetConformance, SmallMessageOneReceiveCall) {
  run([](Pair& p, const Ctx& ctx) {
    constexpr int kMsgs = 40;
    constexpr size_t kMax = 4096;
    std::mt19937 rng(std::random_device{}());
    std::vector<uint8_t> buf(kMax + 64);
    for (int i = 0; i < kMsgs; i++) {
      uint64_t size = 0;
      if (p.sender) size = rng() % (kMax + 1);
      // Both sides learn the size (and so the salt's coverage) from rank 0.
      std::vector<uint64_t> s(2, size), r(2, 0);
      ASSERT_EQ(mknet::hubAllToAll(ctx, s.data(), r.data(), sizeof(uint64_t)), ncclSuccess);
      size = r[0];
      if (p.sender) {
        fill(buf, 1000 + i);
        ASSERT_EQ(sendOne(p.net.get(), p.comm, buf.data(), size, 7), ncclSuccess);
      } else {
        std::fill(buf.begin(), buf.end(), 0xa5);
        size_t got = 0;
        ASSERT_EQ(recvOne(p.net.get(), p.comm, buf.data(), buf.size(), 7, &got), ncclSuccess)
            << mk::lastError();
        ASSERT_EQ(got, size);
        EXPECT_TRUE(check(buf.data(), got, 1000 + i)) << "message " << i;
        for (size_t k = got; k < buf.size(); k++) ASSERT_EQ(buf[k], 0xa5) << "past the message";
      }
    }
    if (p.sender) return;
    mk::NetRecvCounts n;
    if (!p.net->recvCounts(p.comm, &n)) return;  // not counted (plugin, helper threads only)
    EXPECT_EQ(n.msgs, (uint64_t)kMsgs);
    // One each, with slack for a frame the sender's kernel queued in two pieces that the
    // reader caught in between (two each before the read-ahead).
    EXPECT_LE(n.calls - n.empty, (uint64_t)kMsgs + kMsgs / 4)
        << n.calls << " recv() calls, " << n.empty << " empty, for " << kMsgs << " messages";
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, NetConformance,
                         ::testing::Values("socket", "socket-1conn", "socket-helpers", "plugin-v8",
                                           "plugin-v9", "plugin-v10", "plugin-v11"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
