// The cost model's device rates. (The role framework's reference operator runs on a comm
// now: fused/ops/example, tests/gpu/test_fused_example.cu.)
#include <cstdint>
#include <string>
#include <vector>

#include "fused/core/cost_model.h"
#include "test_gemm_util.cuh"

using namespace gemmtest;

namespace {

bool sm90(std::string* why) {
  if (!mktest::haveGpu(why)) return false;
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  if (major != 9) {
    *why = "GEMM engine needs sm_90";
    return false;
  }
  return true;
}

}  // namespace

// Rates measured once per device and cached; a second query comes from the cache.
TEST(GemmFused, DeviceRatesMeasuredAndCached) {
  std::string why;
  if (!sm90(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  mk::fused::DeviceRates r;
  ASSERT_EQ(mk::fused::getDeviceRates(0, &r), ncclSuccess);
  printf("[gemm-fused] rates: %s", mk::fused::formatRates(r).c_str());
  EXPECT_GT(r.sms, 0);
  EXPECT_GT(r.gemmTflopsPerSm, 0.5);
  EXPECT_GT(r.copyGBpsPerSm, 1.0);
}
