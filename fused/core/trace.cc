#include "fused/core/trace.h"

#include <cstring>
#include <mutex>
#include <vector>

#include "base/param.h"

namespace mk {
namespace fused {

namespace {

constexpr size_t kTraceBytes = (size_t)kTraceMaxCtas * kTraceMaxWords * sizeof(uint64_t);

struct TracePool {
  std::mutex mu;
  std::vector<uint64_t*> free;
};
TracePool& tracePool() {
  static TracePool* pool = new TracePool;  // outlives host functions still queued at exit
  return *pool;
}

}  // namespace

uint64_t* traceAcquire(int grid, bool capturing) {
  if (MK_PARAM_INT(FusedTrace) == 0 || capturing || grid > kTraceMaxCtas) return nullptr;
  {
    std::lock_guard<std::mutex> lock(tracePool().mu);
    if (!tracePool().free.empty()) {
      uint64_t* b = tracePool().free.back();
      tracePool().free.pop_back();
      return b;
    }
  }
  void* h = nullptr;
  if (cudaHostAlloc(&h, kTraceBytes, cudaHostAllocMapped) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  // Words a CTA writes only on some paths must read 0 otherwise.
  memset(h, 0, kTraceBytes);
  return static_cast<uint64_t*>(h);
}

void traceRelease(uint64_t* stamps) {
  if (stamps == nullptr) return;
  memset(stamps, 0, kTraceBytes);
  std::lock_guard<std::mutex> lock(tracePool().mu);
  tracePool().free.push_back(stamps);
}

void traceReleaseAfter(cudaStream_t stream, uint64_t* stamps) {
  if (stamps == nullptr) return;
  auto release = [](void* b) { traceRelease(static_cast<uint64_t*>(b)); };
  if (cudaLaunchHostFunc(stream, release, stamps) != cudaSuccess) (void)cudaGetLastError();
}

bool traceQueue(cudaStream_t stream, cudaHostFn_t print, void* arg, uint64_t* stamps) {
  if (cudaLaunchHostFunc(stream, print, arg) == cudaSuccess) return true;
  (void)cudaGetLastError();
  (void)stamps;  // the kernel may still write them: kept out of the pool for good
  return false;
}

}  // namespace fused
}  // namespace mk
