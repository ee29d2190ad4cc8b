// The fused kernels' role split (fused/core/cost_model.h), checked on the CPU: the cost model's
// split follows the communication load, the API and environment overrides win in that order,
// measured rates round-trip through their cache format, and a split hands out roles in order.
// (Moved out of test_gemm_can_implement.cc, which is about the GEMM engine's argument rules.)
#include <gtest/gtest.h>

#include <cstdlib>

#include "base/param.h"
#include "fused/core/cost_model.h"

TEST(FusedCostModel, SplitFollowsCommunicationLoad) {
  mk::fused::DeviceRates r;
  r.sms = 132;
  r.gemmTflopsPerSm = 5.8;
  r.copyGBpsPerSm = 40;
  r.copyGBpsPeak = 3000;
  mk::fused::SplitQuery q;
  q.M = 8192;
  q.N = 8192;
  q.K = 8192;
  q.nRanks = 8;
  q.intraBytes = 2.0 * 8192 * 8192 * 2;  // ~ AllReduce traffic of a bf16 output
  auto c = mk::fused::chooseSplit(q, r, 132);
  EXPECT_EQ(c.split.total(), 132);
  EXPECT_GT(c.split.of(mk::fused::Role::kIntraComm), 0);
  EXPECT_LE(c.split.of(mk::fused::Role::kIntraComm), 66);
  EXPECT_TRUE(c.fuse);
  // Much more traffic per FLOP wants more comm SMs.
  mk::fused::SplitQuery q2 = q;
  q2.K = 1024;
  auto c2 = mk::fused::chooseSplit(q2, r, 132);
  EXPECT_GE(c2.split.of(mk::fused::Role::kIntraComm), c.split.of(mk::fused::Role::kIntraComm));
  // Multi-node: send and reduce roles get CTAs.
  q.nNodes = 2;
  q.interBytes = 1e8;
  auto c3 = mk::fused::chooseSplit(q, r, 132);
  EXPECT_EQ(c3.split.of(mk::fused::Role::kInterSend), 1);
  EXPECT_EQ(c3.split.of(mk::fused::Role::kInterReduce), 1);
  // Tiny problem: fusing is not worth it.
  mk::fused::SplitQuery q4;
  q4.M = 128;
  q4.N = 256;
  q4.K = 64;
  q4.intraBytes = 64e6;
  EXPECT_FALSE(mk::fused::chooseSplit(q4, r, 132).fuse);
}

TEST(FusedCostModel, OverridesApiThenEnv) {
  mk::fused::DeviceRates r;
  r.sms = 132;
  r.gemmTflopsPerSm = 5.8;
  r.copyGBpsPerSm = 40;
  mk::fused::SplitQuery q;
  q.M = q.N = q.K = 4096;
  q.intraBytes = 1e8;
  setenv("MKERNEL_FUSED_COMM_SMS", "12", 1);
  mk::paramReset();
  auto e = mk::fused::resolveSplit(q, r, 132, -1);
  EXPECT_STREQ(e.source, "env");
  EXPECT_EQ(e.split.of(mk::fused::Role::kIntraComm), 12);
  EXPECT_EQ(e.split.of(mk::fused::Role::kCompute), 120);
  auto a = mk::fused::resolveSplit(q, r, 132, 20);
  EXPECT_STREQ(a.source, "api");
  EXPECT_EQ(a.split.of(mk::fused::Role::kIntraComm), 20);
  unsetenv("MKERNEL_FUSED_COMM_SMS");
  mk::paramReset();
  EXPECT_STREQ(mk::fused::resolveSplit(q, r, 132, -1).source, "model");
}

TEST(FusedCostModel, RatesCacheRoundTrip) {
  mk::fused::DeviceRates r, back;
  r.sms = 132;
  r.gemmTflopsPerSm = 5.75;
  r.copyGBpsPerSm = 41.5;
  r.copyGBpsPeak = 3900;
  ASSERT_TRUE(mk::fused::parseRates(mk::fused::formatRates(r), &back));
  EXPECT_EQ(back.sms, 132);
  EXPECT_NEAR(back.gemmTflopsPerSm, 5.75, 1e-6);
  EXPECT_FALSE(mk::fused::parseRates("garbage", &back));
}

TEST(FusedRoles, SplitAssignsRolesInOrder) {
  mk::fused::SmSplit s;
  s.count[0] = 3;
  s.count[1] = 2;
  s.count[3] = 1;
  int idx;
  EXPECT_EQ(s.roleOf(0, &idx), mk::fused::Role::kCompute);
  EXPECT_EQ(s.roleOf(2, &idx), mk::fused::Role::kCompute);
  EXPECT_EQ(idx, 2);
  EXPECT_EQ(s.roleOf(3, &idx), mk::fused::Role::kIntraComm);
  EXPECT_EQ(idx, 0);
  EXPECT_EQ(s.roleOf(5, &idx), mk::fused::Role::kInterReduce);
  EXPECT_EQ(s.roleOf(6, &idx), mk::fused::Role::kCount);
}
