// Process-wide API functions: version, error strings, unique ids, memory.
#include "bootstrap/bootstrap.h"
#include "api/api.h"
#include "base/checks.h"
#include "transport/peer_mem.h"

MK_API(ncclResult_t, ncclGetVersion, int* version) {
  MK_ARGCHECK(version != nullptr, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

MK_API(const char*, ncclGetErrorString, ncclResult_t code) {
  // NCCL's exact strings: frameworks match on them.
  switch (code) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

MK_API(const char*, ncclGetLastError, ncclComm_t comm) {
  return mk::lastError();
}

MK_API(void, ncclResetDebugInit) {
  mk::logReset();
}

MK_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId* uniqueId) {
  MK_ARGCHECK(uniqueId != nullptr, "ncclGetUniqueId: uniqueId is NULL");
  mk::logVersionBanner();
  return mk::apiGuard("ncclGetUniqueId", [&] { return mk::bootstrapGetUniqueId(uniqueId); });
}

MK_API(ncclResult_t, ncclMemAlloc, void** ptr, size_t size) {
  MK_ARGCHECK(ptr != nullptr, "ncclMemAlloc: ptr is NULL");
  if (size == 0) {  // as NCCL (cudaMalloc of 0 bytes): no memory, no error
    *ptr = nullptr;
    return ncclSuccess;
  }
  return mk::apiGuard("ncclMemAlloc", [&] { return mk::memAlloc(ptr, size); });
}

MK_API(ncclResult_t, ncclMemFree, void* ptr) {
  if (ptr == nullptr) return ncclSuccess;  // like free(NULL)
  return mk::apiGuard("ncclMemFree", [&] { return mk::memFree(ptr); });
}
