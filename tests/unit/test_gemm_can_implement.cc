// CPU tests of the GEMM engine's host-side checks (canImplement): no CUDA call is made, so these
// run on machines without a GPU (the automatic choices' tests are in test_gemm_auto_rules.cc,
// the fused SM-split cost model's in test_fused_cost_model.cc).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>

#include "common/test_util.h"
#include "fused/gemm/dtype_built.h"
#include "fused/gemm/gemm.h"
#include "fused/gemm/gemm_rules.h"
#include "gemm_args_util.h"

using namespace gemmargs;

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
        // A -DMK_BUILD_F16=OFF build refuses fp16 with a message naming the option.
        const bool built = mk::gemm::dtypeBuilt(ab) && mk::gemm::dtypeBuilt(dt);
        if (built) {
          EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
        } else {
          expectReject(a, "MK_BUILD_F16=OFF");
        }
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

// Ping-pong consumers with 192-column units (pipeline 4): plain and grouped 16-bit GEMMs, both
// layouts, alpha and beta; every other feature refused with its rule.
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
  EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;  // grouped: the groups' row blocks
  a.swiglu = true;
  expectReject(a, "runs plain or grouped GEMMs: no SwiGLU");
  a = good();
  a.pipeline = 4;
  a.cluster = 2;
  expectReject(a, "runs plain or grouped GEMMs");
  a.cluster = 1;
  a.streamK = 1;
  expectReject(a, "runs plain or grouped GEMMs");
  a.streamK = 0;
  a.dTiled = true;
  expectReject(a, "runs plain or grouped GEMMs");
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
  expectReject(a, "stores D by TMA or 8 columns a 16-byte store");
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

// Grouped GEMMs on the carried epilogue (pipeline 6, session 58): B [N,K], 16-bit D, unpaired
// (a pair is refused by its own rule, and MKERNEL_GEMM_CLUSTER=2 leaves it unpaired), the static
// walk or claimed tiles; everything else refused by its rule, and grouped on the lent stage (5).
TEST(GemmCanImplement, GroupedCarriedEpilogueRules) {
  const int32_t* dev = reinterpret_cast<const int32_t*>(gBuf);
  std::string why;
  GemmArgs a = good();
  a.bLayout = BLayout::kNK;
  a.groups.num = 3;
  a.groups.rowStart = dev;
  a.groups.rowCount = dev;
  a.pipeline = 6;
  for (DType d : {DType::kBF16, DType::kF16}) {
    a.dType = d;
    EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
  }
  GemmArgs claimed = a;
  claimed.tileClaim = reinterpret_cast<int32_t*>(gBuf + 2048);
  EXPECT_TRUE(mk::gemm::canImplement(claimed, &why)) << "claimed tiles: " << why;
  {
    mktest::ScopedEnv pairs("MKERNEL_GEMM_CLUSTER", "2");
    EXPECT_EQ(mk::gemm::resolvedCluster(a), 1) << "grouped carried epilogue left unpaired";
  }
  const std::pair<const char*, void (*)(GemmArgs&)> refused[] = {
      {"runs grouped GEMMs unpaired", [](GemmArgs& b) { b.cluster = 2; }},
      {"takes B as [N,K] only", [](GemmArgs& b) { b.bLayout = BLayout::kKN; }},
      {"needs a 16-bit output type", [](GemmArgs& b) { b.dType = DType::kF32; }},
      {"runs plain or grouped GEMMs: no SwiGLU", [](GemmArgs& b) { b.swiglu = true; }},
      {"takes no fused-operator hooks",
       [](GemmArgs& b) {
         b.hooks.rowReady = reinterpret_cast<const uint64_t*>(gBuf);
         b.hooks.rowsPerFlag = 128;
       }},
      {"runs plain GEMMs: no groups", [](GemmArgs& b) { b.pipeline = 5; }},
  };
  for (const auto& r : refused) {
    GemmArgs b = a;
    r.second(b);
    expectReject(b, r.first);
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
