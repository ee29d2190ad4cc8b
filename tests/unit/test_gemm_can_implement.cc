// CPU tests of the GEMM engine's host-side checks and automatic choices: no CUDA call is made,
// so these run on machines without a GPU (the fused SM-split cost model's tests are in
// test_fused_cost_model.cc).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>

#include "common/test_util.h"
#include "fused/gemm/gemm.h"

using mk::gemm::BLayout;
using mk::gemm::DType;
using mk::gemm::GemmArgs;

namespace {

alignas(256) char gBuf[4096];

GemmArgs good() {
  GemmArgs a;
  a.M = 1000;
  a.N = 3000;
  a.K = 512;
  a.A = gBuf;
  a.B = gBuf + 256;
  a.D = gBuf + 512;
  return a;
}

void expectReject(const GemmArgs& a, const char* fragment) {
  std::string why;
  EXPECT_FALSE(mk::gemm::canImplement(a, &why));
  EXPECT_NE(why.find(fragment), std::string::npos) << "message: " << why;
}

// `a` with each 16-bit D type and B layout, alpha -2 and beta 0.5: every one accepted.
void expectAcceptsEvery16BitD(GemmArgs a) {
  std::string why;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (BLayout bl : {BLayout::kKN, BLayout::kNK}) {
      a.dType = dt;
      a.bLayout = bl;
      a.beta = 0.5f;
      a.alpha = -2.0f;
      EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
    }
  }
}

}  // namespace

TEST(GemmCanImplement, AcceptsSupportedShapesAndTypes) {
  std::string why;
  for (DType ab : {DType::kBF16, DType::kF16})
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32})
      for (BLayout bl : {BLayout::kKN, BLayout::kNK}) {
        GemmArgs a = good();
        a.abType = ab;
        a.dType = dt;
        a.bLayout = bl;
        a.N = bl == BLayout::kKN ? 3000 : 3001;  // any N with [N,K]; tails in M and N
        a.M = 1;
        EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
      }
  GemmArgs a = good();
  a.beta = 0.5f;  // C defaults to D
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  a.ldd = 3001;  // unaligned rows: direct-store epilogue, still supported
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
}

TEST(GemmCanImplement, RejectsWithClearMessages) {
  GemmArgs a = good();
  a.K = 100;
  expectReject(a, "multiple of 8");
  a = good();
  a.M = 0;
  expectReject(a, "positive");
  a = good();
  a.abType = DType::kF32;
  expectReject(a, "bf16 or fp16");
  a = good();
  a.A = nullptr;
  expectReject(a, "null");
  a = good();
  a.A = gBuf + 8;
  expectReject(a, "16-byte aligned");
  a = good();
  a.lda = 500;
  expectReject(a, "lda");
  a = good();
  a.lda = 516;
  expectReject(a, "lda");
  a = good();
  a.bLayout = BLayout::kKN;
  a.N = 3001;  // ldb defaults to N: rows not 16-byte multiples
  expectReject(a, "B[K,N]");
  a = good();
  a.bLayout = BLayout::kNK;
  a.ldb = 100;
  expectReject(a, "B[N,K]");
  a = good();
  a.ldd = 10;
  expectReject(a, "ldd");
  a = good();
  a.beta = 1.0f;
  a.ldc = 7;
  expectReject(a, "ldc");
  a = good();
  a.smBudget = -1;
  expectReject(a, "smBudget");
  a = good();
  a.hooks.rowReady = reinterpret_cast<const uint64_t*>(gBuf);
  a.hooks.rowsPerFlag = 0;
  expectReject(a, "rowsPerFlag");
  a = good();
  a.pipeline = 7;
  expectReject(a, "pipeline=7");
  a = good();
  a.pipeline = 2;
  a.dType = DType::kF32;
  expectReject(a, "16-bit output");
  // Grouped GEMMs.
  const int32_t* dev = reinterpret_cast<const int32_t*>(gBuf);
  a = good();
  a.groups.num = 3;
  expectReject(a, "rowStart and groups.rowCount");
  a.groups.rowStart = dev;
  a.groups.rowCount = dev;
  EXPECT_TRUE(mk::gemm::canImplement(a, nullptr));
  a.groups.num = 257;
  expectReject(a, "groups.num=257");
  a.groups.num = 3;
  a.hooks.tileOrder = dev;
  expectReject(a, "no per-tile hooks");
  a.hooks.tileOrder = nullptr;
  a.hooks.tileDone = reinterpret_cast<uint64_t*>(gBuf);
  expectReject(a, "no per-tile hooks");
  // Row-count mode (a fused MoE layer's second GEMM waits for whole row blocks of the first).
  a.hooks.tileDoneRows = true;
  EXPECT_TRUE(mk::gemm::canImplement(a, nullptr));
  a.hooks.seqBase = reinterpret_cast<const uint64_t*>(gBuf);
  expectReject(a, "no hooks.seqBase");
  a.hooks.seqBase = nullptr;
  a.hooks.tileDone = nullptr;
  expectReject(a, "it needs hooks.tileDone");
  a.hooks.tileDoneRows = false;
  // The rows-ready hook works in the packed row space (a fused MoE dispatch releases it).
  a.hooks.rowReady = reinterpret_cast<const uint64_t*>(gBuf);
  EXPECT_TRUE(mk::gemm::canImplement(a, nullptr));
  a.hooks.rowReady = nullptr;
  a.pipeline = 2;  // the wide staging, grouped too (16-bit D)
  EXPECT_TRUE(mk::gemm::canImplement(a, nullptr));
  a.pipeline = 0;
  a.groups.strideB = 8;
  expectReject(a, "groups.strideB=8");
}

// The SwiGLU epilogue (GemmArgs::swiglu): D is [M, N/2]; its rules, each with its message.
TEST(GemmCanImplement, SwigluEpilogueRules) {
  const int32_t* dev = reinterpret_cast<const int32_t*>(gBuf);
  GemmArgs a = good();
  a.N = 4096;
  a.swiglu = true;
  expectReject(a, "grouped GEMMs only");
  a.groups.num = 4;
  a.groups.rowStart = dev;
  a.groups.rowCount = dev;
  std::string why;
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  EXPECT_EQ(mk::gemm::outCols(a), 2048);
  EXPECT_EQ(mk::gemm::tilesN(a), 16);  // 128 output columns a tile
  a.ldd = 2048;                        // D's width, not N
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  a.ldd = 2047;
  expectReject(a, "ldd=2047");
  a.ldd = 0;
  a.bLayout = BLayout::kKN;
  expectReject(a, "[N,K] layout");
  a.bLayout = BLayout::kNK;
  a.N = 4104;  // output width 2052: not a multiple of 8
  expectReject(a, "% 16 == 0");
  a.N = 4096;
  a.dType = DType::kF32;
  expectReject(a, "16-bit D");
  a.dType = DType::kF16;
  a.beta = 1.0f;
  expectReject(a, "beta must be 0");
  a.beta = 0.0f;
  a.N = 208;  // I = 104 is not a tile multiple: tails
  a.groups.strideB = 0;
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  EXPECT_EQ(mk::gemm::tilesN(a), 1);
}

// Ping-pong consumers (GemmArgs::pipeline = 3): what gemm_pingpong.cuh implements is accepted,
// every other feature refused with a message naming the pipeline (never run wrong).
TEST(GemmCanImplement, PingPongRules) {
  const int32_t* dev = reinterpret_cast<const int32_t*>(gBuf);
  std::string why;
  GemmArgs a = good();
  a.pipeline = 3;
  expectAcceptsEvery16BitD(a);
  // Hooks that only change the tile list or gate the loads.
  a.hooks.rowReady = reinterpret_cast<const uint64_t*>(gBuf);
  a.hooks.tileOrder = dev;
  a.hooks.rowBlockOffset = 3;
  a.hooks.seqBase = reinterpret_cast<const uint64_t*>(gBuf);
  a.smBudget = 1;
  a.cluster = 1;
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  a = good();
  a.pipeline = 3;
  a.dType = DType::kF32;
  expectReject(a, "pipeline 3 (ping-pong consumers) needs a 16-bit output");
  // Grouped GEMMs run (session 31), the SwiGLU epilogue does not.
  a = good();
  a.pipeline = 3;
  a.groups.num = 2;
  a.groups.rowStart = dev;
  a.groups.rowCount = dev;
  for (BLayout bl : {BLayout::kKN, BLayout::kNK}) {
    a.bLayout = bl;
    EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  }
  a.bLayout = BLayout::kNK;
  a.N = 2 * a.N;
  a.swiglu = true;
  expectReject(a, "pipeline 3 (ping-pong consumers) takes no SwiGLU epilogue");
  a = good();
  a.pipeline = 3;
  a.dTiled = true;
  expectReject(a, "pipeline 3 (ping-pong consumers) takes no tile-by-tile D");
  a = good();
  a.pipeline = 3;
  a.hooks.tileDone = reinterpret_cast<uint64_t*>(gBuf);
  expectReject(a, "takes no tileDone hook");
  // Ping-pong CTA pairs (session 43): the pairs' rules, for both B layouts.
  a = good();
  a.pipeline = 3;
  a.cluster = 2;
  for (BLayout bl : {BLayout::kKN, BLayout::kNK}) {
    a.bLayout = bl;
    EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  }
  a.hooks.rowReady = reinterpret_cast<const uint64_t*>(gBuf);
  a.hooks.rowsPerFlag = 128;
  expectReject(a, "no fused-operator hooks");
  a.hooks.rowReady = nullptr;
  a.groups.num = 2;
  a.groups.rowStart = dev;
  a.groups.rowCount = dev;
  expectReject(a, "grouped GEMMs not on pipeline 3");
  a.groups.num = 0;
  a.smBudget = 1;
  expectReject(a, "smBudget 0 or >= 2");
  a.smBudget = 0;
  a.tileClaim = reinterpret_cast<int32_t*>(gBuf + 1024);
  expectReject(a, "no tileClaim");
  a.tileClaim = nullptr;
  a.cluster = 0;
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
}

// Ping-pong consumers with 192-column units (pipeline 4): plain 16-bit GEMMs, both layouts,
// alpha and beta; every other feature refused with its rule.
TEST(GemmCanImplement, PingPong192Rules) {
  const int32_t* dev = reinterpret_cast<const int32_t*>(gBuf);
  std::string why;
  GemmArgs a = good();
  a.pipeline = 4;
  a.smBudget = 1;
  expectAcceptsEvery16BitD(a);
  EXPECT_EQ(mk::gemm::tilesN(a), (3000 + 191) / 192);  // the walk's 192-column units
  a = good();
  a.pipeline = 4;
  a.dType = DType::kF32;
  expectReject(a, "pipeline 4 (ping-pong, 192-column units) needs a 16-bit output");
  a = good();
  a.pipeline = 4;
  a.groups.num = 2;
  a.groups.rowStart = dev;
  a.groups.rowCount = dev;
  expectReject(a, "runs plain GEMMs");
  a = good();
  a.pipeline = 4;
  a.cluster = 2;
  expectReject(a, "runs plain GEMMs");
  a.cluster = 1;
  a.streamK = 1;
  expectReject(a, "runs plain GEMMs");
  a.streamK = 0;
  a.dTiled = true;
  expectReject(a, "runs plain GEMMs");
  a.dTiled = false;
  a.tileClaim = reinterpret_cast<int32_t*>(gBuf + 1024);
  expectReject(a, "walks the static schedule");
  a.tileClaim = nullptr;
  a.hooks.rowReady = reinterpret_cast<const uint64_t*>(gBuf);
  expectReject(a, "takes no fused-operator hooks");
  a.hooks.rowReady = nullptr;
  a.hooks.tileOrder = dev;
  expectReject(a, "takes no fused-operator hooks");
  a.hooks.tileOrder = nullptr;
  a.hooks.rowBlockOffset = 2;
  expectReject(a, "takes no fused-operator hooks");
  a.hooks.rowBlockOffset = 0;
  a.ldd = a.N + 4;  // 8-byte padding: no 16-byte store of 8 columns lines up with a row
  expectReject(a, "stores D from registers, 8 columns a 16-byte store");
  a.ldd = 0;
  a.pipeline = 7;
  expectReject(a, "must be 0 (automatic)");
  a.pipeline = 4;
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
}

// CTA pairs (GemmArgs::cluster): 16-bit GEMMs without SwiGLU or hooks (grouped ones on the
// cooperative pipelines only), each rule with its message.
TEST(GemmCanImplement, ClusterPairRules) {
  const int32_t* dev = reinterpret_cast<const int32_t*>(gBuf);
  GemmArgs a = good();
  std::string why;
  for (int c : {0, 1, 2}) {
    a.cluster = c;
    EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << c << ": " << why;
  }
  a.cluster = 3;
  expectReject(a, "cluster=3");
  a.cluster = -1;
  expectReject(a, "cluster=-1");
  a.cluster = 2;
  a.smBudget = 1;
  expectReject(a, "CTA pairs");
  a.smBudget = 2;
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  a.dType = DType::kF32;
  expectReject(a, "16-bit D");
  a.dType = DType::kBF16;
  a.dTiled = true;
  expectReject(a, "tile-by-tile D");
  a.dTiled = false;
  a.hooks.rowBlockOffset = 1;
  expectReject(a, "hooks");
  a.hooks.rowBlockOffset = 0;
  a.groups.num = 2;
  a.groups.rowStart = dev;
  a.groups.rowCount = dev;
  for (int pl : {0, 1, 2}) {  // grouped pairs: the cooperative pipelines
    a.pipeline = pl;
    EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << "grouped, pipeline " << pl << ": " << why;
  }
  a.pipeline = 3;
  expectReject(a, "grouped GEMMs not on pipeline 3");
  a.pipeline = 0;
  a.swiglu = true;
  expectReject(a, "no SwiGLU");
  a.hooks.rowReady = reinterpret_cast<const uint64_t*>(gBuf);
  a.hooks.rowsPerFlag = 128;
  a.swiglu = false;
  expectReject(a, "hooks");
  a.hooks.rowReady = nullptr;
  // Unpaired (0 = the environment's default, 1) the same calls are fine.
  a.cluster = 0;
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  a.pipeline = 3;
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
}

// The dynamic tile schedule (GemmArgs::tileClaim) runs single CTAs with the warp-specialised
// consumers: CTA pairs and the ping-pong consumers walk the static schedule and refuse it.
TEST(GemmCanImplement, TileClaimRules) {
  int32_t* claim = reinterpret_cast<int32_t*>(gBuf + 1024);
  const int32_t* dev = reinterpret_cast<const int32_t*>(gBuf);
  std::string why;
  GemmArgs a = good();
  a.tileClaim = claim;
  for (int c : {0, 1}) {
    a.cluster = c;
    EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << c << ": " << why;
  }
  for (int pl : {0, 1, 2}) {
    a.pipeline = pl;
    EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << "pipeline " << pl << ": " << why;
  }
  a.pipeline = 0;
  a.cluster = 2;
  expectReject(a, "no tileClaim");
  a.cluster = 2;
  a.tileClaim = nullptr;  // the same pair call without the claim is fine
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  a.cluster = 0;
  a.tileClaim = claim;
  a.pipeline = 3;
  expectReject(a, "no tileClaim");
  a.pipeline = 0;
  // Grouped (the MoE experts' GEMM, with the rowReady hook of the fused dispatch).
  a.groups.num = 4;
  a.groups.rowStart = dev;
  a.groups.rowCount = dev;
  a.hooks.rowReady = reinterpret_cast<const uint64_t*>(gBuf + 2048);
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  a.cluster = 2;
  expectReject(a, "no tileClaim");
}

// Timeline stamps (GemmArgs::trace, fused/gemm/trace.h): every pipeline, the ping-pong
// consumers included; not stream-K; a buffer needs its record and CTA counts. storeWarps is
// 0 or 1.
TEST(GemmCanImplement, TraceRules) {
  std::string why;
  GemmArgs a = good();
  a.trace = reinterpret_cast<uint64_t*>(gBuf + 1024);
  a.traceTiles = 4;
  a.traceCtas = 2;
  for (int pl : {0, 1, 2, 3}) {
    a.pipeline = pl;
    for (int sw : {-1, 0, 1}) {
      a.storeWarps = sw;
      EXPECT_TRUE(mk::gemm::canImplement(a, &why))
          << "pipeline " << pl << " storeWarps " << sw << ": " << why;
    }
  }
  a.storeWarps = 2;
  expectReject(a, "storeWarps");
  a.storeWarps = -2;
  expectReject(a, "storeWarps");
  a.storeWarps = -1;
  // CTA pairs are traced with the ping-pong consumers and the cooperative deep ring only (the
  // traced wide pairs spill).
  a.cluster = 2;
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  a.pipeline = 1;
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  a.pipeline = 0;
  expectReject(a, "CTA pairs other than pipeline 1");
  a.pipeline = 2;
  expectReject(a, "CTA pairs other than pipeline 1");
  a.pipeline = 0;
  a.cluster = 0;
  a.streamK = 1;
  expectReject(a, "not traced");
  a.streamK = 0;
  a.traceTiles = 0;
  expectReject(a, "traceTiles");
  a.traceTiles = 4;
  a.traceCtas = 0;
  expectReject(a, "traceCtas");
  a.trace = nullptr;  // traceTiles means nothing without a buffer
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
}

namespace {
void lentStageRules(int pipeline) {
  SCOPED_TRACE("pipeline " + std::to_string(pipeline));
  std::string why;
  GemmArgs a = good();
  a.pipeline = pipeline;
  a.bLayout = BLayout::kNK;
  for (int cl : {0, 1})
    for (int sw : {-1, 1}) {
      a.cluster = cl;
      a.storeWarps = sw;
      EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << "cluster " << cl << ": " << why;
    }
  a.storeWarps = -1;
  a.cluster = 2;
  if (pipeline == 6) {  // the carried epilogue pairs up, on the static walk, untraced
    EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
    a.tileClaim = reinterpret_cast<int32_t*>(gBuf + 2048);
    expectReject(a, "walks the static schedule");
    a.tileClaim = nullptr;
    a.trace = reinterpret_cast<uint64_t*>(gBuf + 1024);
    a.traceTiles = 4;
    a.traceCtas = 2;
    expectReject(a, "CTA pairs");
    a.trace = nullptr;
  } else {
    expectReject(a, "CTA pairs");
  }
  a.cluster = 0;
  a.bLayout = BLayout::kKN;
  expectReject(a, "takes B as [N,K] only");
  a.bLayout = BLayout::kNK;
  a.dType = DType::kF32;
  expectReject(a, "needs a 16-bit output type");
  a.dType = DType::kBF16;
  a.storeWarps = 0;
  expectReject(a, "stores through its store threads");
  a.storeWarps = -1;
  a.regStores = 1;
  expectReject(a, "stores through its store threads");
  a.regStores = 0;
  a.streamK = 1;
  expectReject(a, ("pipeline " + std::to_string(pipeline)).c_str());  // its rule or stream-K's
  a.streamK = 0;
  a.hooks.rowBlockOffset = 1;
  expectReject(a, "takes no fused-operator hooks");
  a.hooks.rowBlockOffset = 0;
  a.tileClaim = reinterpret_cast<int32_t*>(gBuf + 2048);  // the dynamic schedule
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  a.trace = reinterpret_cast<uint64_t*>(gBuf + 1024);
  a.traceTiles = 4;
  a.traceCtas = 2;
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
}
}  // namespace

// The deep ring lending its last stage to the epilogue (GemmArgs::pipeline 5) and carrying
// half of its epilogue into the next tile (6): plain unpaired GEMMs with B [N,K] and 16-bit
// D, whose stores go through the store threads (storeWarps -1 or 1, regStores 0), traced too;
// everything else refused by name.
TEST(GemmCanImplement, LentStageRules) {
  for (int pipeline : {5, 6}) lentStageRules(pipeline);
  GemmArgs a = good();
  a.pipeline = 7;
  expectReject(a, "pipeline=7 must be");
}

// What pipeline 0 resolves to (autoPipeline): the carried epilogue at every K with beta 0, the
// lent stage with beta != 0 up to kWideMaxK and neither above it, the lent stage or neither under
// MKERNEL_GEMM_AUTO_LEND 1 and 0, and neither for any call outside plain unpaired GEMMs with
// B [N,K] and a 16-bit D, or with a pipeline named.
TEST(GemmCanImplement, AutoPipelineRule) {
  using mk::gemm::autoPipeline;
  using mk::gemm::kWideMaxK;
  GemmArgs a = good();
  a.bLayout = BLayout::kNK;
  {
    mktest::ScopedEnv lend("MKERNEL_GEMM_AUTO_LEND", nullptr);  // the default, 2
    mktest::ScopedEnv cl("MKERNEL_GEMM_CLUSTER", nullptr);
    mktest::ScopedEnv sk("MKERNEL_GEMM_STREAMK", nullptr);
    for (int k : {64, 1000, kWideMaxK, kWideMaxK + 1, 8192, 28672}) {
      a.K = k;
      a.beta = 0.0f;
      EXPECT_EQ(autoPipeline(a), 6) << "K " << k;
      a.beta = 0.5f;
      EXPECT_EQ(autoPipeline(a), k <= kWideMaxK ? 5 : 0) << "K " << k << ", beta 0.5";
    }
    a.K = 1024;
    a.beta = 0.0f;
    // Each call outside the rule's domain, as a change to the accepted `a`.
    const std::pair<const char*, void (*)(GemmArgs&)> outside[] = {
        {"fp32 D", [](GemmArgs& b) { b.dType = DType::kF32; }},
        {"B [K,N]", [](GemmArgs& b) { b.bLayout = BLayout::kKN; }},
        {"CTA pairs", [](GemmArgs& b) { b.cluster = 2; }},
        {"consumers' stores", [](GemmArgs& b) { b.storeWarps = 0; }},
        {"register stores", [](GemmArgs& b) { b.regStores = 1; }},
        {"stream-K", [](GemmArgs& b) { b.streamK = 1; }},
        {"SwiGLU", [](GemmArgs& b) { b.swiglu = true; }},
    };
    EXPECT_EQ(autoPipeline(a), 6);
    GemmArgs b;
    for (const auto& o : outside) {
      b = a;
      o.second(b);
      EXPECT_EQ(autoPipeline(b), 0) << o.first;
    }
    for (int pl : {1, 2, 3, 4, 5, 6}) {
      b = a;
      b.pipeline = pl;
      EXPECT_EQ(autoPipeline(b), 0) << "pipeline " << pl << " named";
    }
  }
  {
    // The unit walk (pipeline 4) needs the CTA count: at 8192 x 8192 on 132 CTAs a CTA's 21 units
    // (4032 columns) beat its 16 tiles (4096); at 4096 x 4096, 6 units (1152) lose to 4 tiles.
    mktest::ScopedEnv lend("MKERNEL_GEMM_AUTO_LEND", nullptr);
    mktest::ScopedEnv cl("MKERNEL_GEMM_CLUSTER", nullptr);
    mktest::ScopedEnv sk("MKERNEL_GEMM_STREAMK", nullptr);
    mktest::ScopedEnv units("MKERNEL_GEMM_UNITS_MAXK", nullptr);  // the default, 4096
    using mk::gemm::autoClaims;
    GemmArgs u = a;
    u.M = u.N = 8192;
    u.beta = 0.0f;
    for (int k : {64, 1024, 4096}) {
      u.K = k;
      EXPECT_EQ(autoPipeline(u, 132), 4) << "K " << k;
      EXPECT_FALSE(autoClaims(u, 132)) << "K " << k << ": the unit walk is static";
      EXPECT_EQ(autoPipeline(u), 6) << "K " << k << ", no CTA count";
      EXPECT_TRUE(autoClaims(u)) << "K " << k << ", no CTA count";
    }
    u.K = 4097;
    EXPECT_EQ(autoPipeline(u, 132), 6);
    u.K = 1024;
    u.M = u.N = 4096;
    EXPECT_EQ(autoPipeline(u, 132), 6) << "4096 x 4096: tiles load 132 CTAs more evenly";
    u.M = 16384;
    u.N = 8192;
    EXPECT_EQ(autoPipeline(u, 132), 4) << "16384 x 8192: 42 units against 32 tiles";
    u.M = u.N = 8192;
    // One CTA walks everything: 43 units a row block cover 8256 columns, 32 tiles 8192.
    EXPECT_EQ(autoPipeline(u, 1), 6);
    // Fewer than two units a CTA (1024 x 2048: 88 units on 132 CTAs): no ping-pong to hide.
    GemmArgs one = u;
    one.M = 1024;
    one.N = 2048;
    EXPECT_EQ(autoPipeline(one, 132), 6);
    EXPECT_EQ(autoPipeline(one, 44), 4) << "2 units a CTA";
    const std::pair<const char*, void (*)(GemmArgs&)> notUnits[] = {
        {"beta", [](GemmArgs& b) { b.beta = 0.5f; }},
        {"8-byte D rows", [](GemmArgs& b) { b.ldd = 8192 + 4; }},
        {"caller's tileClaim", [](GemmArgs& b) { b.tileClaim = reinterpret_cast<int32_t*>(gBuf); }},
    };
    for (const auto& o : notUnits) {
      GemmArgs b = u;
      o.second(b);
      EXPECT_NE(autoPipeline(b, 132), 4) << o.first;
    }
    GemmArgs kn = u;
    kn.bLayout = BLayout::kKN;
    EXPECT_EQ(autoPipeline(kn, 132), 0) << "B [K,N]";
    mktest::ScopedEnv off("MKERNEL_GEMM_UNITS_MAXK", "0");
    EXPECT_EQ(autoPipeline(u, 132), 6) << "MKERNEL_GEMM_UNITS_MAXK 0";
  }
  {
    mktest::ScopedEnv lend("MKERNEL_GEMM_AUTO_LEND", "1");
    a.K = 1024;
    EXPECT_EQ(autoPipeline(a), 5);
    a.K = 8192;
    EXPECT_EQ(autoPipeline(a), 0);
  }
  {
    mktest::ScopedEnv lend("MKERNEL_GEMM_AUTO_LEND", "0");
    a.K = 1024;
    EXPECT_EQ(autoPipeline(a), 0);
  }
}

// Which pipeline-0 calls claim their tiles (autoClaims): those resolving to the lent stage or the
// carried epilogue; grouped GEMMs only under MKERNEL_GEMM_GROUP_CLAIM 1 and without hooks; none
// with a pipeline named, a caller's counter or a trace.
TEST(GemmCanImplement, AutoClaimsRule) {
  using mk::gemm::autoClaims;
  mktest::ScopedEnv lend("MKERNEL_GEMM_AUTO_LEND", nullptr);
  mktest::ScopedEnv cl("MKERNEL_GEMM_CLUSTER", nullptr);
  mktest::ScopedEnv sk("MKERNEL_GEMM_STREAMK", nullptr);
  static int32_t meta[2];
  static int32_t counter;
  static uint64_t traceBuf;
  GemmArgs a = good();
  a.bLayout = BLayout::kNK;
  EXPECT_TRUE(autoClaims(a));  // the carried epilogue
  GemmArgs b = a;
  b.pipeline = 6;
  EXPECT_FALSE(autoClaims(b)) << "pipeline named";
  b = a;
  b.tileClaim = &counter;
  EXPECT_FALSE(autoClaims(b)) << "caller's counter";
  b = a;
  b.trace = &traceBuf;
  EXPECT_FALSE(autoClaims(b)) << "traced";
  b = a;
  b.bLayout = BLayout::kKN;  // neither the lent stage nor the carried epilogue
  EXPECT_FALSE(autoClaims(b)) << "B [K,N]";
  GemmArgs g = a;
  g.groups.num = 2;
  g.groups.rowStart = meta;
  g.groups.rowCount = meta + 1;
  for (const char* v : {"0", "1"}) {
    mktest::ScopedEnv gc("MKERNEL_GEMM_GROUP_CLAIM", v);
    const bool on = v[0] == '1';
    EXPECT_EQ(autoClaims(g), on) << "grouped, MKERNEL_GEMM_GROUP_CLAIM " << v;
    b = g;
    b.bLayout = BLayout::kKN;
    EXPECT_EQ(autoClaims(b), on) << "grouped, B [K,N]";
    b = g;
    b.hooks.rowReady = &traceBuf;
    b.hooks.rowsPerFlag = 128;
    EXPECT_FALSE(autoClaims(b)) << "grouped with a hook";
    b = g;
    b.pipeline = 2;
    EXPECT_FALSE(autoClaims(b)) << "grouped, pipeline named";
    // CTA pairs walk the static schedule: asked for, or by MKERNEL_GEMM_CLUSTER.
    b = g;
    b.cluster = 2;
    EXPECT_FALSE(autoClaims(b)) << "grouped, as CTA pairs";
    mktest::ScopedEnv pairs("MKERNEL_GEMM_CLUSTER", "2");
    EXPECT_FALSE(autoClaims(g)) << "grouped, MKERNEL_GEMM_CLUSTER=2";
    b.cluster = 1;
    EXPECT_EQ(autoClaims(b), on) << "grouped, unpaired by GemmArgs::cluster";
  }
}

// GemmArgs::regStores is a request (0 or 1), honoured where D allows it (buildParams): every
// pipeline, pairs and the other options accept either value; anything else is refused by name.
TEST(GemmCanImplement, RegStoresValues) {
  std::string why;
  GemmArgs a = good();
  for (int pl : {0, 1, 2, 3, 4})
    for (int cl : {0, 1, 2}) {
      if (pl == 4 && cl == 2) continue;  // 192-column units are never paired
      a.pipeline = pl;
      a.cluster = cl;
      for (int rs : {0, 1}) {
        a.regStores = rs;
        EXPECT_TRUE(mk::gemm::canImplement(a, &why))
            << "pipeline " << pl << " cluster " << cl << " regStores " << rs << ": " << why;
      }
    }
  a.pipeline = 0;
  a.cluster = 0;
  a.regStores = 2;
  expectReject(a, "regStores");
  a.regStores = -1;
  expectReject(a, "regStores");
}

// GemmArgs::skipStores (a benchmark's diagnostic) is 0 or 1 and storeHint (automatic, D's stores
// L2 evict-first, no policy) 0..2 with any pipeline; anything else is refused by name.
TEST(GemmCanImplement, StoreSwitchValues) {
  std::string why;
  struct Field {
    const char* name;
    int32_t GemmArgs::*member;
    int maxValid;
  };
  const Field fields[] = {{"skipStores", &GemmArgs::skipStores, 1},
                          {"storeHint", &GemmArgs::storeHint, 2}};
  for (const Field& f : fields) {
    GemmArgs a = good();
    for (int pl : {0, 1, 2, 5, 6})
      for (int v = 0; v <= f.maxValid; ++v) {
        a.pipeline = pl;
        a.*f.member = v;
        EXPECT_TRUE(mk::gemm::canImplement(a, &why))
            << "pipeline " << pl << " " << f.name << " " << v << ": " << why;
      }
    a.pipeline = 0;
    a.*f.member = f.maxValid + 1;
    expectReject(a, f.name);
    a.*f.member = -1;
    expectReject(a, f.name);
  }
}

// What groupM 0 and storeHint 0 resolve to: bands of 32 and evict-first D stores only for plain
// GEMMs in their K ranges (the defaults and the environment's), the stores only where D (6 MB
// here) outgrows the L2; 8 and no policy for calls with hooks at any K, and for grouped GEMMs
// unless MKERNEL_GEMM_GROUP_BAND / _HINT say otherwise.
TEST(GemmCanImplement, AutoBandAndStoreHint) {
  using mk::gemm::autoGroupM;
  using mk::gemm::autoStoreHint;
  mktest::ScopedEnv lo("MKERNEL_GEMM_BAND_MINK", nullptr);
  mktest::ScopedEnv hi("MKERNEL_GEMM_BAND_MAXK", nullptr);
  mktest::ScopedEnv hint("MKERNEL_GEMM_HINT_MAXK", nullptr);
  mktest::ScopedEnv gband("MKERNEL_GEMM_GROUP_BAND", nullptr);
  mktest::ScopedEnv ghint("MKERNEL_GEMM_GROUP_HINT", nullptr);
  GemmArgs a = good();
  const int64_t small = 1 << 20, large = 64 << 20;  // an L2 D outgrows / one it fits
  uint64_t marker = 7;
  for (int k : {64, 512, 1000, 1024, 2048, 2049, 4096, 8192}) {
    a.K = k;
    EXPECT_EQ(autoGroupM(a), k >= 1024 && k <= 2048 ? 32 : 8) << "K " << k;
    EXPECT_EQ(autoStoreHint(a, small), k <= 1024 ? 1 : 0) << "K " << k;
    EXPECT_EQ(autoStoreHint(a, large), 0) << "D fits the L2, K " << k;
    GemmArgs g = a;
    g.groups.num = 2;
    EXPECT_EQ(autoGroupM(g), 8) << "grouped, K " << k;
    EXPECT_EQ(autoStoreHint(g, small), 0) << "grouped, K " << k;
    GemmArgs h = a;
    h.hooks.tileDone = &marker;
    EXPECT_EQ(autoGroupM(h), 8) << "tileDone hook, K " << k;
    EXPECT_EQ(autoStoreHint(h, small), 0) << "tileDone hook, K " << k;
  }
  {
    mktest::ScopedEnv lo2("MKERNEL_GEMM_BAND_MINK", "256");
    mktest::ScopedEnv hi2("MKERNEL_GEMM_BAND_MAXK", "0");
    mktest::ScopedEnv hint2("MKERNEL_GEMM_HINT_MAXK", "0");
    a.K = 1024;
    EXPECT_EQ(autoGroupM(a), 8) << "MKERNEL_GEMM_BAND_MAXK 0";
    EXPECT_EQ(autoStoreHint(a, small), 0) << "MKERNEL_GEMM_HINT_MAXK 0";
  }
  {
    mktest::ScopedEnv lo2("MKERNEL_GEMM_BAND_MINK", "256");
    mktest::ScopedEnv hint2("MKERNEL_GEMM_HINT_MAXK", "4096");
    a.K = 512;
    EXPECT_EQ(autoGroupM(a), 32) << "MKERNEL_GEMM_BAND_MINK 256";
    a.K = 4096;
    EXPECT_EQ(autoStoreHint(a, small), 1) << "MKERNEL_GEMM_HINT_MAXK 4096";
  }
  {
    // Grouped GEMMs follow their own two settings at every K; hooks keep 8 and no policy.
    mktest::ScopedEnv band("MKERNEL_GEMM_GROUP_BAND", "48");
    mktest::ScopedEnv ghint2("MKERNEL_GEMM_GROUP_HINT", "1");
    GemmArgs g = a;
    g.groups.num = 4;
    for (int k : {512, 2048, 7168}) {
      g.K = k;
      EXPECT_EQ(autoGroupM(g), 48) << "MKERNEL_GEMM_GROUP_BAND 48, K " << k;
      EXPECT_EQ(autoStoreHint(g, small), 1) << "MKERNEL_GEMM_GROUP_HINT 1, K " << k;
      EXPECT_EQ(autoStoreHint(g, large), 0) << "grouped D fits the L2, K " << k;
    }
    g.hooks.tileDone = &marker;
    EXPECT_EQ(autoGroupM(g), 8) << "grouped with a hook";
    EXPECT_EQ(autoStoreHint(g, small), 0) << "grouped with a hook";
    // Plain GEMMs keep their own rule under both settings.
    a.K = 1024;
    EXPECT_EQ(autoGroupM(a), 32) << "plain GEMM, K 1024";
    a.K = 4096;
    EXPECT_EQ(autoGroupM(a), 8) << "plain GEMM, K 4096";
    EXPECT_EQ(autoStoreHint(a, small), 0) << "plain GEMM, K 4096";
  }
}
