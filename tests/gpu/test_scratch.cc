// The library's stream-ordered scratch pool (src/base/scratch.h): what a call stages stays
// reserved across a device synchronisation (the default pool would hand it back), the
// memory is usable and reused, a comm's destruction trims it, and an allocation inside a
// stream capture becomes part of the graph.
#include <cstdint>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <string>
#include <vector>

#include "base/scratch.h"
#include "common/test_util.h"

namespace {

constexpr size_t kBytes = size_t(256) << 20;

// Fills p with v on s and checks every byte on the host.
std::string fillAndCheck(void* p, size_t bytes, unsigned char v, cudaStream_t s) {
  if (cudaMemsetAsync(p, v, bytes, s) != cudaSuccess) return "memset failed";
  std::vector<unsigned char> h(bytes);
  if (cudaMemcpyAsync(h.data(), p, bytes, cudaMemcpyDeviceToHost, s) != cudaSuccess)
    return "copy failed";
  if (cudaStreamSynchronize(s) != cudaSuccess) return "sync failed";
  for (size_t i = 0; i < bytes; ++i)
    if (h[i] != v) return "byte " + std::to_string(i) + " is " + std::to_string(h[i]);
  return "";
}

TEST(ScratchPool, KeptAcrossSyncThenTrimmed) {
  MKTEST_REQUIRE_GPU();
  int dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(mk::scratchAlloc(&p, kBytes, dev, s), ncclSuccess);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(fillAndCheck(p, kBytes, 0x5a, s), "");
  ASSERT_EQ(mk::scratchFree(p, s), ncclSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The default pool would have released it at the synchronisation above.
  EXPECT_GE(mk::scratchReserved(dev), kBytes);
  // Served again from what the pool kept, and usable.
  void* q = nullptr;
  ASSERT_EQ(mk::scratchAlloc(&q, kBytes, dev, s), ncclSuccess);
  EXPECT_EQ(fillAndCheck(q, kBytes, 0xa5, s), "");
  ASSERT_EQ(mk::scratchFree(q, s), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  mk::scratchTrim(dev);
  // Whatever earlier tests of this binary still hold may stay; this test's 256 MiB may not.
  EXPECT_LT(mk::scratchReserved(dev), kBytes);
  void* none = &dev;
  EXPECT_EQ(mk::scratchAlloc(&none, 0, dev, s), ncclSuccess);
  EXPECT_EQ(none, nullptr);
  EXPECT_EQ(mk::scratchFree(nullptr, s), ncclSuccess);
  cudaStreamDestroy(s);
}

TEST(ScratchPool, CapturedAllocationIsPartOfTheGraph) {
  MKTEST_REQUIRE_GPU();
  int dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  // The pool exists before the capture (made by an eager call, as in every real use).
  void* warm = nullptr;
  ASSERT_EQ(mk::scratchAlloc(&warm, 1 << 20, dev, s), ncclSuccess);
  ASSERT_EQ(mk::scratchFree(warm, s), ncclSuccess);
  unsigned char* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 1 << 20), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(out, 0, 1 << 20, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGraph_t g = nullptr;
  cudaGraphExec_t x = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  void* p = nullptr;
  const ncclResult_t a = mk::scratchAlloc(&p, 1 << 20, dev, s);
  if (a == ncclSuccess) {
    cudaMemsetAsync(p, 0x3c, 1 << 20, s);
    cudaMemcpyAsync(out, p, 1 << 20, cudaMemcpyDeviceToDevice, s);
  }
  const ncclResult_t f = a == ncclSuccess ? mk::scratchFree(p, s) : ncclSuccess;
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  ASSERT_EQ(a, ncclSuccess);
  ASSERT_EQ(f, ncclSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
  for (int rep = 0; rep < 3; ++rep) {
    ASSERT_EQ(cudaMemsetAsync(out, 0, 1 << 20, s), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(x, s), cudaSuccess);
    std::vector<unsigned char> h(1 << 20);
    ASSERT_EQ(cudaMemcpyAsync(h.data(), out, h.size(), cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    size_t bad = 0;
    for (unsigned char c : h) bad += c != 0x3c;
    EXPECT_EQ(bad, 0u) << "replay " << rep;
  }
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);
  cudaFree(out);
  cudaStreamDestroy(s);
}

}  // namespace
