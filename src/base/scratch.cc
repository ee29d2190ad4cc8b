#include "base/scratch.h"

#include <cstdint>
#include <mutex>
#include <vector>

#include "base/checks.h"
#include "base/debug.h"
#include "base/param.h"

namespace mk {

namespace {

struct Pools {
  std::mutex mu;
  std::vector<cudaMemPool_t> pool;  // per device; null: not made yet
  std::vector<bool> failed;         // per device: no pool possible, use the default one
};

Pools& pools() {
  static Pools* p = new Pools();  // never destroyed: frees may come from atexit handlers
  return *p;
}

uint64_t keepBytes() {
  const int64_t mb = MK_PARAM_INT(ScratchKeepMb);
  return mb < 0 ? UINT64_MAX : (uint64_t)mb << 20;
}

// The pool of dev, made on first use; null when the device cannot have one (then the
// default pool serves, as before). Not made while s is capturing: pool creation is not a
// stream operation and is best kept out of a capture.
cudaMemPool_t poolOf(int dev, cudaStream_t s) {
  Pools& ps = pools();
  std::lock_guard<std::mutex> lock(ps.mu);
  if (dev < 0) return nullptr;
  if ((size_t)dev >= ps.pool.size()) {
    ps.pool.resize(dev + 1, nullptr);
    ps.failed.resize(dev + 1, false);
  }
  if (ps.pool[dev] != nullptr || ps.failed[dev]) return ps.pool[dev];
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return nullptr;
  }
  int supported = 0;
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = dev;
  cudaMemPool_t pool = nullptr;
  uint64_t keep = keepBytes();
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev) != cudaSuccess ||
      !supported || cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
    cudaGetLastError();
    ps.failed[dev] = true;
    MK_INFO(kAlloc, "scratch: no memory pool on GPU %d; using the device's default pool", dev);
    return nullptr;
  }
  if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess) {
    cudaGetLastError();
    MK_WARN("scratch: cannot set the pool's release threshold on GPU %d", dev);
  }
  ps.pool[dev] = pool;
  MK_INFO(kAlloc, "scratch: memory pool on GPU %d keeps %s", dev,
          keep == UINT64_MAX ? "all it grows to" : "MKERNEL_SCRATCH_KEEP_MB");
  return pool;
}

}  // namespace

ncclResult_t scratchAlloc(void** p, size_t bytes, cudaStream_t s) {
  *p = nullptr;
  if (bytes == 0) return ncclSuccess;
  int dev = -1;
  CUDACHECK(cudaGetDevice(&dev));
  cudaMemPool_t pool = poolOf(dev, s);
  if (pool != nullptr) {
    CUDACHECK(cudaMallocFromPoolAsync(p, bytes, pool, s));
  } else {
    CUDACHECK(cudaMallocAsync(p, bytes, s));
  }
  return ncclSuccess;
}

ncclResult_t scratchFree(void* p, cudaStream_t s) {
  if (p == nullptr) return ncclSuccess;
  CUDACHECK(cudaFreeAsync(p, s));
  return ncclSuccess;
}

void scratchTrim(int dev) {
  Pools& ps = pools();
  std::lock_guard<std::mutex> lock(ps.mu);
  if (dev < 0 || (size_t)dev >= ps.pool.size() || ps.pool[dev] == nullptr) return;
  if (cudaMemPoolTrimTo(ps.pool[dev], 0) != cudaSuccess) cudaGetLastError();
}

size_t scratchReserved(int dev) {
  Pools& ps = pools();
  std::lock_guard<std::mutex> lock(ps.mu);
  if (dev < 0 || (size_t)dev >= ps.pool.size() || ps.pool[dev] == nullptr) return 0;
  uint64_t v = 0;
  if (cudaMemPoolGetAttribute(ps.pool[dev], cudaMemPoolAttrReservedMemCurrent, &v) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return (size_t)v;
}

}  // namespace mk
