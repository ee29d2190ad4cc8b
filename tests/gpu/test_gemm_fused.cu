// The cost model's device rates. (The role framework's reference operator runs on a comm
// now: fused/ops/example, tests/gpu/test_fused_example.cu.)
#include <cstdint>
#include <string>
#include <vector>

#include "fused/core/cost_model.h"
#include "test_gemm_util.cuh"

using namespace gemmtest;

// Rates measured once per device and cached; a second query comes from the cache.
TEST(GemmFused, DeviceRatesMeasuredAndCached) {
  GEMMTEST_REQUIRE_SM90();
  mk::fused::DeviceRates r;
  ASSERT_EQ(mk::fused::getDeviceRates(0, &r), ncclSuccess);
  printf("[gemm-fused] rates: %s", mk::fused::formatRates(r).c_str());
  EXPECT_GT(r.sms, 0);
  EXPECT_GT(r.gemmTflopsPerSm, 0.5);
  EXPECT_GT(r.copyGBpsPerSm, 1.0);
}
