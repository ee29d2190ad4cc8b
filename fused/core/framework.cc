#include "fused/core/framework.h"

#include <cstdint>
#include <mutex>

namespace mk {
namespace fused {

const char* roleName(Role r) {
  switch (r) {
    case Role::kCompute:
      return "compute";
    case Role::kIntraComm:
      return "intra-comm";
    case Role::kInterSend:
      return "inter-send";
    case Role::kInterReduce:
      return "inter-reduce";
    default:
      return "none";
  }
}

ncclResult_t getDeviceInfo(int device, DeviceInfo* out) {
  static std::mutex mu;
  static DeviceInfo cache[64];
  static bool have[64] = {};
  MK_ARGCHECK(device >= 0 && device < 64, "device %d out of range", device);
  std::lock_guard<std::mutex> lock(mu);
  if (!have[device]) {
    DeviceInfo d;
    d.device = device;
    CUDACHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device));
    CUDACHECK(
        cudaDeviceGetAttribute(&d.smemOptin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    CUDACHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device));
    CUDACHECK(cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, device));
    cache[device] = d;
    have[device] = true;
  }
  *out = cache[device];
  return ncclSuccess;
}

}  // namespace fused
}  // namespace mk
