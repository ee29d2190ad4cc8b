// Argument rules of the fused GEMM + collective calls (include/mkernel/fused.h), checked on
// the CPU: every refusal names its rule, and valid calls pass the checks.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "base/can_implement.h"
#include "fused/ops/gemm_coll/gemm_coll.h"
#include "mkernel/fused.h"

namespace {

using mk::fused::GemmColl;
using mk::fused::GemmCollCall;

// Fake, 256-byte aligned addresses far apart: the checks never dereference them.
const void* addr(uintptr_t i) {
  return reinterpret_cast<const void*>((i + 1) << 32);
}

GemmCollCall valid(GemmColl op) {
  GemmCollCall c;
  c.op = op;
  c.A = addr(1);
  c.B = addr(2);
  c.C = const_cast<void*>(addr(3));
  c.M = 256;
  c.N = 128;
  c.K = 64;
  return c;
}

// Runs the check; returns "" when accepted, else the last warning.
std::string check(GemmCollCall c, const ncclFusedConfig_t* cfg = nullptr, int n = 4, int r = 1) {
  ncclResult_t res = mk::fused::gemmCollCheck(&c, cfg, n, r);
  if (res == ncclSuccess) return "";
  EXPECT_EQ(res, ncclInvalidArgument);
  return std::string("refused: ") + ncclGetLastError(nullptr);
}

TEST(FusedArgs, ValidCallsPass) {
  for (GemmColl op : {GemmColl::kAllReduce, GemmColl::kAllGather, GemmColl::kReduceScatter})
    EXPECT_EQ(check(valid(op)), "") << mk::fused::gemmCollName(op);
  GemmCollCall c = valid(GemmColl::kAllReduce);
  c.M = 7;  // M need not be a multiple of nranks for GemmAllReduce
  EXPECT_EQ(check(c), "");
}

TEST(FusedArgs, DefaultsResolved) {
  GemmCollCall c = valid(GemmColl::kAllReduce);
  c.inType = ncclFloat16;
  ASSERT_EQ(mk::fused::gemmCollCheck(&c, nullptr, 2, 0), ncclSuccess);
  EXPECT_EQ(c.cfg.outType, ncclFloat16);
  EXPECT_EQ(c.cfg.algo, ncclFusedAuto);
  EXPECT_EQ(c.cfg.bLayout, ncclFusedLayoutNK);
  EXPECT_EQ(c.cfg.commSms, -1);
}

TEST(FusedArgs, EachRuleNamed) {
  struct Bad {
    const char* what;
    void (*mut)(GemmCollCall&, ncclFusedConfig_t&);
  };
  const Bad bads[] = {
      {"ncclBfloat16 or ncclFloat16",
       [](GemmCollCall& c, ncclFusedConfig_t&) { c.inType = ncclFloat32; }},
      {"positive", [](GemmCollCall& c, ncclFusedConfig_t&) { c.N = 0; }},
      {"below 2^31", [](GemmCollCall& c, ncclFusedConfig_t&) { c.M = size_t(1) << 31; }},
      {"multiple of 8", [](GemmCollCall& c, ncclFusedConfig_t&) { c.K = 60; }},
      {"[K,N]",
       [](GemmCollCall& c, ncclFusedConfig_t& f) {
         f.bLayout = ncclFusedLayoutKN;
         c.N = 100;
       }},
      {"NULL", [](GemmCollCall& c, ncclFusedConfig_t&) { c.B = nullptr; }},
      {"16-byte aligned",
       [](GemmCollCall& c, ncclFusedConfig_t&) { c.A = static_cast<const char*>(c.A) + 8; }},
      {"overlap", [](GemmCollCall& c, ncclFusedConfig_t&) { c.C = const_cast<void*>(c.A); }},
      {"Agathered is only",
       [](GemmCollCall& c, ncclFusedConfig_t&) { c.Agathered = const_cast<void*>(addr(9)); }},
      {"magic", [](GemmCollCall&, ncclFusedConfig_t& f) { f.magic = 1; }},
      {"version", [](GemmCollCall&, ncclFusedConfig_t& f) { f.version = 99; }},
      {"size", [](GemmCollCall&, ncclFusedConfig_t& f) { f.size = 8; }},
      {"bLayout", [](GemmCollCall&, ncclFusedConfig_t& f) { f.bLayout = 5; }},
      {"algo", [](GemmCollCall&, ncclFusedConfig_t& f) { f.algo = 7; }},
      {"commSms", [](GemmCollCall&, ncclFusedConfig_t& f) { f.commSms = -2; }},
      {"outType", [](GemmCollCall&, ncclFusedConfig_t& f) { f.outType = ncclInt32; }},
      {"bias",
       [](GemmCollCall&, ncclFusedConfig_t& f) { f.bias = static_cast<const char*>(addr(7)) + 1; }},
  };
  for (const Bad& b : bads) {
    GemmCollCall c = valid(GemmColl::kAllReduce);
    ncclFusedConfig_t cfg = NCCL_FUSED_CONFIG_INITIALIZER;
    b.mut(c, cfg);
    std::string got = check(c, &cfg);
    EXPECT_NE(got.find(b.what), std::string::npos) << b.what << " -> " << got;
  }
}

TEST(FusedArgs, RowsMustSplitEvenly) {
  for (GemmColl op : {GemmColl::kAllGather, GemmColl::kReduceScatter}) {
    GemmCollCall c = valid(op);
    c.M = 250;
    EXPECT_NE(check(c, nullptr, 4).find("multiple of nranks"), std::string::npos);
    EXPECT_EQ(check(c, nullptr, 5), "");
  }
}

TEST(FusedArgs, AllGatherInPlaceOnly) {
  GemmCollCall c = valid(GemmColl::kAllGather);
  const size_t shard = c.M / 4 * c.K * 2;
  c.Agathered = const_cast<void*>(addr(5));
  c.A = static_cast<const char*>(c.Agathered) + 1 * shard;  // rank 1's block: in place
  EXPECT_EQ(check(c, nullptr, 4, 1), "");
  EXPECT_NE(check(c, nullptr, 4, 2).find("in place"), std::string::npos);
}

// An output of about 2^64 bytes at a high address: A + |A| and C + |C| wrap around, so a
// check written with sums would miss that C == A.
TEST(FusedArgs, OverlapSeenWhereEndsWrap) {
  GemmCollCall c = valid(GemmColl::kAllReduce);
  c.M = c.N = (size_t(1) << 31) - 1;
  c.K = 8;
  c.C = const_cast<void*>(c.A);
  ncclFusedConfig_t cfg = NCCL_FUSED_CONFIG_INITIALIZER;
  cfg.outType = ncclFloat32;
  EXPECT_NE(check(c, &cfg).find("overlap"), std::string::npos);
  // Two ranges that only touch do not overlap, whatever the addresses.
  const void* hi = reinterpret_cast<const void*>(~uintptr_t(0) - 255);
  EXPECT_FALSE(mk::overlaps(hi, 256, static_cast<const char*>(hi) - 256, 256));
  EXPECT_TRUE(mk::overlaps(hi, 256, static_cast<const char*>(hi) - 256, 257));
  EXPECT_TRUE(mk::overlaps(static_cast<const char*>(hi) - 256, ~uint64_t(0), hi, 1));
  EXPECT_FALSE(mk::overlaps(nullptr, 16, hi, 16));
}

// A struct whose size says it ends before `magic` is refused on its size, its magic and
// version never read (a smaller, foreign struct).
TEST(FusedArgs, TooSmallConfigRefusedOnItsSize) {
  ncclFusedConfig_t cfg = NCCL_FUSED_CONFIG_INITIALIZER;
  cfg.size = sizeof(size_t);
  cfg.magic = 0;
  const std::string got = check(valid(GemmColl::kAllReduce), &cfg);
  EXPECT_NE(got.find("size"), std::string::npos) << got;
  EXPECT_EQ(got.find("magic"), std::string::npos) << got;
}

TEST(FusedArgs, LargerConfigFromANewerHeader) {
  // A caller built against a later header passes a larger struct with a known version.
  struct {
    ncclFusedConfig_t cfg;
    int extra;
  } big = {NCCL_FUSED_CONFIG_INITIALIZER, 42};
  big.cfg.size = sizeof(big);
  big.cfg.outType = ncclFloat32;
  GemmCollCall c = valid(GemmColl::kReduceScatter);
  ASSERT_EQ(mk::fused::gemmCollCheck(&c, &big.cfg, 4, 0), ncclSuccess);
  EXPECT_EQ(c.cfg.outType, ncclFloat32);
}

TEST(FusedArgs, PublicApiRefusesNullComm) {
  EXPECT_EQ(ncclGemmAllReduce(addr(1), addr(2), const_cast<void*>(addr(3)), 16, 16, 16,
                              ncclBfloat16, nullptr, nullptr, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(pncclAllGatherGemm(addr(1), addr(2), const_cast<void*>(addr(3)), nullptr, 16, 16, 16,
                               ncclBfloat16, nullptr, nullptr, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclGemmReduceScatter(addr(1), addr(2), const_cast<void*>(addr(3)), 16, 16, 16,
                                  ncclBfloat16, nullptr, nullptr, nullptr),
            ncclInvalidArgument);
}

}  // namespace
