// NCCL net-plugin ABI, version 8 (exported as `ncclNetPlugin_v8`): int sizes in
// isend/irecv, no virtual NICs, no per-comm config.
#pragma once
#include "mkernel/net_plugin/net_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  char* name;       // interface / HCA name, for logs
  char* pciPath;    // sysfs path of the PCI function (topology detection)
  uint64_t guid;    // identifies the NIC chip across PCI functions
  int ptrSupport;   // NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF
  int regIsGlobal;  // registrations are usable on any comm of the device
  int speed;        // Mb/s
  int port;         // port number
  float latency;    // us
  int maxComms;     // comms the device can hold
  int maxRecvs;     // buffers one irecv may group (multi-receive)
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v8_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  // handle: NCCL_NET_HANDLE_MAXSIZE bytes filled here and passed to the peer's connect.
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  // connect/accept must not block: they may return a NULL comm and are called again.
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v8_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  // isend/irecv may return a NULL request: "try again later".
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ncclNet_v8_t;

#ifdef __cplusplus
}
#endif
