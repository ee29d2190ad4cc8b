// ncclMoeDispatchGemm (include/mkernel/fused.h) on ranks sharing GPU 0, one thread per rank.
// Each case draws fresh routing (uniform, one hot expert, experts left empty, -1 slots), token
// counts that are not tile multiples, and checks every rank's whole output against a host
// reference derived from the routing alone: counts, offsets, the source and weight of every
// row, every received token row (exact), -1 sources on padding rows, and every element of y
// against a double-precision product of the same bf16/fp16 inputs. Outputs are poisoned
// first. Also: graph capture replayed with new routing, a receiver's bound exceeded (reported
// through ncclCommGetAsyncError, nothing received), ncclCommAbort while a peer never comes,
// and the argument rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#include <chrono>
#include <thread>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "common/test_util.h"
#include "gpu/test_fused_util.cuh"
#include "gpu/test_proc_util.h"
#include "gpu/test_moe_util.h"
#include "gpu/test_thread_team.h"
#include "mkernel/fused.h"

namespace {

using moetest::fromBits;
using moetest::outValue;
using moetest::toBits;

enum Routing { kUniform, kHotExpert, kSomeEmpty };

struct MoeCase {
  int n, epr, k, H, N;
  ncclDataType_t in, out;
  int layout;
  Routing routing;
  int maxT;
};

std::string caseName(const MoeCase& c) {
  return "n" + std::to_string(c.n) + "_epr" + std::to_string(c.epr) + "_k" + std::to_string(c.k) +
         "_H" + std::to_string(c.H) + "_N" + std::to_string(c.N) +
         (c.in == ncclBfloat16 ? "_bf16" : "_f16") + "_out" + std::to_string((int)c.out) +
         (c.layout == ncclFusedLayoutKN ? "_KN" : "_NK") + "_r" + std::to_string((int)c.routing);
}

// One rank's inputs and outputs (host copies of what the inputs hold) and device buffers.
struct RankData {
  int T = 0;
  std::vector<uint16_t> x;   // [T, H]
  std::vector<int32_t> idx;  // [T, k]
  std::vector<float> wts;    // [T, k]
  std::vector<uint16_t> w1;  // [epr][N][H] or [epr][H][N]
  void *dx = nullptr, *dw1 = nullptr, *dxr = nullptr, *dy = nullptr;
  int32_t *didx = nullptr, *dcnt = nullptr, *doff = nullptr, *dsrc = nullptr;
  float *dwts = nullptr, *drw = nullptr;
  size_t maxRows = 0;
  ~RankData() {
    for (void* p : {dx, dw1, dxr, dy, (void*)didx, (void*)dcnt, (void*)doff, (void*)dsrc,
                    (void*)dwts, (void*)drw})
      if (p) cudaFree(p);
  }
};

// A row of the expected layout: (source rank, token, slot).
struct Src {
  int r, t, j;
};

class MoeProblem {
 public:
  explicit MoeProblem(const MoeCase& c) : c_(c), ranks_(c.n) {}
  RankData& rank(int r) { return ranks_[r]; }

  // Fresh routing (and, with `weights`, fresh tokens and expert weights), uploaded; the
  // expected layout of every rank; outputs poisoned. slack: rows beyond the need per rank
  // (negative on rank `tight`: that rank's bound is exceeded); fixedRows > 0: every rank's
  // bound (buffers kept, as a captured graph needs).
  std::string draw(uint64_t seed, bool weights, int slack, int tight = -1, size_t fixedRows = 0) {
    std::mt19937_64 rng(seed);
    const int E = c_.n * c_.epr;
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int r = 0; r < c_.n; ++r) {
      RankData& d = ranks_[r];
      if (weights) {
        d.T = (int)(rng() % (c_.maxT + 1));
        if (r == 0 && d.T == 0) d.T = 1;
        d.x.resize((size_t)d.T * c_.H);
        for (auto& v : d.x) v = toBits(u(rng), c_.in);
        d.w1.resize((size_t)c_.epr * c_.N * c_.H);
        for (auto& v : d.w1) v = toBits(u(rng) * 0.25f, c_.in);
      }
      d.idx.assign((size_t)d.T * c_.k, -1);
      d.wts.resize(d.idx.size());
      const int hot = (int)(rng() % E);
      for (int t = 0; t < d.T; ++t)
        for (int j = 0; j < c_.k; ++j) {
          int e = -1;
          const uint64_t roll = rng() % 16;
          if (roll == 0) {
            e = -1;  // unused slot
          } else if (c_.routing == kHotExpert && roll < 12) {
            e = hot;
          } else if (c_.routing == kSomeEmpty) {
            e = (int)(rng() % E) & ~1;  // odd experts stay empty
          } else {
            e = (int)(rng() % E);
          }
          d.idx[(size_t)t * c_.k + j] = e;
          d.wts[(size_t)t * c_.k + j] = u(rng);
        }
    }
    // Expected layout of every destination.
    expect_.assign(c_.n, {});
    need_.assign(c_.n, 0);
    for (int dst = 0; dst < c_.n; ++dst) {
      std::vector<std::vector<Src>>& ex = expect_[dst];
      ex.assign(c_.epr, {});
      for (int le = 0; le < c_.epr; ++le)
        for (int src = 0; src < c_.n; ++src) {
          const RankData& s = ranks_[src];
          for (int i = 0; i < s.T * c_.k; ++i)
            if (s.idx[i] == dst * c_.epr + le) ex[le].push_back({src, i / c_.k, i % c_.k});
        }
      for (int le = 0; le < c_.epr; ++le) need_[dst] += (ex[le].size() + 127) / 128 * 128;
    }
    for (int r = 0; r < c_.n; ++r) {
      const int64_t want = (int64_t)need_[r] + (r == tight ? -1 : slack);
      const size_t rows = fixedRows > 0 ? fixedRows : (size_t)std::max<int64_t>(want, 1);
      if (rows < need_[r] && r != tight) return "fixedRows below the need of the routing";
      std::string e = upload(ranks_[r], rows, weights);
      if (!e.empty()) return e;
    }
    return "";
  }

  ncclResult_t call(int r, ncclComm_t comm, cudaStream_t s) {
    RankData& d = ranks_[r];
    ncclMoeConfig_t cfg = NCCL_MOE_CONFIG_INITIALIZER;
    cfg.wLayout = c_.layout;
    cfg.outType = c_.out;
    ncclMoeRecv_t recv{d.dxr, d.dy, d.dcnt, d.doff, d.dsrc, d.drw, d.maxRows};
    return ncclMoeDispatchGemm(d.dx, d.didx, d.dwts, d.dw1, &recv, d.T, c_.H, c_.N, c_.n * c_.epr,
                               c_.k, c_.in, &cfg, comm, s);
  }

  // Every output of rank r against the expected layout and a double-precision product.
  std::string check(int r) {
    RankData& d = ranks_[r];
    const int epr = c_.epr;
    std::vector<int32_t> cnt(epr), off(epr + 1), src(d.maxRows * 3);
    std::vector<float> rw(d.maxRows);
    std::vector<uint16_t> xr(d.maxRows * c_.H);
    std::vector<uint8_t> y(d.maxRows * c_.N * fusedtest::esOf(c_.out));
    MOE_CUDA(cudaMemcpy(cnt.data(), d.dcnt, epr * 4, cudaMemcpyDeviceToHost));
    MOE_CUDA(cudaMemcpy(off.data(), d.doff, (epr + 1) * 4, cudaMemcpyDeviceToHost));
    MOE_CUDA(cudaMemcpy(src.data(), d.dsrc, src.size() * 4, cudaMemcpyDeviceToHost));
    MOE_CUDA(cudaMemcpy(rw.data(), d.drw, rw.size() * 4, cudaMemcpyDeviceToHost));
    MOE_CUDA(cudaMemcpy(xr.data(), d.dxr, xr.size() * 2, cudaMemcpyDeviceToHost));
    MOE_CUDA(cudaMemcpy(y.data(), d.dy, y.size(), cudaMemcpyDeviceToHost));
    const std::string who = "rank " + std::to_string(r) + ": ";
    int64_t row = 0;
    for (int le = 0; le < epr; ++le) {
      const std::vector<Src>& ex = expect_[r][le];
      if (cnt[le] != (int)ex.size() || off[le] != row)
        return who + "expert " + std::to_string(le) + ": count " + std::to_string(cnt[le]) +
               " offset " + std::to_string(off[le]) + ", expected " + std::to_string(ex.size()) +
               " at " + std::to_string(row);
      for (size_t i = 0; i < ex.size(); ++i) {
        const int64_t rr = row + (int64_t)i;
        const Src& s = ex[i];
        if (src[rr * 3] != s.r || src[rr * 3 + 1] != s.t || src[rr * 3 + 2] != s.j)
          return who + "row " + std::to_string(rr) + ": source (" + std::to_string(src[rr * 3]) +
                 "," + std::to_string(src[rr * 3 + 1]) + "," + std::to_string(src[rr * 3 + 2]) +
                 "), expected (" + std::to_string(s.r) + "," + std::to_string(s.t) + "," +
                 std::to_string(s.j) + ")";
        const RankData& sd = ranks_[s.r];
        if (rw[rr] != sd.wts[(size_t)s.t * c_.k + s.j])
          return who + "row " + std::to_string(rr) + ": weight differs";
        if (memcmp(&xr[rr * c_.H], &sd.x[(size_t)s.t * c_.H], c_.H * 2) != 0)
          return who + "row " + std::to_string(rr) + ": token row differs";
        for (int col = 0; col < c_.N; ++col) {
          double ref = 0;
          for (int h = 0; h < c_.H; ++h) {
            const size_t wi = c_.layout == ncclFusedLayoutNK ? ((size_t)le * c_.N + col) * c_.H + h
                                                             : ((size_t)le * c_.H + h) * c_.N + col;
            ref += (double)fromBits(sd.x[(size_t)s.t * c_.H + h], c_.in) *
                   (double)fromBits(d.w1[wi], c_.in);
          }
          const double got = outValue(y, (size_t)rr * c_.N + col, c_.out);
          const double tol =
              c_.out == ncclFloat32 ? 1e-3 + 1e-4 * std::fabs(ref) : 2e-2 + 1e-2 * std::fabs(ref);
          if (!(std::fabs(got - ref) <= tol))
            return who + "y[" + std::to_string(rr) + "][" + std::to_string(col) +
                   "] = " + std::to_string(got) + ", expected " + std::to_string(ref);
        }
      }
      const int64_t pad = row + (int64_t)(ex.size() + 127) / 128 * 128;
      for (int64_t rr = row + (int64_t)ex.size(); rr < pad; ++rr)
        if (src[rr * 3] != -1 || src[rr * 3 + 1] != -1 || src[rr * 3 + 2] != -1)
          return who + "padding row " + std::to_string(rr) + " has a source";
      row = pad;
    }
    if (off[epr] != row)
      return who + "rows spanned " + std::to_string(off[epr]) + ", expected " + std::to_string(row);
    return "";
  }

 private:
  std::string upload(RankData& d, size_t rows, bool weights) {
    const int epr = c_.epr;
    if (weights || rows != d.maxRows) {
      for (void** p : {&d.dxr, &d.dy, (void**)&d.dsrc, (void**)&d.drw})
        if (*p) {
          cudaFree(*p);
          *p = nullptr;
        }
      d.maxRows = rows;
      MOE_CUDA(cudaMalloc(&d.dxr, rows * c_.H * 2));
      MOE_CUDA(cudaMalloc(&d.dy, rows * c_.N * fusedtest::esOf(c_.out)));
      MOE_CUDA(cudaMalloc(&d.dsrc, rows * 3 * 4));
      MOE_CUDA(cudaMalloc(&d.drw, rows * 4));
    }
    if (weights) {
      for (void** p :
           {&d.dx, &d.dw1, (void**)&d.didx, (void**)&d.dwts, (void**)&d.dcnt, (void**)&d.doff})
        if (*p) {
          cudaFree(*p);
          *p = nullptr;
        }
      MOE_CUDA(cudaMalloc(&d.dx, std::max<size_t>(d.x.size(), 8) * 2));
      MOE_CUDA(cudaMalloc(&d.dw1, d.w1.size() * 2));
      MOE_CUDA(cudaMalloc(&d.didx, std::max<size_t>(d.idx.size(), 1) * 4));
      MOE_CUDA(cudaMalloc(&d.dwts, std::max<size_t>(d.idx.size(), 1) * 4));
      MOE_CUDA(cudaMalloc(&d.dcnt, epr * 4));
      MOE_CUDA(cudaMalloc(&d.doff, (epr + 1) * 4));
      MOE_CUDA(cudaMemcpy(d.dx, d.x.data(), d.x.size() * 2, cudaMemcpyHostToDevice));
      MOE_CUDA(cudaMemcpy(d.dw1, d.w1.data(), d.w1.size() * 2, cudaMemcpyHostToDevice));
    }
    MOE_CUDA(cudaMemcpy(d.didx, d.idx.data(), d.idx.size() * 4, cudaMemcpyHostToDevice));
    MOE_CUDA(cudaMemcpy(d.dwts, d.wts.data(), d.wts.size() * 4, cudaMemcpyHostToDevice));
    // Poison every output.
    MOE_CUDA(cudaMemset(d.dxr, 0xa5, rows * c_.H * 2));
    MOE_CUDA(cudaMemset(d.dy, 0xa5, rows * c_.N * fusedtest::esOf(c_.out)));
    MOE_CUDA(cudaMemset(d.dsrc, 0x5a, rows * 3 * 4));
    MOE_CUDA(cudaMemset(d.drw, 0x5a, rows * 4));
    MOE_CUDA(cudaMemset(d.dcnt, 0x5a, epr * 4));
    MOE_CUDA(cudaMemset(d.doff, 0x5a, (epr + 1) * 4));
    return "";
  }

  MoeCase c_;
  std::vector<RankData> ranks_;
  std::vector<std::vector<std::vector<Src>>> expect_;  // [dst][expert] rows in order
  std::vector<size_t> need_;
};

using fusedtest::waitRank;

std::string runOnce(gputest::Team& t, MoeProblem& p) {
  std::string err = t.run([&](int r) -> std::string {
    const ncclResult_t res = p.call(r, t.comms[r], t.streams[r]);
    if (res != ncclSuccess)
      return "rank " + std::to_string(r) + ": " + ncclGetErrorString(res) + ": " +
             ncclGetLastError(t.comms[r]);
    return waitRank(r, t.comms[r], t.streams[r]);
  });
  for (int r = 0; r < t.n && err.empty(); ++r) err = p.check(r);
  return err;
}

class MoeDispatchThreads : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
};

TEST_P(MoeDispatchThreads, RandomRoutingEveryRowChecked) {
  const int n = GetParam();
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  const uint64_t seed = mktest::testSeed() ^ (0x30eull * n);
  std::mt19937_64 rng(seed);
  const int eprs[] = {1, 2, 3, 16};
  const int ks[] = {1, 2, 8};
  for (int i = 0; i < 6; ++i) {
    MoeCase c;
    c.n = n;
    c.epr = eprs[(i + n) % 4];
    c.k = ks[i % 3];
    c.H = i % 2 ? 136 : 64;
    c.N = i % 3 == 1 ? 200 : 128;
    c.in = i % 2 ? ncclFloat16 : ncclBfloat16;
    const ncclDataType_t outs[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
    c.out = i < 2 ? c.in : outs[i % 3];
    c.layout = i % 4 == 3 ? ncclFusedLayoutKN : ncclFusedLayoutNK;
    c.routing = (Routing)(i % 3);
    c.maxT = 150;
    MoeProblem p(c);
    ASSERT_EQ(p.draw(rng(), true, (int)(rng() % 200)), "") << caseName(c);
    ASSERT_EQ(runOnce(t, p), "") << caseName(c);
    // Back to back with new routing on the same buffers.
    ASSERT_EQ(p.draw(rng(), false, 0), "") << caseName(c);
    ASSERT_EQ(runOnce(t, p), "") << caseName(c) << " (second call)";
  }
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeDispatchThreads, ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// Captured once per rank thread (after an eager call), replayed with new routing written
// into the same input buffers: every replay checked.
TEST(MoeDispatchGraph, ReplaysWithNewRouting) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 4;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  MoeCase c{n, 2, 4, 64, 128, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 100};
  MoeProblem p(c);
  std::mt19937_64 rng(mktest::testSeed() ^ 0x9a9);
  const size_t rows = 4096;  // > 4 ranks x 100 tokens x 4 slots + 2 experts' padding
  ASSERT_EQ(p.draw(rng(), true, 0, -1, rows), "");
  ASSERT_EQ(runOnce(t, p), "");
  std::vector<cudaGraphExec_t> execs(n, nullptr);
  std::string err = t.run([&](int r) -> std::string {
    cudaGraph_t g = nullptr;
    MOE_CUDA(cudaStreamBeginCapture(t.streams[r], cudaStreamCaptureModeThreadLocal));
    const ncclResult_t res = p.call(r, t.comms[r], t.streams[r]);
    const cudaError_t ce = cudaStreamEndCapture(t.streams[r], &g);
    if (res != ncclSuccess) return "capture: " + std::string(ncclGetLastError(t.comms[r]));
    MOE_CUDA(ce);
    MOE_CUDA(cudaGraphInstantiate(&execs[r], g, 0));
    cudaGraphDestroy(g);
    return "";
  });
  ASSERT_EQ(err, "");
  for (int rep = 0; rep < 3 && err.empty(); ++rep) {
    // New routing, same token counts and buffers.
    err = p.draw(rng(), false, 0, -1, rows);
    if (!err.empty()) break;
    err = t.run([&](int r) -> std::string {
      MOE_CUDA(cudaGraphLaunch(execs[r], t.streams[r]));
      return waitRank(r, t.comms[r], t.streams[r]);
    });
    for (int r = 0; r < n && err.empty(); ++r) err = p.check(r);
    if (!err.empty()) err = "replay " + std::to_string(rep) + ": " + err;
  }
  for (auto x : execs)
    if (x) cudaGraphExecDestroy(x);
  EXPECT_EQ(err, "");
}

// Rank 1's bound is one row short: it receives nothing (counts 0) and its comm reports the
// overflow naming the operation; the other ranks' calls complete and check out.
TEST(MoeDispatchOverflow, ReportedNeverDropped) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const int n = 3;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  MoeCase c{n, 2, 2, 64, 64, ncclBfloat16, ncclFloat32, ncclFusedLayoutNK, kUniform, 120};
  MoeProblem p(c);
  ASSERT_EQ(p.draw(mktest::testSeed() ^ 0x0f1, true, 0, 1), "");
  std::vector<std::string> errs(n);
  std::string err = t.run([&](int r) -> std::string {
    const ncclResult_t res = p.call(r, t.comms[r], t.streams[r]);
    if (res != ncclSuccess) return "call failed: " + std::string(ncclGetErrorString(res));
    errs[r] = waitRank(r, t.comms[r], t.streams[r]);
    return "";
  });
  ASSERT_EQ(err, "");
  EXPECT_EQ(errs[0], "");
  EXPECT_EQ(errs[2], "");
  EXPECT_NE(errs[1].find("MoeDispatchGemm"), std::string::npos) << errs[1];
  EXPECT_NE(errs[1].find("rows"), std::string::npos) << errs[1];
  ncclResult_t a = ncclSuccess;
  ncclCommGetAsyncError(t.comms[1], &a);
  EXPECT_EQ(a, ncclInvalidUsage);
  int32_t cnt[2] = {-7, -7};
  ASSERT_EQ(cudaMemcpy(cnt, p.rank(1).dcnt, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cnt[0], 0);
  EXPECT_EQ(cnt[1], 0);
  EXPECT_EQ(p.check(0), "");
  EXPECT_EQ(p.check(2), "");
}

// Rank 0 calls, rank 1 never does: rank 0's dispatch kernel waits on the device for rank 1's
// counts until ncclCommAbort from another thread ends it (within 5 s, long before
// MKERNEL_TIMEOUT_MS), and the GPU stays usable: a new pair of ranks then dispatches and
// checks out.
TEST(MoeDispatchAbort, PeerNeverComes) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "120000");
  MoeCase c{2, 2, 2, 64, 64, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 50};
  {
    ncclComm_t comms[2] = {nullptr, nullptr};
    int devs[2] = {0, 0};
    ASSERT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess) << ncclGetLastError(nullptr);
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    MoeProblem p(c);
    ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xab0, true, 0), "");
    ASSERT_EQ(p.call(0, comms[0], s), ncclSuccess) << ncclGetLastError(comms[0]);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "the dispatch should wait for rank 1";
    double took = -1;
    ncclResult_t res = ncclInternalError;
    std::thread aborter([&] {
      const auto t0 = gputest::Clock::now();
      res = ncclCommAbort(comms[0]);
      took = gputest::since(t0);
    });
    aborter.join();
    EXPECT_EQ(res, ncclSuccess);
    EXPECT_LT(took, 5.0) << "ncclCommAbort must return promptly";
    EXPECT_TRUE(gputest::streamCompleted(s, 5)) << "the dispatch kernel must leave after the abort";
    EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
    EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the CUDA context must stay usable";
  gputest::Team t(2);
  ASSERT_TRUE(t.ok) << t.why;
  MoeProblem p(c);
  ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xab1, true, 0), "");
  const std::string err = t.run([&](int r) -> std::string {
    const ncclResult_t res = p.call(r, t.comms[r], t.streams[r]);
    if (res != ncclSuccess) return "call failed: " + std::string(ncclGetErrorString(res));
    return waitRank(r, t.comms[r], t.streams[r]);
  });
  ASSERT_EQ(err, "");
  EXPECT_EQ(p.check(0), "");
  EXPECT_EQ(p.check(1), "");
}

// Every rule of the header is checked before any CUDA call (ncclInvalidArgument).
TEST(MoeDispatchArgs, RulesRefusedWithAMessage) {
  MKTEST_REQUIRE_GPU();
  gputest::Team t(2);
  ASSERT_TRUE(t.ok) << t.why;
  MoeCase c{2, 2, 2, 64, 64, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 10};
  MoeProblem p(c);
  ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xa55, true, 0), "");
  RankData& d = p.rank(0);
  ncclMoeRecv_t recv{d.dxr, d.dy, d.dcnt, d.doff, d.dsrc, d.drw, d.maxRows};
  ncclMoeConfig_t cfg = NCCL_MOE_CONFIG_INITIALIZER;
  ncclComm_t comm = t.comms[0];
  cudaStream_t s = t.streams[0];
  auto call = [&](int E, int k, size_t H, ncclDataType_t in, const ncclMoeConfig_t* cf,
                  const ncclMoeRecv_t* rv) {
    return ncclMoeDispatchGemm(d.dx, d.didx, d.dwts, d.dw1, rv, d.T, H, 64, E, k, in, cf, comm, s);
  };
  EXPECT_EQ(call(3, 2, 64, ncclBfloat16, &cfg, &recv), ncclInvalidArgument);  // E % n
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("multiple of nranks"), std::string::npos);
  EXPECT_EQ(call(4, 0, 64, ncclBfloat16, &cfg, &recv), ncclInvalidArgument);     // k
  EXPECT_EQ(call(4, 2, 60, ncclBfloat16, &cfg, &recv), ncclInvalidArgument);     // H % 8
  EXPECT_EQ(call(4, 2, 64, ncclFloat32, &cfg, &recv), ncclInvalidArgument);      // inType
  EXPECT_EQ(call(2048, 2, 64, ncclBfloat16, &cfg, &recv), ncclInvalidArgument);  // E max
  ncclMoeConfig_t bad = cfg;
  bad.magic = 0;
  EXPECT_EQ(call(4, 2, 64, ncclBfloat16, &bad, &recv), ncclInvalidArgument);
  bad = cfg;
  bad.outType = ncclInt8;
  EXPECT_EQ(call(4, 2, 64, ncclBfloat16, &bad, &recv), ncclInvalidArgument);
  ncclMoeRecv_t r2 = recv;
  r2.y = nullptr;
  EXPECT_EQ(call(4, 2, 64, ncclBfloat16, &cfg, &r2), ncclInvalidArgument);
  r2 = recv;
  r2.maxRows = 0;
  EXPECT_EQ(call(4, 2, 64, ncclBfloat16, &cfg, &r2), ncclInvalidArgument);
  EXPECT_EQ(call(4, 2, 64, ncclBfloat16, &cfg, nullptr), ncclInvalidArgument);
  // Nothing ran: the poisoned outputs are untouched.
  int32_t cnt[2];
  ASSERT_EQ(cudaMemcpy(cnt, d.dcnt, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ((uint32_t)cnt[0], 0x5a5a5a5au);
}

}  // namespace
