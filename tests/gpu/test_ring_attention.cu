// ncclRingAttention (include/mkernel/fused.h, "Ring attention") on GPU 0: one rank, ranks
// that are threads sharing the GPU, graph capture, a peer that never comes, and the argument
// rules as the API returns them. Every case draws fresh normal inputs, poisons out and lse
// (and the bytes after them) with NaN, and compares EVERY element of out and lse of EVERY
// rank with the host reference of test_attn_ref.h (its comment derives the tolerance).
// Processes and virtual nodes: test_ring_attention_procs.cu.
//   RingAttnSingle.Shapes/D{64,128,256}_sched{1,0}  head dims, bf16/fp16, causal or not, GQA
//       1/4/8, seqLocal 1, 77, 200, 300 and the tile multiples 128, 512, batch 1-3, lse NULL,
//       explicit scales, algo auto/fused/sequential; the kernel's two schedules
//       (MKERNEL_ATTN_SCHEDULE 1 and 0).
//   RingAttnSingleLong.LongSlice         seqLocal 2024 (many key tiles, online rescaling),
//       both schedules.
//   RingAttnSingleLong.ManyTilesCausal   causal seqLocal 4160-8192, >= 320 tiles, contiguous and
//       zigzag, head dims 64/128/256, both schedules (the key walk's jump to the causal bound).
//   RingAttnThreads.Layouts/n2|n3|n4|n8  causal or not, zigzag or contiguous, GQA 1/4, head
//       dim 64/128 (every pair of them), seqLocal mostly not a tile multiple; the fused
//       kernel's static schedule (MKERNEL_RING_TILE_CLAIM=0).
//   RingAttnThreads.LayoutsTileClaim/n*  the same with tiles claimed from a counter
//       (MKERNEL_RING_TILE_CLAIM=1, the default), head dim 64's two Q buffers
//       (MKERNEL_ATTN_D64_VARIANT=3) and 3 CTAs a rank (MKERNEL_MAX_CTAS), so every attention
//       CTA claims several tiles; both check through the launch counters that the fused
//       cases ran (and claimed, or did not).
//   RingAttnGraph.Replays/n1|n3          eager call, capture, two replays on new inputs.
//   RingAttnD64Variant.Cases/v0..v4      head dim 64's variants (MKERNEL_ATTN_D64_VARIANT):
//       tails, GQA, layouts, many tiles per CTA, the fused ring and the sequential path.
//   RingAttnD128Variant.Cases/v0, v1     head dim 128's variants (MKERNEL_ATTN_D128_VARIANT: 1,
//       the default, 176-key blocks; 0, 128-key blocks), the same cases.
//   RingAttnAbort.*                      only rank 0 calls: ncclCommAbort ends it; or the
//       deadline does and ncclCommGetAsyncError reports it.
//   RingAttnArgs.RefusedWithTheRule      bad headDim, odd zigzag seqLocal.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include "common/test_util.h"
#include "fused/attention/attn.h"  // variantOf, kvRows: the variant tests check they resolve
#include "fused/ops/ring_attn/ring_attn.h"  // ringAttnFusedLaunches
#include "gpu/test_attn_ref.h"
#include "gpu/test_fused_util.cuh"
#include "gpu/test_proc_util.h"
#include "gpu/test_thread_team.h"
#include "mkernel/fused.h"

namespace {

using attntest::Problem;
using attntest::Shape;
using attntest::Stats;
using fusedtest::waitRank;
using fusedtest::waitRanks;

constexpr double kBudget = 1.2e9;  // host reference flops per case (shrink())

std::string failed(int r, ncclComm_t comm, ncclResult_t res) {
  return "rank " + std::to_string(r) + ": ncclRingAttention returned " + ncclGetErrorString(res) +
         ": " + ncclGetLastError(comm);
}

// One rank on GPU 0 (a comm of one), its stream.
struct Solo {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::string why;
  Solo() {
    int dev = 0;
    const ncclResult_t r = ncclCommInitAll(&comm, 1, &dev);
    if (r != ncclSuccess) {
      why = std::string("ncclCommInitAll: ") + ncclGetLastError(nullptr);
      comm = nullptr;
      return;
    }
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
      why = "cudaStreamCreate failed";
  }
  ~Solo() {
    if (comm) why.empty() ? ncclCommDestroy(comm) : ncclCommAbort(comm);
    if (stream) cudaStreamDestroy(stream);
  }
  // One checked call on fresh inputs.
  std::string run(Problem& p, uint64_t seed, Stats* st) {
    std::string e = p.draw(seed);
    if (!e.empty()) return e;
    const ncclResult_t res = p.call(0, comm, stream);
    if (res != ncclSuccess) return failed(0, comm, res);
    e = waitRanks({comm}, {stream}, 60);
    if (!e.empty()) {
      why = e;  // the comm may be broken: abort it at the end
      return e;
    }
    return p.check(0, st);
  }
};

void report(const Shape& c, const Stats& st) {
  printf("[RingAttn] %s: %s\n", attntest::name(c).c_str(), st.str().c_str());
}

// Param: (head dim, MKERNEL_ATTN_SCHEDULE): the kernel's two schedules (1: FlashAttention-3's
// overlapped one, the default; 0: one key block at a time) on the same cases.
class RingAttnSingle : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
  mktest::ScopedEnv schedule_{"MKERNEL_ATTN_SCHEDULE",
                              std::to_string(std::get<1>(GetParam())).c_str()};
};

// Twelve cases per head dim: every seqLocal twice, each with both types, GQA 1/4/8 and
// causal or not over the cases, batch 1-3 (shrunk where the host reference would be slow).
TEST_P(RingAttnSingle, Shapes) {
  const int D = std::get<0>(GetParam());
  const uint64_t seed = mktest::testSeed() ^ (0x5a11ull * D + std::get<1>(GetParam()));
  SCOPED_TRACE("seed " + std::to_string(seed) +
               " (MKTEST_SEED=" + std::to_string(mktest::testSeed()) + " repeats it)");
  Solo solo;
  ASSERT_EQ(solo.why, "");
  const int seqs[] = {1, 77, 200, 300, 128, 512};
  const int gqa[] = {1, 4, 8};
  const float scales[] = {0.0f, 0.5f, 0.0f, 2.0f};  // times 1/sqrt(D); 0: the default
  for (int i = 0; i < 12; ++i) {
    Shape c;
    c.D = D;
    c.S = seqs[(i + i / 6) % 6];
    c.in = i % 2 ? ncclFloat16 : ncclBfloat16;
    c.causal = (i / 2) % 2 == 1;
    c.Hkv = 1 + (i / 3) % 2;
    c.Hq = gqa[i % 3] * c.Hkv;
    c.B = 1 + (i + D / 64) % 3;
    c.lse = i % 5 != 4;
    c.scale = scales[i % 4] / std::sqrt((float)D);
    c.algo = (i + D / 64) % 3;
    attntest::shrink(&c, kBudget);
    Problem p(c);
    Stats st;
    ASSERT_EQ(solo.run(p, seed + i, &st), "") << attntest::name(c);
    report(c, st);
  }
}

INSTANTIATE_TEST_SUITE_P(RingAttn, RingAttnSingle,
                         ::testing::Combine(::testing::Values(64, 128, 256),
                                            ::testing::Values(1, 0)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& i) {
                           return "D" + std::to_string(std::get<0>(i.param)) + "_sched" +
                                  std::to_string(std::get<1>(i.param));
                         });

// A long slice: 16 key tiles of 128 and more, the running maximum rising over many of them.
TEST(RingAttnSingleLong, LongSlice) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const uint64_t seed = mktest::testSeed() ^ 0x10c6;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Solo solo;
  ASSERT_EQ(solo.why, "");
  for (int i = 0; i < 4; ++i) {
    const int schedule = i / 2;
    mktest::ScopedEnv sched("MKERNEL_ATTN_SCHEDULE", std::to_string(schedule).c_str());
    Shape c;
    c.S = 2048 - 24;
    c.D = 128;
    c.Hkv = 1;
    c.Hq = 2;
    c.causal = i % 2;
    c.in = i % 2 ? ncclFloat16 : ncclBfloat16;
    Problem p(c);
    Stats st;
    ASSERT_EQ(solo.run(p, seed + i, &st), "") << attntest::name(c) << " schedule " << schedule;
    printf("[RingAttn] schedule %d: ", schedule);
    report(c, st);
  }
}

// Causal slices long enough that a tile's key walk jumps over many invisible blocks (the
// cursor stops at each source's causal bound, attn.h KvCursor) and enough tiles (>= 320) that
// every persistent CTA runs several, heaviest first: contiguous and zigzag (odd halves, a row
// and key tail), key blocks of 128 (head dims 64, 128) and 64 (256), both schedules. The host
// reference (fp64, every pair) costs about 100 core-seconds in all (timed on a CPU: 42 + 18 +
// 39), spread over the host's cores by parallelFor: a few seconds on a 16-core host.
TEST(RingAttnSingleLong, ManyTilesCausal) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const uint64_t seed = mktest::testSeed() ^ 0xca05a1;
  SCOPED_TRACE("seed " + std::to_string(seed) +
               " (MKTEST_SEED=" + std::to_string(mktest::testSeed()) + " repeats it)");
  Solo solo;
  ASSERT_EQ(solo.why, "");
  struct Case {
    int S, D, Hq, Hkv, layout, schedule;
    ncclDataType_t in;
  };
  const Case cases[] = {
      {8192, 128, 6, 2, ncclRingAttnContiguous, 1, ncclBfloat16},   // 64 x 6 = 384 tiles
      {8190, 64, 5, 1, ncclRingAttnZigzag, 1, ncclFloat16},         // halves of 4095: tails
      {4160, 256, 10, 2, ncclRingAttnContiguous, 0, ncclBfloat16},  // 33 x 10, key blocks of 64
  };
  for (int i = 0; i < 3; ++i) {
    const Case& k = cases[i];
    mktest::ScopedEnv sched("MKERNEL_ATTN_SCHEDULE", std::to_string(k.schedule).c_str());
    Shape c;
    c.S = k.S;
    c.D = k.D;
    c.Hq = k.Hq;
    c.Hkv = k.Hkv;
    c.layout = k.layout;
    c.in = k.in;
    c.causal = true;
    ASSERT_GE(c.B * c.Hq * ((c.S + 127) / 128), 300) << "too few tiles";
    Problem p(c);
    Stats st;
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(solo.run(p, seed + i, &st), "") << attntest::name(c) << " schedule " << k.schedule;
    printf("[RingAttn] schedule %d, %.1f s with the host reference: ", k.schedule,
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    report(c, st);
  }
}

// ---- ranks that are threads ---------------------------------------------------------------
// One call per rank thread, then every rank checked.
std::string runTeam(gputest::Team& t, Problem& p, Stats* st) {
  std::string err = t.run([&](int r) {
    return fusedtest::callAndWaitRank(r, t.comms[r], t.streams[r],
                                      p.call(r, t.comms[r], t.streams[r]));
  });
  for (int r = 0; r < t.n && err.empty(); ++r) err = p.check(r, st);
  return err;
}

class RingAttnThreads : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
};

// Causal or not, zigzag or contiguous, GQA 1/4 and head dim 64/128 on n ranks, back to back
// on one team: the 8 cases where head dim 128 <=> causal ^ zigzag ^ GQA 4, so every pair of
// the four factors appears in all its 4 combinations. seqLocal from a list of even lengths
// (zigzag needs them) with one tile multiple.
// claim: whether the fused cases' kernels must claim their tiles (checked through the launch
// counter, so a schedule switch that had no effect fails).
void runLayouts(int n, uint64_t salt, bool claim) {
  const uint64_t seed = mktest::testSeed() ^ (salt * n);
  const uint64_t claims0 = mk::fused::ringAttnFusedLaunches(mk::fused::kRingLayoutClaim);
  const uint64_t fused0 = mk::fused::ringAttnFusedLaunches(mk::fused::kRingLayoutClique);
  SCOPED_TRACE("seed " + std::to_string(seed) +
               " (MKTEST_SEED=" + std::to_string(mktest::testSeed()) + " repeats it)");
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  const int seqs[] = {66, 150, 128, 94, 200, 34, 176, 2};
  for (int i = 0; i < 8; ++i) {
    Shape c;
    c.n = n;
    c.causal = i & 1;
    c.layout = i & 2 ? ncclRingAttnZigzag : ncclRingAttnContiguous;
    c.Hkv = 2;
    c.Hq = (i & 4 ? 4 : 1) * c.Hkv;
    c.D = ((i ^ (i >> 1) ^ (i >> 2)) & 1) ? 128 : 64;
    c.S = seqs[(i + n) % 8];
    c.B = 1 + (i + n) % 2;
    c.in = (i + n) % 3 == 1 ? ncclFloat16 : ncclBfloat16;
    c.lse = (i + n) % 7 != 3;
    c.algo = (i / 2 + n) % 3;
    attntest::shrink(&c, kBudget);
    Problem p(c);
    ASSERT_EQ(p.draw(seed + i), "") << attntest::name(c);
    Stats st;
    ASSERT_EQ(runTeam(t, p, &st), "") << attntest::name(c);
    report(c, st);
  }
  const uint64_t fused = mk::fused::ringAttnFusedLaunches(mk::fused::kRingLayoutClique) - fused0;
  const uint64_t claims = mk::fused::ringAttnFusedLaunches(mk::fused::kRingLayoutClaim) - claims0;
  EXPECT_GT(fused, 0u) << "no case ran the fused kernel";
  EXPECT_EQ(claims, claim ? fused : 0u) << "fused launches that claimed their tiles";
}

// The fused kernel's static schedule (MKERNEL_RING_TILE_CLAIM=0).
TEST_P(RingAttnThreads, Layouts) {
  mktest::ScopedEnv claim("MKERNEL_RING_TILE_CLAIM", "0");
  runLayouts(GetParam(), 0x7ea4ull, false);
}

// The same with the attention CTAs claiming their tiles from a counter (the fused kernel's
// dynamic schedule, the default; the sequential cases run the stand-alone kernel's static
// one), head dim 64 in its variant with two Q buffers (the tile words of both).
TEST_P(RingAttnThreads, LayoutsTileClaim) {
  mktest::ScopedEnv claim("MKERNEL_RING_TILE_CLAIM", "1");
  mktest::ScopedEnv d64("MKERNEL_ATTN_D64_VARIANT", "3");
  // Three CTAs a rank (one copying, two attention CTAs in the fused kernel), so each attention
  // CTA claims several tiles and both Q buffers' words carry tiles and the end marker.
  mktest::ScopedEnv ctas("MKERNEL_MAX_CTAS", "3");
  runLayouts(GetParam(), 0x7ea5ull, true);
}

INSTANTIATE_TEST_SUITE_P(RingAttn, RingAttnThreads, ::testing::Values(2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// ---- graph capture --------------------------------------------------------------------------
class RingAttnGraph : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
};

// One eager call (it loads the kernels: lazy loading may synchronise, which capture forbids),
// then one call per rank thread captured, replayed twice with new q, k, v written into the
// same buffers; every element checked after each.
TEST_P(RingAttnGraph, Replays) {
  const int n = GetParam();
  const uint64_t seed = mktest::testSeed() ^ (0x96a9ull + n);
  SCOPED_TRACE("seed " + std::to_string(seed));
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  Shape c;
  c.n = n;
  c.S = n == 1 ? 300 : 150;
  c.D = n == 1 ? 64 : 128;
  c.Hkv = 2;
  c.Hq = 8;
  c.causal = true;
  c.layout = n == 1 ? ncclRingAttnContiguous : ncclRingAttnZigzag;
  c.in = n == 1 ? ncclFloat16 : ncclBfloat16;
  // n = 4: the fused ring kernel (its clique block exists after the eager call)
  c.algo = n == 4 ? ncclFusedFused : ncclFusedAuto;
  Problem p(c);
  ASSERT_EQ(p.draw(seed), "");
  Stats st;
  ASSERT_EQ(runTeam(t, p, &st), "") << "eager call";
  std::vector<cudaGraphExec_t> execs(n, nullptr);
  std::string err = t.run([&](int r) -> std::string {
    cudaGraph_t g = nullptr;
    MOE_CUDA(cudaStreamBeginCapture(t.streams[r], cudaStreamCaptureModeThreadLocal));
    const ncclResult_t res = p.call(r, t.comms[r], t.streams[r]);
    const cudaError_t ce = cudaStreamEndCapture(t.streams[r], &g);
    if (res != ncclSuccess) return "capture: " + failed(r, t.comms[r], res);
    MOE_CUDA(ce);
    const cudaError_t ie = cudaGraphInstantiate(&execs[r], g, 0);
    cudaGraphDestroy(g);
    MOE_CUDA(ie);
    return "";
  });
  for (int rep = 0; rep < 2 && err.empty(); ++rep) {
    err = p.draw(seed + 1 + rep);
    if (err.empty())
      err = t.run([&](int r) -> std::string {
        MOE_CUDA(cudaGraphLaunch(execs[r], t.streams[r]));
        return waitRank(r, t.comms[r], t.streams[r]);
      });
    for (int r = 0; r < n && err.empty(); ++r) err = p.check(r, &st);
    if (!err.empty()) err = "replay " + std::to_string(rep) + ": " + err;
  }
  for (auto x : execs)
    if (x) cudaGraphExecDestroy(x);
  EXPECT_EQ(err, "") << attntest::name(c);
  report(c, st);
}

INSTANTIATE_TEST_SUITE_P(RingAttn, RingAttnGraph, ::testing::Values(1, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// ---- variants (MKERNEL_ATTN_D64_VARIANT, MKERNEL_ATTN_D128_VARIANT) -----------------------
// Head dim 64's variants (1, the default: 192-key blocks, 2: 4 stages, 3: two Q buffers, 4:
// three consumer WGs with 192-row tiles) and head dim 128's (1, the default: 176-key blocks in
// 2 stages; 0: 128-key blocks in 3); the defaults run in every other test. With the overlapped
// schedule the variants belong to. One rank: tails of the variant's key and query blocks, GQA
// 1/4/8, both types, causal or not, contiguous and zigzag; two shapes of 280+ tiles, so each
// persistent CTA runs several tiles (the Q buffers, the ring's phases across tiles); then 3 rank
// threads on the fused ring kernel (which runs variant 0 where the variant is not built for it:
// head dim 64's 4) and the sequential path (the stand-alone kernel, in the variant).
void variantCases(int D, int v, uint64_t seed) {
  Solo solo;
  ASSERT_EQ(solo.why, "");
  const int seqs64[] = {1, 77, 191, 193, 300, 384, 450, 576};
  const int seqs128[] = {1, 77, 175, 177, 300, 352, 450, 528};
  const int gqa[] = {1, 4, 8};
  for (int i = 0; i < 8; ++i) {
    Shape c;
    c.D = D;
    c.S = D == 64 ? seqs64[i] : seqs128[i];
    c.in = i % 2 ? ncclFloat16 : ncclBfloat16;
    c.causal = (i / 2) % 2 == 1;
    c.layout = (i % 4 == 3 && c.S % 2 == 0) ? ncclRingAttnZigzag : ncclRingAttnContiguous;
    c.Hkv = 1 + i % 2;
    c.Hq = gqa[i % 3] * c.Hkv;
    c.B = 1 + i % 3;
    c.lse = i != 5;
    attntest::shrink(&c, kBudget);
    Problem p(c);
    Stats st;
    ASSERT_EQ(solo.run(p, seed + i, &st), "") << attntest::name(c);
    report(c, st);
  }
  struct Many {
    int B, S, Hq, Hkv, layout;
    bool causal;
    ncclDataType_t in;
  };
  const Many many[] = {
      // Tiles of 128 rows (of 192 in variant 4): 16 (11) x 32 = 512 (352), 9 (6) x 48 = 432 (288).
      {2, 2046, 16, 4, ncclRingAttnZigzag, true, ncclBfloat16},
      {3, 1150, 16, 4, ncclRingAttnContiguous, false, ncclFloat16},
  };
  for (int i = 0; i < 2; ++i) {
    Shape c;
    c.D = D;
    c.B = many[i].B;
    c.S = many[i].S;
    c.Hq = many[i].Hq;
    c.Hkv = many[i].Hkv;
    c.layout = many[i].layout;
    c.causal = many[i].causal;
    c.in = many[i].in;
    Problem p(c);
    Stats st;
    ASSERT_EQ(solo.run(p, seed + 100 + i, &st), "") << attntest::name(c);
    report(c, st);
  }
  gputest::Team t(3);
  ASSERT_TRUE(t.ok) << t.why;
  for (int i = 0; i < 4; ++i) {
    Shape c;
    c.n = 3;
    c.D = D;
    c.S = i % 2 ? 194 : 130;
    c.causal = i & 1;
    c.layout = i & 2 ? ncclRingAttnZigzag : ncclRingAttnContiguous;
    c.Hkv = 2;
    c.Hq = (i == 2 ? 4 : 1) * c.Hkv;
    c.B = 1 + i % 2;
    c.in = i == 1 ? ncclFloat16 : ncclBfloat16;
    c.algo = i < 3 ? ncclFusedFused : ncclFusedSequential;
    Problem p(c);
    ASSERT_EQ(p.draw(seed + 200 + i), "") << attntest::name(c);
    Stats st;
    ASSERT_EQ(runTeam(t, p, &st), "") << attntest::name(c);
    report(c, st);
  }
}

class RingAttnD64Variant : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
  mktest::ScopedEnv schedule_{"MKERNEL_ATTN_SCHEDULE", "1"};
  mktest::ScopedEnv variant_{"MKERNEL_ATTN_D64_VARIANT", std::to_string(GetParam()).c_str()};
};

TEST_P(RingAttnD64Variant, Cases) {
  const int v = GetParam();
  const uint64_t seed = mktest::testSeed() ^ (0xd64ull * (v + 1));
  SCOPED_TRACE("seed " + std::to_string(seed) + " variant " + std::to_string(v) +
               " (MKTEST_SEED=" + std::to_string(mktest::testSeed()) + " repeats it)");
  {
    // The parameter reaches the engine (else this test would check variant 0 three times).
    mk::attn::AttnArgs a;
    a.D = 64;
    ASSERT_EQ(mk::attn::variantOf(a), v);
    ASSERT_EQ(mk::attn::kvRows(64, v), v == 1 ? 192 : 128);
    ASSERT_EQ(mk::attn::qRows(64, v), v == 4 ? 192 : 128);
  }
  variantCases(64, v, seed);
}

INSTANTIATE_TEST_SUITE_P(RingAttn, RingAttnD64Variant, ::testing::Values(0, 1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "v" + std::to_string(i.param);
                         });

class RingAttnD128Variant : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
  mktest::ScopedEnv schedule_{"MKERNEL_ATTN_SCHEDULE", "1"};
  mktest::ScopedEnv variant_{"MKERNEL_ATTN_D128_VARIANT", std::to_string(GetParam()).c_str()};
};

TEST_P(RingAttnD128Variant, Cases) {
  const int v = GetParam();
  const uint64_t seed = mktest::testSeed() ^ (0xd128ull * (v + 1));
  SCOPED_TRACE("seed " + std::to_string(seed) + " variant " + std::to_string(v) +
               " (MKTEST_SEED=" + std::to_string(mktest::testSeed()) + " repeats it)");
  {
    // The parameter reaches the stand-alone kernel and the fused ring kernel alike.
    mk::attn::AttnArgs a;
    a.D = 128;
    ASSERT_EQ(mk::attn::variantOf(a), v);
    ASSERT_EQ(mk::attn::kvRows(128, v), v == 1 ? 176 : 128);
    ASSERT_EQ(mk::attn::qRows(128, v), 128);
    uint64_t ready = 0;
    a.hooks.ready = &ready;
    ASSERT_EQ(mk::attn::variantOf(a), v);
  }
  variantCases(128, v, seed);
}

INSTANTIATE_TEST_SUITE_P(RingAttn, RingAttnD128Variant, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "v" + std::to_string(i.param);
                         });

// ---- a peer that never comes ----------------------------------------------------------------
// Both paths wait for the missing peer: the sequential one in its AllGather, the fused one in
// its communication CTAs (the peer's clique slot) and attention producer (ready flags).
class RingAttnAbort : public ::testing::TestWithParam<int> {};

Shape abortShape(int algo) {
  Shape c;
  c.algo = algo;
  c.n = 2;
  c.S = 256;
  c.D = 128;
  c.Hkv = 2;
  c.Hq = 8;
  c.causal = true;
  c.layout = ncclRingAttnZigzag;
  return c;
}

// Rank 0 of a pair calls, rank 1 never does; ncclCommAbort from another thread ends the wait
// (on the host or on the device) within 5 s, long before MKERNEL_TIMEOUT_MS; the call returns
// and the stream drains; the GPU then runs a checked call on a fresh comm. The call runs on
// its own thread: if it waits on the host for rank 1 (the in-process rendezvous), the abort
// must end that wait too.
TEST_P(RingAttnAbort, AbortEndsTheWait) {
  MKTEST_REQUIRE_GPU();
  const uint64_t seed = mktest::testSeed() ^ 0xab07;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Shape c = abortShape(GetParam());
  {
    mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "120000");
    ncclComm_t comms[2] = {nullptr, nullptr};
    int devs[2] = {0, 0};
    ASSERT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess) << ncclGetLastError(nullptr);
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    // Shared with the caller thread, which is leaked (with its buffers) if it never returns.
    struct Shared {
      explicit Shared(const Shape& c) : p(c, 0) {}
      Problem p;
      std::atomic<bool> returned{false};
      ncclResult_t res = ncclInternalError;
    };
    auto sh = std::make_shared<Shared>(c);
    ASSERT_EQ(sh->p.draw(seed), "");
    ncclComm_t c0 = comms[0];
    std::thread caller([sh, c0, s] {
      sh->res = sh->p.call(0, c0, s);
      sh->returned = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    const bool returnedBefore = sh->returned;
    const bool busy = cudaStreamQuery(s) == cudaErrorNotReady;
    EXPECT_TRUE(!returnedBefore || busy) << "the call returned and its stream is idle although "
                                            "rank 1 never called (res "
                                         << ncclGetErrorString(sh->res) << ")";
    const auto t0 = gputest::Clock::now();
    ncclResult_t ar = ncclInternalError;
    std::thread aborter([&] { ar = ncclCommAbort(c0); });
    aborter.join();
    const double abortS = gputest::since(t0);
    EXPECT_EQ(ar, ncclSuccess);
    EXPECT_LT(abortS, 5.0) << "ncclCommAbort must return promptly";
    while (!sh->returned && gputest::since(t0) < 10)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const bool returned = sh->returned;
    if (returned)
      caller.join();
    else
      caller.detach();
    EXPECT_TRUE(returned) << "ncclRingAttention still inside 10 s after ncclCommAbort";
    EXPECT_TRUE(gputest::streamCompleted(s, 5)) << "the kernels must leave after the abort";
    printf("[RingAttnAbort] call %s before the abort, returned %s; abort %.3f s\n",
           returnedBefore ? "returned" : "still waiting on the host",
           returned ? ncclGetErrorString(sh->res) : "never", abortS);
    EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
    if (returned) EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
    ASSERT_TRUE(returned);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the CUDA context must stay usable";
  gputest::Team t(2);
  ASSERT_TRUE(t.ok) << t.why;
  Problem p(c);
  ASSERT_EQ(p.draw(seed + 1), "");
  EXPECT_EQ(runTeam(t, p, nullptr), "") << "a fresh pair after the abort";
}

// Rank 0 of a pair of thread ranks calls, rank 1's thread never does: the deadline
// (MKERNEL_TIMEOUT_MS = 2 s) ends the wait, on the host or on the device; the call returns,
// the stream drains within 10 s, and ncclCommGetAsyncError reports an error naming rank 1.
TEST_P(RingAttnAbort, DeadlineReportsTheMissingPeer) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "2000");
  const uint64_t seed = mktest::testSeed() ^ 0xdead;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Shape c = abortShape(GetParam());
  gputest::Team t(2);
  ASSERT_TRUE(t.ok) << t.why;
  Problem p(c);
  ASSERT_EQ(p.draw(seed), "");
  ncclResult_t res = ncclSuccess, async = ncclSuccess;
  std::string msg;
  double callS = -1, doneS = -1, errS = -1;
  const std::string err = t.run([&](int r) -> std::string {
    if (r != 0) return "";
    const auto t0 = gputest::Clock::now();
    res = p.call(0, t.comms[0], t.streams[0]);
    callS = gputest::since(t0);
    if (!gputest::streamCompleted(t.streams[0], 10)) {
      // Still running, or ended with a CUDA error: either way not what the test expects.
      const cudaError_t q = cudaStreamQuery(t.streams[0]);
      if (q == cudaErrorNotReady) return "the stream is still busy 10 s after the call";
      return std::string("the stream ended with a CUDA error: ") + cudaGetErrorString(q);
    }
    doneS = gputest::since(t0);
    const ncclResult_t q = gputest::pollAsyncError(t.comms[0], t0, 10, &async);
    if (q != ncclSuccess) return std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(q);
    errS = gputest::since(t0);
    msg = ncclGetLastError(t.comms[0]);
    return "";
  });
  printf(
      "[RingAttnAbort] call returned %s after %.3f s, stream done after %.3f s, async %s after "
      "%.3f s: %s\n",
      ncclGetErrorString(res), callS, doneS, ncclGetErrorString(async), errS, msg.c_str());
  // The comms are broken now: aborted here rather than destroyed by the team.
  t.run([&](int r) -> std::string {
    ncclCommAbort(t.comms[r]);
    t.forget(r);
    return "";
  });
  ASSERT_EQ(err, "");
  EXPECT_NE(res, ncclInvalidArgument) << "the arguments are good";
  EXPECT_LT(callS, 10.0) << "the call must not wait on the host beyond the deadline";
  EXPECT_NE(async, ncclSuccess) << "no asynchronous error after the deadline";
  EXPECT_NE(async, ncclInProgress);
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(RingAttn, RingAttnAbort,
                         ::testing::Values((int)ncclFusedSequential, (int)ncclFusedFused),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return i.param == ncclFusedFused ? "fused" : "sequential";
                         });

// ---- argument rules reach the API -------------------------------------------------------------
// Two rules refused before any CUDA work (ncclInvalidArgument, a message naming the rule; the
// rule matrix is a CPU unit test), then a good call on the same comm checks out.
TEST(RingAttnArgs, RefusedWithTheRule) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  Solo solo;
  ASSERT_EQ(solo.why, "");
  Shape c;
  c.S = 77;
  c.D = 64;
  c.Hq = 4;
  c.Hkv = 2;
  Problem p(c);
  ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xa6a6), "");
  ncclRingAttnConfig_t cfg = p.config();
  auto refused = [&](int headDim, int layout, const char* what) {
    cfg.seqLayout = layout;
    const ncclResult_t res =
        ncclRingAttention(p.q(0), p.k(0), p.v(0), p.out(0), p.lse(0), c.B, c.S, c.Hq, c.Hkv,
                          headDim, c.in, &cfg, solo.comm, solo.stream);
    EXPECT_EQ(res, ncclInvalidArgument) << what;
    const std::string m = ncclGetLastError(solo.comm);
    EXPECT_NE(m.find(what), std::string::npos) << what << ": " << m;
    EXPECT_NE(m.find("ncclRingAttention"), std::string::npos) << m;
  };
  refused(96, ncclRingAttnContiguous, "headDim=96");
  refused(64, ncclRingAttnZigzag, "seqLocal=77");  // odd
  ASSERT_TRUE(gputest::streamCompleted(solo.stream, 5));
  // Nothing ran: the poisoned outputs are untouched.
  uint32_t o = 0, l = 0;
  ASSERT_EQ(mktest::syncMemcpy(&o, p.out(0), 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(mktest::syncMemcpy(&l, p.lse(0), 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(o, 0xffffffffu);
  EXPECT_EQ(l, 0xffffffffu);
  Stats st;
  EXPECT_EQ(solo.run(p, mktest::testSeed() ^ 0xa6a7, &st), "") << "a good call after the refusals";
}

}  // namespace
