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
  std::vector<bool> unsupported;    // per device: no pool possible, the default one serves
};

Pools& pools() {
  static Pools* p = new Pools();  // never destroyed: frees may come from atexit handlers
  return *p;
}

// Pool creation and trimming are not stream operations; another thread's capture in global
// mode would refuse them (and be broken by them) unless this thread is in relaxed mode.
struct RelaxedCapture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode); }
};

uint64_t keepBytes(int dev) {
  const int64_t mb = MK_PARAM_INT(ScratchKeepMb);
  if (mb >= 0) return (uint64_t)mb << 20;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return (uint64_t)prop.totalGlobalMem / 4;
}

cudaMemPool_t makePool(int dev) {
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = dev;
  cudaMemPool_t pool = nullptr;
  RelaxedCapture relaxed;
  if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  uint64_t keep = keepBytes(dev);
  // No reuse that makes an allocation wait for another stream's pending free: ranks of one
  // process on one GPU allocate on their own streams, and a rank's free follows a kernel
  // that waits for its peers, which may be the very rank whose allocation would wait.
  int no = 0;
  if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess ||
      cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &no) !=
          cudaSuccess) {
    cudaGetLastError();
    MK_WARN("scratch: cannot configure the memory pool of GPU %d", dev);
  }
  MK_INFO(kAlloc, "scratch: memory pool on GPU %d keeps up to %llu MiB across synchronisations",
          dev, (unsigned long long)(keep >> 20));
  return pool;
}

// The pool of dev, made on first use; null when the device cannot have one (then the
// default pool serves, as before) or while a creation failed (tried again next call).
cudaMemPool_t poolOf(int dev) {
  Pools& ps = pools();
  std::lock_guard<std::mutex> lock(ps.mu);
  if (dev < 0) return nullptr;
  if ((size_t)dev >= ps.pool.size()) {
    ps.pool.resize(dev + 1, nullptr);
    ps.unsupported.resize(dev + 1, false);
  }
  if (ps.pool[dev] != nullptr || ps.unsupported[dev]) return ps.pool[dev];
  int supported = 0;
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev) == cudaSuccess &&
      !supported) {
    ps.unsupported[dev] = true;
    MK_INFO(kAlloc, "scratch: GPU %d has no memory pools; using cudaMallocAsync", dev);
    return nullptr;
  }
  cudaGetLastError();
  ps.pool[dev] = makePool(dev);
  return ps.pool[dev];
}

cudaMemPool_t existingPool(int dev) {
  Pools& ps = pools();
  std::lock_guard<std::mutex> lock(ps.mu);
  return dev >= 0 && (size_t)dev < ps.pool.size() ? ps.pool[dev] : nullptr;
}

}  // namespace

ncclResult_t scratchAlloc(void** p, size_t bytes, int dev, cudaStream_t s) {
  *p = nullptr;
  if (bytes == 0) return ncclSuccess;
  cudaMemPool_t pool = poolOf(dev);
  if (pool == nullptr) {
    CUDACHECK(cudaMallocAsync(p, bytes, s));
    return ncclSuccess;
  }
  cudaError_t e = cudaMallocFromPoolAsync(p, bytes, pool, s);
  if (e == cudaErrorMemoryAllocation) {
    // What the pool keeps may be what is missing: give it back and try once more.
    cudaGetLastError();
    scratchTrim(dev);
    e = cudaMallocFromPoolAsync(p, bytes, pool, s);
  }
  CUDACHECK(e);
  return ncclSuccess;
}

ncclResult_t scratchFree(void* p, cudaStream_t s) {
  if (p == nullptr) return ncclSuccess;
  CUDACHECK(cudaFreeAsync(p, s));
  return ncclSuccess;
}

void scratchTrim(int dev) {
  cudaMemPool_t pool = existingPool(dev);  // trimmed outside the lock: unmapping takes time
  if (pool == nullptr) return;
  RelaxedCapture relaxed;
  if (cudaMemPoolTrimTo(pool, 0) != cudaSuccess) cudaGetLastError();
}

size_t scratchReserved(int dev) {
  cudaMemPool_t pool = existingPool(dev);
  uint64_t v = 0;
  if (pool == nullptr) return 0;
  if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return (size_t)v;
}

}  // namespace mk
