// CUDA driver API through entry points fetched from the runtime at first use:
// libmkernel never links libcuda, so it loads (and argument checks, bootstrap and
// the CPU tests run) on machines that have no driver.
#pragma once
#include <cuda.h>
#include <nccl.h>

namespace mk {

#define MK_CU_FUNCS(X)                      \
  X(cuGetErrorString)                       \
  X(cuDeviceGet)                            \
  X(cuDeviceGetAttribute)                   \
  X(cuCtxGetCurrent)                        \
  X(cuCtxGetDevice)                         \
  X(cuMemCreate)                            \
  X(cuMemRelease)                           \
  X(cuMemMap)                               \
  X(cuMemUnmap)                             \
  X(cuMemAddressReserve)                    \
  X(cuMemAddressFree)                       \
  X(cuMemSetAccess)                         \
  X(cuMemExportToShareableHandle)           \
  X(cuMemImportFromShareableHandle)         \
  X(cuMemGetAllocationGranularity)          \
  X(cuMemGetAllocationPropertiesFromHandle) \
  X(cuMemRetainAllocationHandle)            \
  X(cuMemGetAddressRange)                   \
  X(cuMemGetHandleForAddressRange)          \
  X(cuPointerGetAttribute)                  \
  X(cuTensorMapEncodeTiled)                 \
  X(cuFlushGPUDirectRDMAWrites)

struct CuFuncs {
#define MK_CU_DECL(name) decltype(&::name) name = nullptr;
  MK_CU_FUNCS(MK_CU_DECL)
#undef MK_CU_DECL
};

extern CuFuncs cu;

// Loads the table once; ncclUnhandledCudaError (with a message) when there is no
// usable driver. Safe to call from many threads.
ncclResult_t cudaLibInit();
const char* cuErrorString(CUresult r);

// Makes dev the calling thread's current device; restores the previous one on scope exit.
// Entry points that may be called from any thread with any device current use it.
struct DeviceGuard {
  int prev = -1;
  bool changed = false;
  ncclResult_t set(int dev);
  ~DeviceGuard();
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
};

}  // namespace mk
