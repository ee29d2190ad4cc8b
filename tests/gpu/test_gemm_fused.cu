// The role framework's reference operator (fused/core/example_gemm_copy): compute CTAs run
// the GEMM and publish tiles, communication CTAs copy each tile to a second buffer as soon
// as its flag is released. Both outputs are checked element-wise against the fp64
// reference, over several calls whose sequence numbers grow while the flags are never reset.
#include <cstdint>
#include <string>
#include <vector>

#include "fused/core/cost_model.h"
#include "fused/core/example_gemm_copy.h"
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

TEST(GemmFused, ExampleGemmCopyRoles) {
  std::string why;
  if (!sm90(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  mk::rt::Domain* st = nullptr;
  ASSERT_EQ(mk::rt::domainCreate(0, &st), ncclSuccess);
  const uint64_t seed = mktest::testSeed();
  for (BLayout bl : {BLayout::kNK, BLayout::kKN}) {
    Problem p(1500, 2000, 384, bl, DType::kBF16, DType::kBF16);
    SCOPED_TRACE(p.name());
    p.alloc();
    const int nTiles = mk::gemm::tilesM(p.args()) * mk::gemm::tilesN(p.args());
    uint64_t *tileFlags = nullptr, *copyFlags = nullptr;
    void* dst = nullptr;
    GT_CUDA(cudaMalloc(&tileFlags, nTiles * sizeof(uint64_t)));
    GT_CUDA(cudaMalloc(&copyFlags, nTiles * sizeof(uint64_t)));
    GT_CUDA(cudaMemset(tileFlags, 0, nTiles * sizeof(uint64_t)));  // once
    GT_CUDA(cudaMemset(copyFlags, 0, nTiles * sizeof(uint64_t)));
    GT_CUDA(cudaMalloc(&dst, p.bytesD()));
    // commSms: API override (2, 9) then the cost model (-1).
    const int commSms[] = {2, 9, -1};
    for (uint64_t seq = 1; seq <= 3; ++seq) {
      SCOPED_TRACE(testing::Message() << "seq=" << seq << " commSms=" << commSms[seq - 1]);
      p.randomize(seed + seq);
      p.poison();
      GT_CUDA(cudaMemset(dst, 0xFF, p.bytesD()));
      p.reference();
      mk::fused::GemmCopyArgs a;
      a.gemm = p.args();
      a.copyDst = dst;
      a.tileFlags = tileFlags;
      a.copyFlags = copyFlags;
      a.seq = seq;
      a.commSms = commSms[seq - 1];
      a.domain = st;
      a.timeoutMs = 20000;
      std::string why2;
      ASSERT_TRUE(mk::fused::canImplement(a, &why2)) << why2;
      mk::fused::SmSplit split;
      ASSERT_EQ(mk::fused::launch(a, 0, &split), ncclSuccess);
      GT_CUDA(cudaDeviceSynchronize());
      printf("[gemm-fused] seq %llu split compute=%d intra-comm=%d\n", (unsigned long long)seq,
             split.of(mk::fused::Role::kCompute), split.of(mk::fused::Role::kIntraComm));
      std::string msg;
      ASSERT_EQ(mk::rt::domainCheck(st, &msg), ncclSuccess) << msg;
      EXPECT_EQ(p.check(), "") << "(GEMM output)";
      EXPECT_EQ(p.check(dst), "") << "(copied by the comm role)";
      std::vector<uint64_t> cf(nTiles);
      GT_CUDA(cudaMemcpy(cf.data(), copyFlags, nTiles * sizeof(uint64_t), cudaMemcpyDeviceToHost));
      for (int t = 0; t < nTiles; ++t) ASSERT_EQ(cf[t], seq) << "tile " << t;
    }
    cudaFree(tileFlags);
    cudaFree(copyFlags);
    cudaFree(dst);
  }
  mk::rt::domainDestroy(st);
}

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
