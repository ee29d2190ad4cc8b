#include "base/cudawrap.h"

#include <cuda_runtime.h>
#include <mutex>

#include "base/checks.h"

namespace mk {

CuFuncs cu;

namespace {
ncclResult_t loadTable() {
  int devs = 0;
  cudaError_t err = cudaGetDeviceCount(&devs);
  if (err != cudaSuccess || devs == 0) {
    MK_WARN("No usable CUDA device: %s",
            err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0");
    return ncclUnhandledCudaError;
  }
  cudaDriverEntryPointQueryResult q;
#define MK_CU_LOAD(name)                                                              \
  {                                                                                   \
    void* fn = nullptr;                                                               \
    if (cudaGetDriverEntryPointByVersion(#name, &fn, 12000, cudaEnableDefault, &q) != \
            cudaSuccess ||                                                            \
        q != cudaDriverEntryPointSuccess || fn == nullptr) {                          \
      MK_WARN("CUDA driver entry point %s not found", #name);                         \
      return ncclUnhandledCudaError;                                                  \
    }                                                                                 \
    cu.name = reinterpret_cast<decltype(cu.name)>(fn);                                \
  }
  MK_CU_FUNCS(MK_CU_LOAD)
#undef MK_CU_LOAD
  return ncclSuccess;
}
}  // namespace

ncclResult_t cudaLibInit() {
  static std::once_flag once;
  static ncclResult_t result = ncclSuccess;
  std::call_once(once, [] { result = loadTable(); });
  if (result != ncclSuccess) MK_WARN("CUDA driver API unavailable: no GPU or no driver here");
  return result;
}

const char* cuErrorString(CUresult r) {
  const char* s = nullptr;
  if (cu.cuGetErrorString && cu.cuGetErrorString(r, &s) == CUDA_SUCCESS && s) return s;
  return "unknown CUDA driver error";
}

ncclResult_t DeviceGuard::set(int dev) {
  if (cudaGetDevice(&prev) != cudaSuccess) {
    cudaGetLastError();
    prev = -1;
  }
  if (prev != dev) {
    CUDACHECK(cudaSetDevice(dev));
    changed = true;
  }
  return ncclSuccess;
}

DeviceGuard::~DeviceGuard() {
  if (changed && prev >= 0) cudaSetDevice(prev);
}

}  // namespace mk
