// CUDA graphs and endurance: collectives captured into graphs and replayed 100 times with
// fresh inputs (the device-resident sequence numbers advance on every replay), interleaved
// with ordinary calls; 10,000 back-to-back random collectives without leaking memory, file
// descriptors or threads.
#include <cstdint>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/test_coll_util.h"

using namespace colltest;

namespace {

struct GraphBufs {
  // agCount bytes a rank: 4 ranks gather 280 KB, above the zero-copy threshold (any buffers in
  // one process on one GPU), 2 and 3 ranks stage.
  size_t arCount = 100003, ringCount = (1 << 18) + 3, agCount = 70001, p2pBytes = 65537;
  std::vector<DevBuf> arIn, arOut, ringBuf, agIn, agOut, p2pIn, p2pOut;
  std::vector<HostBuf> arH, ringH, agH, p2pH;
};

void allocGraphBufs(GraphBufs& g, int n) {
  for (int r = 0; r < n; r++) {
    g.arIn.emplace_back(g.arCount * 4);
    g.arOut.emplace_back(g.arCount * 4);
    g.ringBuf.emplace_back(g.ringCount * 2);
    g.agIn.emplace_back(g.agCount);
    g.agOut.emplace_back(g.agCount * n);
    g.p2pIn.emplace_back(g.p2pBytes);
    g.p2pOut.emplace_back(g.p2pBytes);
  }
  g.arH.resize(n);
  g.ringH.resize(n);
  g.agH.resize(n);
  g.p2pH.resize(n);
}

// Fresh inputs into the (captured) buffers, poisoned outputs.
void refill(GraphBufs& g, int n, uint64_t seed) {
  for (int r = 0; r < n; r++) {
    fillRandom(g.arH[r], ncclFloat32, Op::kSum, g.arCount, seed + r);
    upload(g.arIn[r].base, g.arH[r], 0, g.arCount);
    mktest::syncMemset(g.arOut[r].base, 0xCD, g.arOut[r].bytes);
    fillRandom(g.ringH[r], ncclBfloat16, Op::kMax, g.ringCount, seed + 50 + r);
    upload(g.ringBuf[r].base, g.ringH[r], 0, g.ringCount);
    fillRandom(g.agH[r], ncclUint8, Op::kSum, g.agCount, seed + 100 + r);
    upload(g.agIn[r].base, g.agH[r], 0, g.agCount);
    mktest::syncMemset(g.agOut[r].base, 0xCD, g.agOut[r].bytes);
    fillRandom(g.p2pH[r], ncclUint8, Op::kSum, g.p2pBytes, seed + 200 + r);
    upload(g.p2pIn[r].base, g.p2pH[r], 0, g.p2pBytes);
    mktest::syncMemset(g.p2pOut[r].base, 0xCD, g.p2pOut[r].bytes);
  }
}

void issueGraphOps(Clique& c, GraphBufs& g) {
  const int n = c.n;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; r++) {
    ASSERT_EQ(ncclAllReduce(g.arIn[r].base, g.arOut[r].base, g.arCount, ncclFloat32, ncclSum,
                            c.comms[r], c.streams[r]),
              ncclSuccess);
    ASSERT_EQ(ncclAllGather(g.agIn[r].base, g.agOut[r].base, g.agCount, ncclUint8, c.comms[r],
                            c.streams[r]),
              ncclSuccess);
    ASSERT_EQ(
        ncclSend(g.p2pIn[r].base, g.p2pBytes, ncclUint8, (r + 1) % n, c.comms[r], c.streams[r]),
        ncclSuccess);
    ASSERT_EQ(ncclRecv(g.p2pOut[r].base, g.p2pBytes, ncclUint8, (r + n - 1) % n, c.comms[r],
                       c.streams[r]),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  // A second group with the ring algorithm (chosen at capture time).
  AlgoScope ring("ring");
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; r++)
    ASSERT_EQ(ncclAllReduce(g.ringBuf[r].base, g.ringBuf[r].base, g.ringCount, ncclBfloat16,
                            ncclMax, c.comms[r], c.streams[r]),
              ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
}

void checkGraphOps(Clique& c, GraphBufs& g, int it) {
  const int n = c.n;
  std::vector<const HostBuf*> ar, rg;
  for (int r = 0; r < n; r++) {
    ar.push_back(&g.arH[r]);
    rg.push_back(&g.ringH[r]);
  }
  for (int r = 0; r < n; r++) {
    HostBuf got;
    download(got, g.arOut[r].base, g.arCount, 4);
    EXPECT_EQ(checkReduction(ncclFloat32, Op::kSum, ar, 0, got, g.arCount, 0), "")
        << "iteration " << it << " rank " << r << " AllReduce";
    download(got, g.ringBuf[r].base, g.ringCount, 2);
    EXPECT_EQ(checkReduction(ncclBfloat16, Op::kMax, rg, 0, got, g.ringCount, 0), "")
        << "iteration " << it << " rank " << r << " ring AllReduce";
    download(got, g.agOut[r].base, g.agCount * n, 1);
    for (int q = 0; q < n; q++)
      EXPECT_EQ(checkBytes(got, q * g.agCount, g.agH[q], 0, g.agCount, "AllGather"), "")
          << "iteration " << it << " rank " << r;
    download(got, g.p2pOut[r].base, g.p2pBytes, 1);
    EXPECT_EQ(checkBytes(got, 0, g.p2pH[(r + n - 1) % n], 0, g.p2pBytes, "Recv"), "")
        << "iteration " << it << " rank " << r;
  }
}

class CollGraph : public ::testing::TestWithParam<int> {};

TEST_P(CollGraph, CaptureAndReplay100Times) {
  MKTEST_REQUIRE_GPU();
  const int n = GetParam();
  Clique& c = clique(n);
  ASSERT_TRUE(c.ok) << c.why;
  GraphBufs g;
  allocGraphBufs(g, n);
  std::vector<cudaGraph_t> graphs(n);
  std::vector<cudaGraphExec_t> execs(n);
  for (int r = 0; r < n; r++)
    ASSERT_EQ(cudaStreamBeginCapture(c.streams[r], cudaStreamCaptureModeThreadLocal), cudaSuccess);
  issueGraphOps(c, g);
  // End every capture before instantiating anything: instantiation is not allowed while a
  // stream of this thread is still capturing.
  std::vector<cudaError_t> ended(n);
  for (int r = 0; r < n; r++) ended[r] = cudaStreamEndCapture(c.streams[r], &graphs[r]);
  for (int r = 0; r < n; r++) ASSERT_EQ(ended[r], cudaSuccess) << "rank " << r;
  for (int r = 0; r < n; r++)
    ASSERT_EQ(cudaGraphInstantiate(&execs[r], graphs[r], 0), cudaSuccess) << "rank " << r;
  std::string why;
  for (int it = 0; it < 100; it++) {
    refill(g, n, mktest::testSeed() + 1000 * it);
    for (int r = 0; r < n; r++) ASSERT_EQ(cudaGraphLaunch(execs[r], c.streams[r]), cudaSuccess);
    ASSERT_TRUE(syncClique(c, 60, &why)) << "replay " << it << ": " << why;
    checkGraphOps(c, g, it);
    if (::testing::Test::HasFailure()) break;
    if (it % 10 == 9) {
      // Ordinary calls between replays share the same sequence numbers.
      refill(g, n, mktest::testSeed() + 1000 * it + 7);
      issueGraphOps(c, g);
      ASSERT_TRUE(syncClique(c, 60, &why)) << "direct call after replay " << it << ": " << why;
      checkGraphOps(c, g, it);
    }
  }
  for (int r = 0; r < n; r++) {
    cudaGraphExecDestroy(execs[r]);
    cudaGraphDestroy(graphs[r]);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollGraph, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// 10,000 random collectives (every kind, dtype, op, algorithm; small counts, 0 included)
// back to back, every result checked; memory, fds and threads do not grow.
TEST(CollStress, TenThousandRandomOps) {
  MKTEST_REQUIRE_GPU();
  const int n = 4;
  Clique& c = clique(n);
  ASSERT_TRUE(c.ok) << c.why;
  std::mt19937_64 rng(mktest::testSeed());
  const char* algos[] = {nullptr, "oneshot", "twoshot", "ring"};
  auto one = [&](int i) {
    int kind = (int)(rng() % 9);
    ncclDataType_t dt = kAllTypes[rng() % 12];
    size_t count = rng() % 10 == 0 ? 0 : rng() % 3000 + 1;
    bool inplace = rng() % 3 == 0;
    int root = (int)(rng() % n);
    if (kind < 3) {
      RedParam p{(RColl)kind, dt, kAllOps[rng() % 7], count, n, inplace, root, algos[rng() % 4], 0};
      runReduction(p);
      if (::testing::Test::HasFailure()) ADD_FAILURE() << "op " << i << ": " << paramName(p);
    } else if (kind < 8) {
      CopyParam p{(CColl)(kind - 3), dt, count, n, inplace, root, 0, 0};
      runCopy(p);
      if (::testing::Test::HasFailure()) ADD_FAILURE() << "op " << i << ": " << paramName(p);
    } else {
      CopyParam p{CColl::kAlltoAll, dt, count, n, false, 0, (int)(rng() % 4), (int)(rng() % 4)};
      runCopy(p);
      if (::testing::Test::HasFailure()) ADD_FAILURE() << "op " << i << ": " << paramName(p);
    }
  };
  for (int i = 0; i < 100 && !::testing::Test::HasFailure(); i++) one(i);
  ASSERT_FALSE(::testing::Test::HasFailure());
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  int fds0 = mktest::countOpenFds(), threads0 = mktest::countThreads();
  for (int i = 100; i < 10000 && !::testing::Test::HasFailure(); i++) one(i);
  ASSERT_FALSE(::testing::Test::HasFailure());
  size_t free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_LE((long long)free0 - (long long)free1, 64ll << 20) << "device memory leaked";
  EXPECT_EQ(mktest::countOpenFds(), fds0) << "file descriptors leaked";
  EXPECT_EQ(mktest::countThreads(), threads0) << "threads leaked";
}

}  // namespace
