// The one macro family for checking calls. Every internal function returns
// ncclResult_t; a failure is logged as "file:line -> code" at INFO and propagated.
// The GOTO variants store the result and jump to a cleanup label.
#pragma once
#include <cerrno>
#include <cstring>
#include <cuda_runtime.h>
#include <nccl.h>

#include "base/debug.h"

#define MK_TRACE_FAIL(res) MK_INFO(::mk::kAllSubsys, "%s:%d -> %d", __FILE__, __LINE__, (int)(res))

#define NCCLCHECK(call)                                      \
  do {                                                       \
    ncclResult_t mkRes_ = (call);                            \
    if (mkRes_ != ncclSuccess && mkRes_ != ncclInProgress) { \
      MK_TRACE_FAIL(mkRes_);                                 \
      return mkRes_;                                         \
    }                                                        \
  } while (0)

#define NCCLCHECKGOTO(call, res, label)                    \
  do {                                                     \
    (res) = (call);                                        \
    if ((res) != ncclSuccess && (res) != ncclInProgress) { \
      MK_TRACE_FAIL(res);                                  \
      goto label;                                          \
    }                                                      \
  } while (0)

#define CUDACHECK(cmd)                                                      \
  do {                                                                      \
    cudaError_t mkErr_ = (cmd);                                             \
    if (mkErr_ != cudaSuccess) {                                            \
      MK_WARN("CUDA failure '%s' in %s", cudaGetErrorString(mkErr_), #cmd); \
      return ncclUnhandledCudaError;                                        \
    }                                                                       \
  } while (0)

#define CUDACHECKGOTO(cmd, res, label)                                      \
  do {                                                                      \
    cudaError_t mkErr_ = (cmd);                                             \
    if (mkErr_ != cudaSuccess) {                                            \
      MK_WARN("CUDA failure '%s' in %s", cudaGetErrorString(mkErr_), #cmd); \
      (res) = ncclUnhandledCudaError;                                       \
      goto label;                                                           \
    }                                                                       \
  } while (0)

// Driver API calls go through the entry-point table in base/cudawrap.h.
#define CUCHECK(cmd)                                                                         \
  do {                                                                                       \
    CUresult mkCu_ = ::mk::cu.cmd;                                                           \
    if (mkCu_ != CUDA_SUCCESS) {                                                             \
      MK_WARN("CUDA driver failure %d (%s) in cu%s", (int)mkCu_, ::mk::cuErrorString(mkCu_), \
              #cmd);                                                                         \
      return ncclUnhandledCudaError;                                                         \
    }                                                                                        \
  } while (0)

#define CUCHECKGOTO(cmd, res, label)                                                         \
  do {                                                                                       \
    CUresult mkCu_ = ::mk::cu.cmd;                                                           \
    if (mkCu_ != CUDA_SUCCESS) {                                                             \
      MK_WARN("CUDA driver failure %d (%s) in cu%s", (int)mkCu_, ::mk::cuErrorString(mkCu_), \
              #cmd);                                                                         \
      (res) = ncclUnhandledCudaError;                                                        \
      goto label;                                                                            \
    }                                                                                        \
  } while (0)

// System calls returning -1 and setting errno. EINTR is retried.
#define SYSCHECK(call, name)                                   \
  do {                                                         \
    int mkRet_;                                                \
    do {                                                       \
      mkRet_ = (call);                                         \
    } while (mkRet_ == -1 && errno == EINTR);                  \
    if (mkRet_ == -1) {                                        \
      MK_WARN("Call to %s failed: %s", name, strerror(errno)); \
      return ncclSystemError;                                  \
    }                                                          \
  } while (0)

#define SYSCHECKGOTO(call, name, res, label)                   \
  do {                                                         \
    int mkRet_;                                                \
    do {                                                       \
      mkRet_ = (call);                                         \
    } while (mkRet_ == -1 && errno == EINTR);                  \
    if (mkRet_ == -1) {                                        \
      MK_WARN("Call to %s failed: %s", name, strerror(errno)); \
      (res) = ncclSystemError;                                 \
      goto label;                                              \
    }                                                          \
  } while (0)

// pthread-style calls returning an error number.
#define PTHREADCHECK(call, name)                                \
  do {                                                          \
    int mkRet_ = (call);                                        \
    if (mkRet_ != 0) {                                          \
      MK_WARN("Call to %s failed: %s", name, strerror(mkRet_)); \
      return ncclSystemError;                                   \
    }                                                           \
  } while (0)

// Argument checks: a clear message and ncclInvalidArgument; nothing else changes.
#define MK_ARGCHECK(cond, ...)    \
  do {                            \
    if (!(cond)) {                \
      MK_WARN(__VA_ARGS__);       \
      return ncclInvalidArgument; \
    }                             \
  } while (0)

// Allocation with zeroing; returns ncclSystemError on failure.
#define MK_CALLOC(ptr, n)                                                    \
  do {                                                                       \
    (ptr) = static_cast<decltype(ptr)>(calloc((n), sizeof(*(ptr))));         \
    if ((ptr) == nullptr) {                                                  \
      MK_WARN("Failed to allocate %zu bytes", (size_t)(n) * sizeof(*(ptr))); \
      return ncclSystemError;                                                \
    }                                                                        \
  } while (0)
