// Verbs backend. Without an RDMA device (CI, this machine) the data tests report
// SKIPPED with the reason; what can be checked anywhere (libibverbs loading, NCCL_IB_HCA
// parsing, NCCL_IB_DISABLE, clean failure) runs everywhere.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/debug.h"
#include "base/param.h"
#include "transport/ibvwrap.h"
#include "transport/net.h"
#include "transport/net_verbs.h"

namespace {

// A verbs backend with at least one active port, or the reason there is none.
std::unique_ptr<mk::Net> verbsOrWhy(std::string* why) {
  std::unique_ptr<mk::Net> net;
  std::string lib;
  if (mk::ibvInit(&lib) != ncclSuccess) {
    *why = "libibverbs not available: " + lib;
    return nullptr;
  }
  if (mk::netCreateVerbs(&net) != ncclSuccess) {
    *why =
        "no usable RDMA device (no active IB/RoCE port; see NCCL_DEBUG=INFO). Without RDMA "
        "hardware, soft-RoCE gives one: `rdma link add rxe0 type rxe netdev lo` (needs the "
        "rdma_rxe kernel module)";
    return nullptr;
  }
  return net;
}

#define REQUIRE_VERBS(net)      \
  std::string why_;             \
  auto net = verbsOrWhy(&why_); \
  if (!net) GTEST_SKIP() << "verbs: " << why_;

// Send and receive comms of one HCA connected to each other in this process.
void connectLoopback(mk::Net* net, void** lc, void** sc, void** rc) {
  char handle[mk::kNetHandleSize];
  ASSERT_EQ(net->listen(0, handle, lc), ncclSuccess);
  for (int i = 0; i < 100000 && (!*sc || !*rc); i++) {
    if (!*sc) ASSERT_EQ(net->connect(0, handle, sc), ncclSuccess);
    if (!*rc) ASSERT_EQ(net->accept(*lc, rc), ncclSuccess);
  }
  ASSERT_TRUE(*sc && *rc);
}

}  // namespace

TEST(NetVerbs, LibraryLoadsOrFailsCleanly) {
  std::string why;
  ncclResult_t res = mk::ibvInit(&why);
  if (res == ncclSuccess) {
    EXPECT_NE(mk::ibv.getDeviceList, nullptr);
    EXPECT_NE(mk::ibv.modifyQp, nullptr);
    std::printf("[ info     ] libibverbs loaded; ibv_reg_dmabuf_mr %s\n",
                mk::ibvHasDmaBufSymbol() ? "present" : "absent (library older than 1.12)");
  } else {
    EXPECT_EQ(res, ncclSystemError);
    EXPECT_FALSE(why.empty());
  }
}

TEST(NetVerbs, NoDeviceIsAnErrorNotACrash) {
  std::unique_ptr<mk::Net> net;
  ncclResult_t res = mk::netCreateVerbs(&net);
  if (res == ncclSuccess) {
    int n = 0;
    EXPECT_EQ(net->devices(&n), ncclSuccess);
    EXPECT_GT(n, 0);
  } else {
    EXPECT_EQ(res, ncclSystemError);
    EXPECT_EQ(net, nullptr);
  }
}

TEST(NetVerbs, IbDisableTurnsItOff) {
  setenv("NCCL_IB_DISABLE", "1", 1);
  mk::paramReset();
  std::unique_ptr<mk::Net> net;
  EXPECT_EQ(mk::netCreateVerbs(&net), ncclSystemError);
  unsetenv("NCCL_IB_DISABLE");
  mk::paramReset();
}

TEST(NetVerbs, HcaListSyntax) {
  using mk::verbs::hcaMatches;
  EXPECT_TRUE(hcaMatches("", "mlx5_0", 1));
  EXPECT_TRUE(hcaMatches("mlx5", "mlx5_3", 1));
  EXPECT_FALSE(hcaMatches("=mlx5", "mlx5_3", 1));
  EXPECT_TRUE(hcaMatches("=mlx5_3", "mlx5_3", 2));
  EXPECT_TRUE(hcaMatches("mlx5_0:1,mlx5_1:2", "mlx5_1", 2));
  EXPECT_FALSE(hcaMatches("mlx5_0:1,mlx5_1:2", "mlx5_1", 1));
  EXPECT_FALSE(hcaMatches("^mlx5_0", "mlx5_0", 1));
  EXPECT_TRUE(hcaMatches("^mlx5_0", "mlx5_1", 1));
  EXPECT_TRUE(hcaMatches("^=mlx5_0:2", "mlx5_0", 1));
}

TEST(NetVerbs, PropertiesOfEveryDevice) {
  REQUIRE_VERBS(net);
  int n = 0;
  ASSERT_EQ(net->devices(&n), ncclSuccess);
  for (int d = 0; d < n; d++) {
    mk::NetProperties p;
    ASSERT_EQ(net->getProperties(d, &p), ncclSuccess);
    EXPECT_FALSE(p.name.empty());
    EXPECT_TRUE(p.ptrSupport & NCCL_PTR_HOST);
    EXPECT_GT(p.speedMbps, 0);
  }
}

// Loopback through one HCA in one process: connect/accept state machines, registration,
// multi-receive by tag, zero-byte and striped messages.
TEST(NetVerbs, LoopbackSendRecv) {
  REQUIRE_VERBS(net);
  char handle[mk::kNetHandleSize];
  void *lc = nullptr, *sc = nullptr, *rc = nullptr;
  ASSERT_EQ(net->listen(0, handle, &lc), ncclSuccess);
  for (int i = 0; i < 100000 && (!sc || !rc); i++) {
    if (!sc) ASSERT_EQ(net->connect(0, handle, &sc), ncclSuccess);
    if (!rc) ASSERT_EQ(net->accept(lc, &rc), ncclSuccess);
  }
  ASSERT_TRUE(sc && rc);
  std::vector<char> src(1 << 20), dst(3 << 20, 0);
  for (size_t i = 0; i < src.size(); i++) src[i] = (char)(i * 7);
  void *smh = nullptr, *rmh = nullptr;
  ASSERT_EQ(net->regMr(sc, src.data(), src.size(), NCCL_PTR_HOST, &smh), ncclSuccess);
  ASSERT_EQ(net->regMr(rc, dst.data(), dst.size(), NCCL_PTR_HOST, &rmh), ncclSuccess);
  void* data[3] = {dst.data(), dst.data() + (1 << 20), dst.data() + (2 << 20)};
  size_t sizes[3] = {1 << 20, 1 << 20, 1 << 20};
  int tags[3] = {1, 2, 3};
  void* mhs[3] = {rmh, rmh, rmh};
  void* rreq = nullptr;
  ASSERT_EQ(net->irecv(rc, 3, data, sizes, tags, mhs, &rreq), ncclSuccess);
  ASSERT_NE(rreq, nullptr);
  void* sreq[3] = {};
  const int order[3] = {3, 1, 2};
  const size_t lens[3] = {0, 1 << 20, 12345};
  for (int k = 0; k < 3; k++)
    for (int spin = 0; !sreq[k] && spin < 1000000; spin++)
      ASSERT_EQ(net->isend(sc, src.data(), lens[k], order[k], smh, &sreq[k]), ncclSuccess);
  size_t got[3] = {};
  for (int k = 0; k < 3; k++)
    ASSERT_EQ(mk::netWaitRequest(net.get(), sreq[k], nullptr, 10000), ncclSuccess);
  ASSERT_EQ(mk::netWaitRequest(net.get(), rreq, got, 10000), ncclSuccess);
  EXPECT_EQ(got[0], 1u << 20);
  EXPECT_EQ(got[1], 12345u);
  EXPECT_EQ(got[2], 0u);
  EXPECT_EQ(memcmp(dst.data(), src.data(), 1 << 20), 0);
  EXPECT_EQ(memcmp(dst.data() + (1 << 20), src.data(), 12345), 0);
  net->deregMr(sc, smh);
  net->deregMr(rc, rmh);
  net->closeSend(sc);
  net->closeRecv(rc);
  net->closeListen(lc);
}

TEST(NetVerbs, GpuDirectRegistration) {
  REQUIRE_VERBS(net);
  GTEST_SKIP() << "needs a GPU with dma-buf or nvidia-peermem; covered by tests/gpu when present";
}

// GPUDirect flush: iflush after a completed receive into memory registered as
// NCCL_PTR_CUDA posts a loopback RDMA READ (net_verbs.h) whose request completes through
// test(); host-registered or empty buffers need none (NULL request); misuse is rejected.
// Host memory registered as NCCL_PTR_CUDA (the dma-buf path falls back to ibv_reg_mr)
// drives the same READ path on any RDMA device, soft-RoCE included, without a GPU.
TEST(NetVerbs, FlushAfterGpuReceive) {
  REQUIRE_VERBS(net);
  void *lc = nullptr, *sc = nullptr, *rc = nullptr;
  connectLoopback(net.get(), &lc, &sc, &rc);
  if (HasFatalFailure()) return;
  std::mt19937_64 rng(std::random_device{}());
  const size_t n = 1 + rng() % (1 << 20);
  std::vector<char> src(n), dst(n, (char)0xee);
  for (auto& b : src) b = (char)rng();
  void *smh = nullptr, *gpuMh = nullptr, *hostMh = nullptr;
  ASSERT_EQ(net->regMr(sc, src.data(), n, NCCL_PTR_HOST, &smh), ncclSuccess);
  ASSERT_EQ(net->regMr(rc, dst.data(), n, NCCL_PTR_CUDA, &gpuMh), ncclSuccess);
  ASSERT_EQ(net->regMr(rc, dst.data(), n, NCCL_PTR_HOST, &hostMh), ncclSuccess);
  for (int round = 0; round < 4; round++) {
    void* data = dst.data();
    size_t size = n;
    int tag = 1;
    void* mh = round % 2 ? hostMh : gpuMh;
    void *rreq = nullptr, *sreq = nullptr;
    ASSERT_EQ(net->irecv(rc, 1, &data, &size, &tag, &mh, &rreq), ncclSuccess);
    ASSERT_NE(rreq, nullptr);
    for (int spin = 0; !sreq && spin < 1000000; spin++)
      ASSERT_EQ(net->isend(sc, src.data(), n, 1, smh, &sreq), ncclSuccess);
    ASSERT_EQ(mk::netWaitRequest(net.get(), sreq, nullptr, 10000), ncclSuccess);
    size_t got = 0;
    ASSERT_EQ(mk::netWaitRequest(net.get(), rreq, &got, 10000), ncclSuccess);
    ASSERT_EQ(got, n);
    int isz = (int)n;
    void* freq = nullptr;
    ASSERT_EQ(net->iflush(rc, 1, &data, &isz, &mh, &freq), ncclSuccess) << mk::lastError();
    if (round % 2) {
      EXPECT_EQ(freq, nullptr) << "host buffer: nothing to flush";
    } else {
      ASSERT_NE(freq, nullptr) << "GPU buffer: the flush READ must be posted";
      ASSERT_EQ(mk::netWaitRequest(net.get(), freq, nullptr, 10000), ncclSuccess)
          << mk::lastError();
    }
    EXPECT_EQ(memcmp(dst.data(), src.data(), n), 0) << "round " << round;
    int zero = 0;
    freq = nullptr;
    EXPECT_EQ(net->iflush(rc, 1, &data, &zero, &gpuMh, &freq), ncclSuccess);
    EXPECT_EQ(freq, nullptr) << "zero bytes: nothing to flush";
  }
  int isz = 1;
  void* data = dst.data();
  void* freq = nullptr;
  EXPECT_EQ(net->iflush(sc, 1, &data, &isz, &smh, &freq), ncclInvalidArgument);
  EXPECT_EQ(net->iflush(rc, 0, &data, &isz, &gpuMh, &freq), ncclInvalidArgument);
  net->deregMr(sc, smh);
  net->deregMr(rc, gpuMh);
  net->deregMr(rc, hostMh);
  net->closeSend(sc);
  net->closeRecv(rc);
  net->closeListen(lc);
}
