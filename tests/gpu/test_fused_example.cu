// The reference fused operator (fused/ops/example) on real comms of ranks sharing GPU 0:
// every rank's GEMM output and the previous rank's, received through the comm's channels,
// checked element-wise against the fp64 reference over back-to-back calls; then the
// failure paths every fused operator shares with the collectives: a rank that never
// arrives is stopped by ncclCommAbort / ncclCommRevoke from another thread within 5 s, and
// by MKERNEL_TIMEOUT_MS with an error naming the peer and the operator.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpu/test_proc_util.h"
#include "fused/core/cost_model.h"
#include "fused/ops/example/example.h"
#include "test_gemm_util.cuh"

using namespace gemmtest;
namespace ex = mk::fused::example;

namespace {

using gputest::Clock;
using gputest::since;
using gputest::streamCompleted;

#define REQUIRE_SM90() GEMMTEST_REQUIRE_SM90()

// n ranks on GPU 0 (ncclCommInitAll with a repeated device), a non-blocking stream each.
struct Ranks {
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  bool ok = false;
  explicit Ranks(int n) : comms(n, nullptr), streams(n, nullptr) {
    std::vector<int> devs(n, 0);
    ok = ncclCommInitAll(comms.data(), n, devs.data()) == ncclSuccess;
    cudaSetDevice(0);
    for (auto& s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  }
  ~Ranks() {
    for (auto c : comms)
      if (c) ncclCommAbort(c);
    for (auto s : streams)
      if (s) cudaStreamDestroy(s);
  }
};

// One rank's buffers: its GEMM problem, the received tiles, the operator's flags.
struct RankBufs {
  Problem p;
  void* recv = nullptr;
  uint64_t* tileFlags = nullptr;
  uint64_t* recvFlags = nullptr;
  int nTiles = 0;
  RankBufs(int M, int N, int K, BLayout bl) : p(M, N, K, bl, DType::kBF16, DType::kBF16) {}
  void alloc() {
    p.alloc();
    nTiles = mk::gemm::tilesM(p.args()) * mk::gemm::tilesN(p.args());
    ASSERT_EQ(cudaMalloc(&recv, p.bytesD()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&tileFlags, nTiles * sizeof(uint64_t)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&recvFlags, nTiles * sizeof(uint64_t)), cudaSuccess);
    ASSERT_EQ(cudaMemset(tileFlags, 0, nTiles * sizeof(uint64_t)), cudaSuccess);  // once
    ASSERT_EQ(cudaMemset(recvFlags, 0, nTiles * sizeof(uint64_t)), cudaSuccess);
  }
  ex::Args args(int commSms) const {
    ex::Args a;
    a.gemm = p.args();
    a.recv = recv;
    a.tileFlags = tileFlags;
    a.recvFlags = recvFlags;
    a.commSms = commSms;
    return a;
  }
  ~RankBufs() {
    cudaFree(recv);
    cudaFree(tileFlags);
    cudaFree(recvFlags);
  }
};

}  // namespace

// Ranks 1, 2, 3 sharing the GPU, tails in M and N, both B layouts; three calls back to back
// with new inputs (the call counter and the channel counters live on the device).
TEST(FusedExample, RingOverTheNodeOnAComm) {
  REQUIRE_SM90();
  mk::fused::DeviceRates rates;  // measured before any rank's kernel holds SMs
  ASSERT_EQ(mk::fused::getDeviceRates(0, &rates), ncclSuccess);
  const uint64_t seed = mktest::testSeed();
  for (int n : {1, 2, 3}) {
    for (BLayout bl : {BLayout::kNK, BLayout::kKN}) {
      SCOPED_TRACE(testing::Message()
                   << n << " ranks, B " << (bl == BLayout::kKN ? "[K,N]" : "[N,K]"));
      Ranks r(n);
      ASSERT_TRUE(r.ok) << ncclGetLastError(nullptr);
      std::vector<std::unique_ptr<RankBufs>> b;
      for (int i = 0; i < n; ++i) {
        // Every rank's D has the same shape; K may differ.
        b.emplace_back(new RankBufs(700, 600, 128 + 64 * i, bl));
        b.back()->alloc();
      }
      const int commSms[] = {2, 5, -1};
      for (uint64_t call = 1; call <= 3; ++call) {
        SCOPED_TRACE(testing::Message() << "call " << call << " commSms " << commSms[call - 1]);
        for (int i = 0; i < n; ++i) {
          b[i]->p.randomize(seed + 17 * call + i);
          b[i]->p.poison();
          GT_CUDA(cudaMemset(b[i]->recv, 0xFF, b[i]->p.bytesD()));
          b[i]->p.reference();
        }
        GT_CUDA(cudaDeviceSynchronize());
        // One thread per rank, as a framework driving one device per thread would.
        std::vector<ncclResult_t> res(n, ncclInternalError);
        std::vector<std::thread> th;
        for (int i = 0; i < n; ++i)
          th.emplace_back([&, i] {
            cudaSetDevice(0);
            res[i] = ex::launch(b[i]->args(commSms[call - 1]), r.comms[i], r.streams[i]);
          });
        for (auto& t : th) t.join();
        for (int i = 0; i < n; ++i) ASSERT_EQ(res[i], ncclSuccess) << "rank " << i;
        for (int i = 0; i < n; ++i) ASSERT_TRUE(streamCompleted(r.streams[i], 60)) << "rank " << i;
        for (int i = 0; i < n; ++i) {
          ncclResult_t async = ncclInternalError;
          ASSERT_EQ(ncclCommGetAsyncError(r.comms[i], &async), ncclSuccess);
          ASSERT_EQ(async, ncclSuccess) << ncclGetLastError(r.comms[i]);
          const int prev = (i + n - 1) % n;
          EXPECT_EQ(b[i]->p.check(), "") << "rank " << i << " (its own GEMM output)";
          EXPECT_EQ(b[prev]->p.check(b[i]->recv), "")
              << "rank " << i << " (received from rank " << prev << ")";
          std::vector<uint64_t> rf(b[i]->nTiles), tf(b[i]->nTiles);
          GT_CUDA(cudaMemcpy(rf.data(), b[i]->recvFlags, rf.size() * 8, cudaMemcpyDeviceToHost));
          GT_CUDA(cudaMemcpy(tf.data(), b[i]->tileFlags, tf.size() * 8, cudaMemcpyDeviceToHost));
          for (int t = 0; t < b[i]->nTiles; ++t) {
            ASSERT_EQ(rf[t], call) << "rank " << i << " tile " << t << ": call counter";
            ASSERT_EQ(tf[t], call) << "rank " << i << " tile " << t << ": tile flag";
          }
        }
      }
    }
  }
}

// Rank 1 never calls the operator: rank 0's kernel waits for it until another thread aborts
// rank 0's comm; the kernel leaves within 5 s and the GPU stays usable.
TEST(FusedExample, AbortStopsAWaitingKernel) {
  REQUIRE_SM90();
  for (bool revoke : {false, true}) {
    SCOPED_TRACE(revoke ? "ncclCommRevoke" : "ncclCommAbort");
    Ranks r(2);
    ASSERT_TRUE(r.ok) << ncclGetLastError(nullptr);
    RankBufs b(512, 1024, 256, BLayout::kNK);
    b.alloc();
    b.p.randomize(5);
    GT_CUDA(cudaDeviceSynchronize());
    ASSERT_EQ(ex::launch(b.args(2), r.comms[0], r.streams[0]), ncclSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_EQ(cudaStreamQuery(r.streams[0]), cudaErrorNotReady)
        << "rank 0 should still be waiting for rank 1";
    double took = -1;
    ncclResult_t res = ncclInternalError;
    std::thread stopper([&] {
      auto t0 = Clock::now();
      res = revoke ? ncclCommRevoke(r.comms[0], NCCL_REVOKE_DEFAULT) : ncclCommAbort(r.comms[0]);
      took = since(t0);
    });
    stopper.join();
    EXPECT_EQ(res, ncclSuccess);
    EXPECT_LT(took, 5.0);
    EXPECT_TRUE(streamCompleted(r.streams[0], 5)) << "the kernel must leave after the abort";
    if (revoke) {
      ncclResult_t async = ncclSuccess;
      ASSERT_EQ(ncclCommGetAsyncError(r.comms[0], &async), ncclSuccess);
      EXPECT_EQ(async, ncclSystemError);
      const std::string msg = ncclGetLastError(r.comms[0]);
      EXPECT_NE(msg.find("aborted"), std::string::npos) << msg;
      EXPECT_NE(msg.find("fused example"), std::string::npos) << msg;
      EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
    } else {
      r.comms[0] = nullptr;  // freed by the abort
    }
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the CUDA context must stay usable";
  // A fresh comm runs the operator.
  Ranks r(1);
  ASSERT_TRUE(r.ok);
  RankBufs b(256, 512, 64, BLayout::kKN);
  b.alloc();
  b.p.randomize(9);
  b.p.poison();
  b.p.reference();
  GT_CUDA(cudaDeviceSynchronize());
  ASSERT_EQ(ex::launch(b.args(2), r.comms[0], r.streams[0]), ncclSuccess);
  ASSERT_TRUE(streamCompleted(r.streams[0], 30));
  EXPECT_EQ(b.p.check(), "");
  EXPECT_EQ(b.p.check(b.recv), "");
}

// The same absent rank with MKERNEL_TIMEOUT_MS=1000: ncclRemoteError, naming the rank waited
// for and the operator; later calls report the error instead of hanging.
TEST(FusedExample, TimeoutNamesPeerAndOp) {
  REQUIRE_SM90();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "1000");
  Ranks r(2);
  ASSERT_TRUE(r.ok) << ncclGetLastError(nullptr);
  RankBufs b(512, 1024, 256, BLayout::kNK);
  b.alloc();
  b.p.randomize(7);
  GT_CUDA(cudaDeviceSynchronize());
  auto t0 = Clock::now();
  ASSERT_EQ(ex::launch(b.args(2), r.comms[0], r.streams[0]), ncclSuccess);
  ncclResult_t async = ncclSuccess;
  while (async == ncclSuccess && since(t0) < 30) {
    ASSERT_EQ(ncclCommGetAsyncError(r.comms[0], &async), ncclSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(async, ncclRemoteError);
  EXPECT_GT(since(t0), 0.9) << "the deadline is MKERNEL_TIMEOUT_MS";
  const std::string msg = ncclGetLastError(r.comms[0]);
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fused example"), std::string::npos) << msg;
  EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MKERNEL_TIMEOUT_MS=1000"), std::string::npos) << msg;
  EXPECT_TRUE(streamCompleted(r.streams[0], 5)) << "the kernel must leave after the timeout";
  EXPECT_NE(ex::launch(b.args(2), r.comms[0], r.streams[0]), ncclSuccess)
      << "a failed comm refuses new operations";
}
