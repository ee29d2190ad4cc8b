// CPU tests of the GEMM engine's automatic choices (autoPipeline, autoClaims, autoGroupM,
// autoStoreHint): what pipeline 0, the tile claims, the raster band and D's L2 policy resolve to
// for a call, with the environment's settings; no CUDA call is made.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>

#include "common/test_util.h"
#include "fused/gemm/gemm.h"
#include "gemm_args_util.h"

using namespace gemmargs;

namespace {

// `a` as a grouped GEMM of 8192 rows in two groups, K 7168 -> N 2048 (issue 13's first shape with
// fewer rows), its starts and counts at meta[0] and meta[1] (never read: host rules only).
GemmArgs groupedLike(const GemmArgs& a, int32_t* meta) {
  GemmArgs g = a;
  g.M = 8192;
  g.N = 2048;
  g.K = 7168;
  g.beta = 0.0f;
  g.groups.num = 2;
  g.groups.rowStart = meta;
  g.groups.rowCount = meta + 1;
  return g;
}

// A grouped setting's rule by shape: {K, N, whether the setting takes the call}.
struct ShapeCase {
  int64_t k, n;
  bool taken;
};

template <size_t C>
void expectByShape(const GemmArgs& g, const ShapeCase (&cases)[C], int pipeline,
                   const char* setting) {
  for (const ShapeCase& c : cases) {
    GemmArgs b = g;
    b.K = c.k;
    b.N = c.n;
    EXPECT_EQ(mk::gemm::autoPipeline(b, 132), c.taken ? pipeline : 0)
        << setting << ", K " << c.k << " N " << c.n;
  }
}

}  // namespace

// What pipeline 0 resolves to (autoPipeline): the carried epilogue at every K with beta 0, the
// lent stage with beta != 0 up to kWideMaxK and neither above it, the lent stage or neither under
// MKERNEL_GEMM_AUTO_LEND 1 and 0, and neither for any call outside plain unpaired GEMMs with
// B [N,K] and a 16-bit D, or with a pipeline named; grouped GEMMs by their own settings (below).
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
    // Grouped GEMMs: the unit walk under MKERNEL_GEMM_GROUP_UNITS 2 (the default) at K <= 2048 and
    // N >= 2048, under 1 at any K and N, either B layout, with two units a CTA; static (no
    // claims, even under MKERNEL_GEMM_GROUP_CLAIM 1).
    mktest::ScopedEnv cl("MKERNEL_GEMM_CLUSTER", nullptr);
    mktest::ScopedEnv sk("MKERNEL_GEMM_STREAMK", nullptr);
    mktest::ScopedEnv gc("MKERNEL_GEMM_GROUP_CLAIM", "1");
    mktest::ScopedEnv carry("MKERNEL_GEMM_GROUP_CARRY", "0");  // the tiles where units do not fit
    using mk::gemm::autoClaims;
    static int32_t meta[2];
    static uint64_t flags;
    GemmArgs g = groupedLike(a, meta);
    {
      mktest::ScopedEnv units("MKERNEL_GEMM_GROUP_UNITS", nullptr);  // the default, 2
      EXPECT_EQ(autoPipeline(g, 132), 0) << "K 7168: the tiles";
      EXPECT_TRUE(autoClaims(g, 132)) << "grouped tiles claimed under MKERNEL_GEMM_GROUP_CLAIM";
      // Issue 13's shapes (7168 -> 2048, 2048 -> 1408, 2048 -> 7168), the small model's GEMM2
      // (1408 -> 2048) and the rule's edges.
      const ShapeCase cases[] = {{7168, 2048, false}, {2048, 1408, false}, {2048, 7168, true},
                                 {1408, 2048, true},  {2056, 7168, false}, {2048, 2040, false},
                                 {2048, 2048, true},  {64, 4096, true}};
      expectByShape(g, cases, 4, "MKERNEL_GEMM_GROUP_UNITS 2 (the default)");
      {
        mktest::ScopedEnv two("MKERNEL_GEMM_GROUP_UNITS", "2");
        GemmArgs kn = g;
        kn.bLayout = BLayout::kKN;
        expectByShape(kn, cases, 4, "MKERNEL_GEMM_GROUP_UNITS 2 named, B [K,N]");
      }
      GemmArgs u = g;
      u.K = 2048;
      EXPECT_FALSE(autoClaims(u, 132)) << "the grouped unit walk is static";
      GemmArgs few = g;  // 8 row blocks x 11 units: 88 < 2 x 132
      few.M = 1024;
      few.K = 1408;
      EXPECT_EQ(autoPipeline(few, 132), 0) << "the default also wants two units a CTA";
      EXPECT_EQ(autoPipeline(few, 0), 0) << "no SM count: no units";
      GemmArgs odd = g;  // units by shape, but 8-byte D rows
      odd.K = 2048;
      odd.ldd = odd.N + 4;
      EXPECT_EQ(autoPipeline(odd, 132), 0) << "8-byte D rows";
    }
    mktest::ScopedEnv units("MKERNEL_GEMM_GROUP_UNITS", "1");
    EXPECT_EQ(autoPipeline(g, 132), 4) << "K 7168: no K bound for groups";
    EXPECT_FALSE(autoClaims(g, 132)) << "the grouped unit walk is static";
    GemmArgs kn = g;
    kn.bLayout = BLayout::kKN;
    EXPECT_EQ(autoPipeline(kn, 132), 4) << "B [K,N]";
    GemmArgs few = g;
    few.M = 1024;  // 8 row blocks x 11 units: 88 < 2 x 132
    EXPECT_EQ(autoPipeline(few, 132), 0);
    EXPECT_EQ(autoPipeline(few, 44), 4) << "2 units a CTA";
    const std::pair<const char*, void (*)(GemmArgs&)> notUnits[] = {
        {"beta", [](GemmArgs& b) { b.beta = 0.5f; }},
        {"fp32 D", [](GemmArgs& b) { b.dType = DType::kF32; }},
        {"SwiGLU", [](GemmArgs& b) { b.swiglu = true; }},
        {"8-byte D rows", [](GemmArgs& b) { b.ldd = 2048 + 4; }},
        {"rowReady hook",
         [](GemmArgs& b) {
           b.hooks.rowReady = &flags;
           b.hooks.rowsPerFlag = 128;
         }},
        {"caller's tileClaim", [](GemmArgs& b) { b.tileClaim = meta; }},
        {"register stores", [](GemmArgs& b) { b.regStores = 1; }},
        {"CTA pairs", [](GemmArgs& b) { b.cluster = 2; }},
        {"pipeline named", [](GemmArgs& b) { b.pipeline = 2; }},
    };
    for (const auto& o : notUnits) {
      GemmArgs b = g;
      o.second(b);
      EXPECT_EQ(autoPipeline(b, 132), 0) << o.first;
    }
  }
  {
    // Grouped GEMMs: the carried epilogue (after the unit walk, where MKERNEL_GEMM_GROUP_UNITS
    // takes the call) under MKERNEL_GEMM_GROUP_CARRY 2 (the default) at K > kWideMaxK or N >=
    // 4096, under 1 at any K and N, under 0 never; B [N,K], beta 0; claimed only under
    // MKERNEL_GEMM_GROUP_CLAIM 1.
    mktest::ScopedEnv cl("MKERNEL_GEMM_CLUSTER", nullptr);
    mktest::ScopedEnv sk("MKERNEL_GEMM_STREAMK", nullptr);
    mktest::ScopedEnv units("MKERNEL_GEMM_GROUP_UNITS", "0");  // else 2048 -> 7168 takes units
    mktest::ScopedEnv gc("MKERNEL_GEMM_GROUP_CLAIM", nullptr);
    using mk::gemm::autoClaims;
    static int32_t meta[2];
    static uint64_t flags;
    GemmArgs g = groupedLike(a, meta);
    g.bLayout = BLayout::kNK;
    {
      mktest::ScopedEnv carry2("MKERNEL_GEMM_GROUP_CARRY", nullptr);
      // Issue 13's shapes (7168 -> 2048, 2048 -> 1408, 2048 -> 7168) and the rule's edges.
      const ShapeCase cases[] = {{7168, 2048, true},  {2048, 1408, false}, {2048, 7168, true},
                                 {4096, 4088, false}, {4104, 1408, true},  {4096, 4096, true},
                                 {512, 256, false}};
      expectByShape(g, cases, 6, "MKERNEL_GEMM_GROUP_CARRY 2 (the default)");
      GemmArgs odd = g;  // K 7168: carried with 16-byte D rows
      odd.ldd = odd.N + 4;
      EXPECT_EQ(autoPipeline(odd, 132), 0) << "8-byte D rows: the setting's rule wants TMA stores";
    }
    {
      mktest::ScopedEnv carry0("MKERNEL_GEMM_GROUP_CARRY", "0");
      EXPECT_EQ(autoPipeline(g, 132), 0) << "MKERNEL_GEMM_GROUP_CARRY 0";
    }
    mktest::ScopedEnv carry("MKERNEL_GEMM_GROUP_CARRY", "1");
    EXPECT_EQ(autoPipeline(g, 0), 6) << "no SM count needed (unlike the unit walk)";
    for (int k : {512, 2048, 7168}) {
      g.K = k;
      EXPECT_EQ(autoPipeline(g, 132), 6) << "K " << k;
    }
    EXPECT_FALSE(autoClaims(g, 132)) << "grouped: static unless MKERNEL_GEMM_GROUP_CLAIM";
    {
      mktest::ScopedEnv claim("MKERNEL_GEMM_GROUP_CLAIM", "1");
      EXPECT_TRUE(autoClaims(g, 132)) << "MKERNEL_GEMM_GROUP_CLAIM 1";
    }
    {
      mktest::ScopedEnv u("MKERNEL_GEMM_GROUP_UNITS", "1");
      EXPECT_EQ(autoPipeline(g, 132), 4) << "the unit walk first";
    }
    GemmArgs claimed = g;
    claimed.tileClaim = meta;
    EXPECT_EQ(autoPipeline(claimed, 132), 6) << "a caller's tileClaim";
    const std::pair<const char*, void (*)(GemmArgs&)> notCarried[] = {
        {"beta", [](GemmArgs& b) { b.beta = 0.5f; }},
        {"fp32 D", [](GemmArgs& b) { b.dType = DType::kF32; }},
        {"B [K,N]", [](GemmArgs& b) { b.bLayout = BLayout::kKN; }},
        {"SwiGLU", [](GemmArgs& b) { b.swiglu = true; }},
        {"rowReady hook",
         [](GemmArgs& b) {
           b.hooks.rowReady = &flags;
           b.hooks.rowsPerFlag = 128;
         }},
        {"register stores", [](GemmArgs& b) { b.regStores = 1; }},
        {"store threads off", [](GemmArgs& b) { b.storeWarps = 0; }},
        {"CTA pairs", [](GemmArgs& b) { b.cluster = 2; }},
        {"pipeline named", [](GemmArgs& b) { b.pipeline = 1; }},
    };
    for (const auto& o : notCarried) {
      GemmArgs b = g;
      o.second(b);
      EXPECT_EQ(autoPipeline(b, 132), 0) << o.first;
    }
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

// What groupM 0 and storeHint 0 resolve to: bands of 32 and evict-first D stores only for plain
// GEMMs in their K ranges (the defaults and the environment's), the stores only where D (6 MB
// here) outgrows the L2; 8 and no policy for calls with hooks at any K, and for grouped GEMMs
// unless MKERNEL_GEMM_GROUP_BAND / _HINT say otherwise (their own bands on the ping-pong
// consumers and the units).
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
    // The ping-pong consumers' and the units' grouped walks (pipeline 3 / 4, as buildParams
    // resolves them) take MKERNEL_GEMM_GROUP_PING_BAND / _UNIT_BAND instead; the other pipelines
    // keep the group band.
    {
      mktest::ScopedEnv pband("MKERNEL_GEMM_GROUP_PING_BAND", nullptr);
      mktest::ScopedEnv uband("MKERNEL_GEMM_GROUP_UNIT_BAND", nullptr);
      for (int pl : {0, 1, 2, 3, 4}) {
        g.pipeline = pl;
        EXPECT_EQ(autoGroupM(g), pl == 3 ? 4 : (pl == 4 ? 2 : 48)) << "grouped, pipeline " << pl;
      }
      mktest::ScopedEnv pband2("MKERNEL_GEMM_GROUP_PING_BAND", "6");
      mktest::ScopedEnv uband2("MKERNEL_GEMM_GROUP_UNIT_BAND", "3");
      g.pipeline = 3;
      EXPECT_EQ(autoGroupM(g), 6) << "MKERNEL_GEMM_GROUP_PING_BAND 6";
      g.pipeline = 4;
      EXPECT_EQ(autoGroupM(g), 3) << "MKERNEL_GEMM_GROUP_UNIT_BAND 3";
      GemmArgs plain = a;
      plain.pipeline = 4;
      plain.K = 1024;
      EXPECT_EQ(autoGroupM(plain), 32) << "plain pipeline 4 keeps the plain rule";
      g.pipeline = 0;
    }
    g.hooks.tileDone = &marker;
    g.pipeline = 3;
    EXPECT_EQ(autoGroupM(g), 8) << "grouped ping-pong with a hook";
    g.pipeline = 0;
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

// MKERNEL_GEMM_UNIT_NARROW's rule (gemm.h unitWidth): 176-column units only with B [N,K] and no
// SwiGLU; setting 2 where 176 tiles D's columns exactly and 192 does not, 1 wherever B is [N,K],
// 0 (the default) never; tilesN of a call naming pipeline 4 counts units of that width.
TEST(GemmCanImplement, UnitWidthRule) {
  using mk::gemm::kPingUnitN;
  using mk::gemm::kPingUnitNarrowN;
  using mk::gemm::unitWidth;
  GemmArgs a = good();
  a.bLayout = BLayout::kNK;
  a.pipeline = 4;
  const int widths[] = {1408, 352, 176, 2048, 1056, 520};  // 1056 = 6 x 176 = 5.5 x 192
  const int setting2[] = {176, 176, 176, 192, 176, 192};   // 2048: 11.6 units; 520: 2.95
  {
    mktest::ScopedEnv env("MKERNEL_GEMM_UNIT_NARROW", nullptr);
    for (int n : widths) {
      a.N = n;
      EXPECT_EQ(unitWidth(a), kPingUnitN) << "default, N " << n;
    }
  }
  {
    mktest::ScopedEnv env("MKERNEL_GEMM_UNIT_NARROW", "2");
    for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); ++i) {
      a.N = widths[i];
      EXPECT_EQ(unitWidth(a), setting2[i]) << "setting 2, N " << a.N;
      EXPECT_EQ(mk::gemm::tilesN(a), (a.N + setting2[i] - 1) / setting2[i]);
    }
    a.N = 1408;
    GemmArgs kn = a;
    kn.bLayout = BLayout::kKN;
    EXPECT_EQ(unitWidth(kn), kPingUnitN) << "B [K,N]";
    GemmArgs sw = a;
    sw.swiglu = 1;
    EXPECT_EQ(unitWidth(sw), kPingUnitN) << "SwiGLU";
  }
  mktest::ScopedEnv env("MKERNEL_GEMM_UNIT_NARROW", "1");
  for (int n : widths) {
    a.N = n;
    EXPECT_EQ(unitWidth(a), kPingUnitNarrowN) << "setting 1, N " << n;
  }
}
