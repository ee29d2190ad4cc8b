// The persistent role framework shared by every fused operator (host side).
//
// Anatomy of a fused operator (fused/ops/example/ is the reference; fused/README.md):
//   1. Args     - what the caller passes (buffers, shapes, SM override).
//   2. Config   - compile-time tile/threads/shared memory, with static_asserts on the
//                 shared-memory and register budgets; run-time SmSplit from resolveSplit().
//   3. canImplement(args, &why) - host-only checks, a clear message, no CUDA calls.
//   4. launch(args, comm, stream) - the comm's view (fused_comm.h), the split, the kernel
//                                 params; fusedEnqueue() runs launchRoles() (cooperative:
//                                 all CTAs co-resident or an error) in the comm's order.
//   5. kernel(params)           - `split.roleOf(blockIdx.x)` dispatches to one device
//                                 function per role; roles exchange work through per-tile
//                                 flags carrying 64-bit sequence numbers (never reset by the
//                                 host) and wait with the device runtime's bounded waits
//                                 (device/rt/wait.cuh: abort flag, deadline, error record).
#pragma once
#include <cstdint>
#include <string>
#include <cuda_runtime.h>
#include <nccl.h>

#include "base/checks.h"
#include "fused/core/types.h"

namespace mk {
namespace fused {

struct DeviceInfo {
  int device = 0;
  int sms = 0;
  int smemOptin = 0;
  int major = 0, minor = 0;
};

// Read once per device from the runtime (never hard-coded).
ncclResult_t getDeviceInfo(int device, DeviceInfo* out);

// Launches `kernel` with `grid` CTAs as a cooperative launch: the runtime refuses a grid that
// cannot be co-resident instead of letting roles wait on CTAs that never start. grid 0 only
// sets the shared-memory attribute, which loads the kernel (a lazy load at the first launch
// can wait for the device, where a peer's kernel may wait for the calling thread). grid < 0
// launches nothing either: ncclInvalidUsage unless -grid CTAs fit the device at once, for an
// operator that must know before it enqueues the steps its peers' kernels depend on.
template <typename Params>
ncclResult_t launchCooperative(void (*kernel)(Params), int grid, int threads, size_t smem,
                               cudaStream_t stream, const Params& params) {
  CUDACHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  if (grid < 0) {
    int dev = 0, sms = 0, perSm = 0;
    CUDACHECK(cudaGetDevice(&dev));
    CUDACHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUDACHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kernel, threads, smem));
    if ((int64_t)perSm * sms >= -(int64_t)grid) return ncclSuccess;
    MK_WARN(
        "a cooperative grid of %d CTAs does not fit: %d CTAs a multiprocessor, %d "
        "multiprocessors",
        -grid, perSm, sms);
    return ncclInvalidUsage;
  }
  if (grid == 0) return ncclSuccess;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CUDACHECK(cudaLaunchKernelEx(&cfg, kernel, params));
  return ncclSuccess;
}

// Launches `kernel` with split.total() CTAs, cooperatively (launchCooperative).
template <typename Params>
ncclResult_t launchRoles(void (*kernel)(Params), const SmSplit& split, int threads, size_t smem,
                         cudaStream_t stream, const Params& params) {
  MK_ARGCHECK(split.total() > 0, "fused launch with an empty SM split");
  return launchCooperative(kernel, split.total(), threads, smem, stream, params);
}

}  // namespace fused
}  // namespace mk
