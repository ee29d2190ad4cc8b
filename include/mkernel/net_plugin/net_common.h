// Types shared by every version of the NCCL net-plugin ABI (v8..v11).
// Written from the public ABI description; the layouts must match NCCL's byte for
// byte because plugins built against NCCL's headers are loaded through them (and our
// own plugin is loaded by a real libnccl). tests/unit/test_net_abi.cc pins sizes and
// offsets.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <nccl.h>  // ncclResult_t

#ifndef NCCL_NET_HANDLE_MAXSIZE
#define NCCL_NET_HANDLE_MAXSIZE 128  // bytes of the opaque listen handle exchanged out of band
#endif
#ifndef NCCL_PTR_HOST
#define NCCL_PTR_HOST 0x1    // buffer type: host memory
#define NCCL_PTR_CUDA 0x2    // buffer type: device memory (GPUDirect)
#define NCCL_PTR_DMABUF 0x4  // ptrSupport bit: regMrDmaBuf works
#endif
#ifndef NCCL_NET_MAX_REQUESTS
#define NCCL_NET_MAX_REQUESTS 32  // outstanding requests NCCL keeps per comm
#endif
#ifndef NCCL_NET_MAX_DEVS_PER_NIC
#define NCCL_NET_MAX_DEVS_PER_NIC 4  // physical devices merged into one virtual NIC
#endif
#ifndef NCCL_MAX_NET_SIZE_BYTES
#define NCCL_MAX_NET_SIZE_BYTES (1 * 1024 * 1024 * 1024 * 1024L)
#endif
#ifndef NCCL_NET_OPTIONAL_RECV_COMPLETION
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1
#endif
#ifndef NCCL_NET_TRAFFIC_CLASS_UNDEF
#define NCCL_NET_TRAFFIC_CLASS_UNDEF -1
#endif
#define NCCL_NET_DEVICE_INVALID_VERSION 0x0

#ifdef __cplusplus
extern "C" {
#endif

// Log levels and subsystem flags passed to the logger the core hands to init().
typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

typedef enum {
  NCCL_INIT = 1,
  NCCL_COLL = 2,
  NCCL_P2P = 4,
  NCCL_SHM = 8,
  NCCL_NET = 16,
  NCCL_GRAPH = 32,
  NCCL_TUNING = 64,
  NCCL_ENV = 128,
  NCCL_ALLOC = 256,
  NCCL_CALL = 512,
  NCCL_PROXY = 1024,
  NCCL_NVLS = 2048,
  NCCL_BOOTSTRAP = 4096,
  NCCL_REG = 8192,
  NCCL_ALL = ~0
} ncclDebugLogSubSys;

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file,
                                  int line, const char* fmt, ...);

// Profiler hook given to init() from v10 on; plugins may call it around network events.
typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* phandle,
                                               int64_t pluginId, void* extData);

// Device-offload description returned by connect/accept when the core asks for it
// (we never offer offload: the pointer is left untouched / set to NULL).
typedef enum { NCCL_NET_DEVICE_HOST = 0, NCCL_NET_DEVICE_UNPACK = 1 } ncclNetDeviceType;

typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_v7_t;
typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v8_t;
typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v9_t;
typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v10_t;
typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v11_t;

#ifdef __cplusplus
}
#endif
