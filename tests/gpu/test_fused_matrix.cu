// The test matrix of the fused GEMM + collective calls (issue 12, "Proof"), part 1: ranks
// sharing GPU 0 as threads of this process, ONE thread driving every rank (each rank's call
// issued in turn: fused calls are refused inside groups).
//   - FusedMatrix/FusedMatrixOneThread: ranks 1, 2, 3, 4, 8 x the three calls x shapes with
//     tails in M, N and K (also rows of C that are not a multiple of 16 bytes, where the
//     fused AllReduce/ReduceScatter kernel declines and the call runs sequentially), both B
//     layouts, every output type, bf16/fp16 inputs, bias, AllGatherGemm in place and with
//     Agathered NULL, algo auto
//     and fused (and auto with MKERNEL_FUSED_AUTO=1: the cost model decides);
//   - FusedMatrixGraph: captured once, replayed 50 times with new inputs;
//   - FusedMatrixRandom: 200 random fused calls interleaved with ordinary collectives on one
//     comm, issued back to back in batches, every result checked;
//   - FusedMatrixAbort: a rank that never calls: ncclCommAbort from another thread stops the
//     waiting rank within 5 s; MKERNEL_TIMEOUT_MS ends it with an error naming the peer; the
//     GPU stays usable.
// Threads with one thread per rank: test_fused_matrix_threads.cu; virtual nodes:
// test_fused_matrix_vnodes.cu; processes and a killed rank: test_fused_matrix_procs.cu.
// Inputs, references and tolerances: test_fused_util.cuh.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "gpu/test_coll_util.h"
#include "gpu/test_devcomm_util.h"
#include "gpu/test_fused_util.cuh"
#include "gpu/test_proc_util.h"

namespace {

using fusedtest::Case;
using fusedtest::Problem;
using Clock = std::chrono::steady_clock;
using gputest::since;

// A hang ends after 20 s on the device (the kernels' deadline) instead of 5 minutes.
class MatrixEnv : public ::testing::Test {
 protected:
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
};
class FusedMatrixGraph : public MatrixEnv {};
class FusedMatrixRandom : public MatrixEnv {};

// Runs c on the cached clique of c.n ranks; the clique is dropped after a failure (a call
// may have left kernels waiting) before the buffers are freed.
std::string runOnClique(const Case& c, uint64_t seed, bool graph = false, int reps = 1) {
  colltest::Clique& q = colltest::clique(c.n);
  if (!q.ok) return "clique: " + q.why;
  cudaSetDevice(0);
  Problem p(c);
  const std::string err = fusedtest::runDriven(p, q.comms, q.streams, seed, graph, reps);
  if (!err.empty()) colltest::dropClique(c.n);
  return err;
}

// ---- the matrix ------------------------------------------------------------------------
struct MCase {
  Case c;
  bool model;  // ncclFusedAuto with MKERNEL_FUSED_AUTO=1
};

// Shapes per rank count: M a multiple of n (AllGatherGemm, GemmReduceScatter), K % 8 == 0.
struct Shape {
  int rowsPerRank, N, K;
};
const Shape kShapes[] = {
    {128, 256, 128},  // whole 128x256 tiles
    {37, 128, 64},    // tail in M (and shards not a multiple of 8 rows)
    {64, 200, 96},    // tail in N (N % 8 == 0: both layouts, fused kernel eligible)
    {24, 130, 40},    // C rows not 16-byte multiples: AR/RS fused declines; [N,K] only
    {72, 136, 328},   // tail in K
};

std::vector<MCase> matrix() {
  std::vector<MCase> v;
  const ncclDataType_t outs[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
  for (int n : {1, 2, 3, 4, 8}) {
    for (int op = 0; op < 3; ++op) {
      for (int si = 0; si < 5; ++si) {
        const Shape& s = kShapes[si];
        Case c{op, n, s.rowsPerRank * n, s.N, s.K, 0, ncclBfloat16, ncclBfloat16, false, 0};
        c.layout = s.N % 8 == 0 ? (si + op) % 2 : ncclFusedLayoutNK;
        c.in = (si + n) % 2 ? ncclFloat16 : ncclBfloat16;
        c.out = outs[(si + op + n) % 3];
        c.bias = (si + op) % 2 == 0;
        for (int algo : {ncclFusedAuto, ncclFusedFused}) {
          c.algo = algo;
          v.push_back({c, false});
          if (op == fusedtest::kAllGather && (si == 0 || si == 2)) {
            Case ip = c;
            ip.inplace = true;
            v.push_back({ip, false});
          }
          if (op == fusedtest::kAllGather && si == 1) {
            Case ng = c;
            ng.noGathered = true;
            v.push_back({ng, false});
          }
          if (algo == ncclFusedAuto && (n == 2 || n == 4) && (si == 0 || si == 2))
            v.push_back({c, true});
        }
      }
    }
  }
  // A few larger ones: several tiles per rank in every dimension.
  v.push_back({{0, 4, 512, 512, 512, 1, ncclBfloat16, ncclFloat32, true, ncclFusedFused}, false});
  v.push_back({{1, 8, 1024, 384, 512, 0, ncclFloat16, ncclFloat16, true, ncclFusedFused}, false});
  v.push_back({{2, 2, 1024, 512, 256, 0, ncclBfloat16, ncclBfloat16, true, ncclFusedAuto}, false});
  return v;
}

class FusedMatrixOneThread : public ::testing::TestWithParam<MCase> {
 protected:
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
};

TEST_P(FusedMatrixOneThread, Run) {
  MKTEST_REQUIRE_GPU();
  const MCase& m = GetParam();
  std::unique_ptr<mktest::ScopedEnv> model;
  if (m.model) model.reset(new mktest::ScopedEnv("MKERNEL_FUSED_AUTO", "1"));
  const uint64_t seed = mktest::testSeed() + m.c.M * 7919 + m.c.N * 31 + m.c.K + m.c.op;
  EXPECT_EQ(runOnClique(m.c, seed), "") << name(m.c) << (m.model ? " (MKERNEL_FUSED_AUTO=1)" : "");
}

INSTANTIATE_TEST_SUITE_P(FusedMatrix, FusedMatrixOneThread, ::testing::ValuesIn(matrix()),
                         [](const ::testing::TestParamInfo<MCase>& i) {
                           return name(i.param.c) + (i.param.model ? "_model" : "");
                         });

// ---- graphs ------------------------------------------------------------------------------
// One capture per rank stream (after one eager run: runDriven), 50 replays with new inputs,
// every output checked after each.
TEST_F(FusedMatrixGraph, ReplaysWithNewInputs) {
  MKTEST_REQUIRE_GPU();
  const uint64_t seed = mktest::testSeed() ^ 0x51ed27;
  for (int n : {1, 2, 3, 8}) {
    for (int op = 0; op < 3; ++op) {
      for (int algo : {ncclFusedAuto, ncclFusedFused}) {
        const ncclDataType_t in = n % 2 ? ncclFloat16 : ncclBfloat16;
        const ncclDataType_t out = op == 1 ? ncclFloat32 : ncclBfloat16;
        Case c{op, n, 40 * n, 136, 72, (op + n) % 2, in, out, op != 1, algo};
        ASSERT_EQ(runOnClique(c, seed + n * 10 + op, true, 50), "") << name(c) << " graph";
      }
    }
  }
}

// ---- 200 random fused calls and collectives on one comm -----------------------------------
// On the cached clique of 4 ranks, one thread driving them; the seed is printed.
TEST_F(FusedMatrixRandom, MixedWithCollectivesOnOneComm) {
  MKTEST_REQUIRE_GPU();
  const int n = 4;
  const uint64_t seed = mktest::testSeed() ^ 0x7a11ed;
  printf("[FusedMatrixRandom] seed %llu (MKTEST_SEED=%llu repeats it)\n", (unsigned long long)seed,
         (unsigned long long)mktest::testSeed());
  colltest::Clique& q = colltest::clique(n);
  ASSERT_TRUE(q.ok) << q.why;
  cudaSetDevice(0);
  int colls = 0;
  const std::string err = fusedtest::runRandomMix(
      q.comms, q.streams, seed, 200, 25, [&] { colltest::dropClique(n); }, &colls);
  ASSERT_EQ(err, "");
  printf("[FusedMatrixRandom] 200 fused calls and %d collectives checked\n", colls);
}

// ---- a rank that never calls ---------------------------------------------------------------
// Two fresh ranks on GPU 0 (not the cached cliques: these end aborted).
struct Pair {
  std::vector<ncclComm_t> comms{nullptr, nullptr};
  std::vector<cudaStream_t> streams{nullptr, nullptr};
  bool ok = false;
  Pair() {
    int devs[2] = {0, 0};
    ok = ncclCommInitAll(comms.data(), 2, devs) == ncclSuccess;
    cudaSetDevice(0);
    for (auto& s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  }
  ~Pair() {
    for (auto c : comms)
      if (c) ncclCommAbort(c);
    for (auto s : streams) cudaStreamDestroy(s);
  }
};

// ncclCommAbort of comm from another thread; its duration in seconds.
double abortFromAnotherThread(ncclComm_t comm, ncclResult_t* res) {
  double took = -1;
  std::thread t([&] {
    const auto t0 = Clock::now();
    *res = ncclCommAbort(comm);
    took = since(t0);
  });
  t.join();
  return took;
}

const int kAbsentOps[][2] = {{0, ncclFusedFused}, {0, ncclFusedAuto},  {1, ncclFusedFused},
                             {1, ncclFusedAuto},  {2, ncclFusedFused}, {2, ncclFusedAuto}};

// Runs body(c, pr, p) for each (op, algo) of kAbsentOps on `shape`: c, a fresh pair, c's
// inputs filled from seed. Stops at the first fatal failure (the caller then returns).
template <class Body>
void forEachAbsentOp(const Case& shape, uint64_t seed, Body body) {
  for (auto& v : kAbsentOps) {
    Case c = shape;
    c.op = v[0];
    c.algo = v[1];
    SCOPED_TRACE(name(c));
    Pair pr;
    ASSERT_TRUE(pr.ok) << ncclGetLastError(nullptr);
    std::unique_ptr<Problem> p(new Problem(c));
    ASSERT_EQ(p->fill(seed), "");
    body(c, pr, p);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Rank 1 never calls; rank 0's call (fused kernel, or GEMM then the collective) waits for it
// on the device until another thread aborts rank 0's comm: the abort returns within 5 s and
// the kernel leaves.
TEST(FusedMatrixAbort, AbortWhilePeerNeverComes) {
  MKTEST_REQUIRE_GPU();
  const uint64_t seed = mktest::testSeed() ^ 0xab0;
  const Case shape{0, 2, 256, 256, 128, 0, ncclBfloat16, ncclBfloat16, false, ncclFusedAuto};
  forEachAbsentOp(shape, seed, [&](const Case&, Pair& pr, std::unique_ptr<Problem>& p) {
    ASSERT_EQ(p->call(0, pr.comms[0], pr.streams[0]), ncclSuccess) << ncclGetLastError(nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_EQ(cudaStreamQuery(pr.streams[0]), cudaErrorNotReady)
        << "rank 0 should still be waiting for rank 1";
    ncclResult_t res = ncclInternalError;
    const double took = abortFromAnotherThread(pr.comms[0], &res);
    pr.comms[0] = nullptr;
    EXPECT_EQ(res, ncclSuccess);
    EXPECT_LT(took, 5.0) << "ncclCommAbort took " << took << " s";
    const bool idle = dctest::streamDone(pr.streams[0], 5);
    EXPECT_TRUE(idle) << "the kernel must leave within 5 s of the abort";
    if (!idle) (void)p.release();  // never free buffers a running kernel may touch
  });
  if (HasFatalFailure()) return;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the CUDA context must stay usable";
  Case ok{0, 2, 128, 128, 64, 0, ncclBfloat16, ncclFloat32, true, ncclFusedFused};
  EXPECT_EQ(runOnClique(ok, seed + 1), "") << "the GPU must stay usable";
}

// The same with MKERNEL_TIMEOUT_MS=1000 and no abort: the waiting rank records an error that
// names rank 1 (ncclCommGetAsyncError, ncclGetLastError), its kernel leaves, and
// ncclCommAbort from another thread then returns within 5 s.
TEST(FusedMatrixAbort, TimeoutNamesAbsentPeer) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "1000");
  const uint64_t seed = mktest::testSeed() ^ 0xab1;
  const Case shape{0, 2, 256, 256, 128, 1, ncclFloat16, ncclFloat16, true, ncclFusedAuto};
  forEachAbsentOp(shape, seed, [&](const Case& c, Pair& pr, std::unique_ptr<Problem>& p) {
    const auto t0 = Clock::now();
    ASSERT_EQ(p->call(0, pr.comms[0], pr.streams[0]), ncclSuccess) << ncclGetLastError(nullptr);
    ncclResult_t async = ncclSuccess;
    ASSERT_EQ(gputest::pollAsyncError(pr.comms[0], t0, 30, &async), ncclSuccess);
    const double after = since(t0);
    EXPECT_EQ(async, ncclRemoteError) << "after " << after << " s";
    EXPECT_GT(after, 0.9) << "the deadline is MKERNEL_TIMEOUT_MS";
    const std::string msg = ncclGetLastError(pr.comms[0]);
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("MKERNEL_TIMEOUT_MS=1000"), std::string::npos) << msg;
    printf("[FusedMatrixAbort] %s: error after %.2f s: %s\n", name(c).c_str(), after, msg.c_str());
    const bool idle = dctest::streamDone(pr.streams[0], 5);
    EXPECT_TRUE(idle) << "the kernel must leave after the timeout";
    ncclResult_t res = ncclInternalError;
    const double took = abortFromAnotherThread(pr.comms[0], &res);
    pr.comms[0] = nullptr;
    EXPECT_EQ(res, ncclSuccess);
    EXPECT_LT(took, 5.0);
    if (!idle) (void)p.release();
  });
  if (HasFatalFailure()) return;
  Case ok{2, 2, 128, 128, 64, 1, ncclFloat16, ncclFloat32, true, ncclFusedFused};
  EXPECT_EQ(runOnClique(ok, seed + 1), "") << "the GPU must stay usable";
}

// Inside ncclGroupStart/End every fused call is refused with ncclInvalidUsage and a message
// (fused.h documents it); the comm stays usable.
TEST(FusedMatrixGroup, RefusedInsideGroups) {
  MKTEST_REQUIRE_GPU();
  colltest::Clique& q = colltest::clique(2);
  ASSERT_TRUE(q.ok) << q.why;
  for (int op = 0; op < 3; ++op) {
    Case c{op, 2, 64, 64, 64, 0, ncclBfloat16, ncclBfloat16, false, ncclFusedAuto};
    Problem p(c);
    ASSERT_EQ(p.fill(op + 1), "");
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(p.call(0, q.comms[0], q.streams[0]), ncclInvalidUsage) << name(c);
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("ncclGroupStart"), std::string::npos)
        << ncclGetLastError(nullptr);
    ncclGroupEnd();  // may return the refused call's error, as NCCL's groups do
    EXPECT_EQ(runOnClique(c, op + 11), "") << name(c) << " after the refusal";
  }
}

}  // namespace
