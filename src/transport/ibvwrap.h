// libibverbs through dlopen only: mkernel never links it, so it loads on machines without
// rdma-core. The table is filled once by ibvInit(); the fast-path calls (post_send,
// post_recv, poll_cq) are inline in verbs.h and go through the provider's ops table, so
// they need no symbol. Optional, versioned symbols (ibv_reg_dmabuf_mr from IBVERBS_1.12,
// ibv_reg_mr_iova2 from 1.8) are NULL when the installed library is older.
// Member names avoid the ibv_* spellings, several of which verbs.h defines as macros.
#pragma once
#include <cstdint>
#include <infiniband/verbs.h>
#include <nccl.h>

#include <string>

namespace mk {

struct IbvFuncs {
  ibv_device** (*getDeviceList)(int* num);
  void (*freeDeviceList)(ibv_device** list);
  const char* (*getDeviceName)(ibv_device* dev);
  ibv_context* (*openDevice)(ibv_device* dev);
  int (*closeDevice)(ibv_context* ctx);
  int (*queryDevice)(ibv_context* ctx, ibv_device_attr* attr);
  int (*queryPort)(ibv_context* ctx, uint8_t port, ibv_port_attr* attr);
  int (*queryGid)(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid);
  ibv_pd* (*allocPd)(ibv_context* ctx);
  int (*deallocPd)(ibv_pd* pd);
  ibv_mr* (*regMr)(ibv_pd* pd, void* addr, size_t len, int access);
  ibv_mr* (*regMrIova2)(ibv_pd* pd, void* addr, size_t len, uint64_t iova,
                        unsigned int access);  // optional
  ibv_mr* (*regDmabufMr)(ibv_pd* pd, uint64_t offset, size_t len, uint64_t iova, int fd,
                         int access);  // optional
  int (*deregMr)(ibv_mr* mr);
  ibv_cq* (*createCq)(ibv_context* ctx, int cqe, void* cqCtx, ibv_comp_channel* ch, int vec);
  int (*destroyCq)(ibv_cq* cq);
  ibv_qp* (*createQp)(ibv_pd* pd, ibv_qp_init_attr* attr);
  int (*modifyQp)(ibv_qp* qp, ibv_qp_attr* attr, int mask);
  int (*destroyQp)(ibv_qp* qp);
  const char* (*wcStatusStr)(ibv_wc_status status);
  int (*forkInit)(void);
};

extern IbvFuncs ibv;

// Loads libibverbs.so.1 once (thread-safe). ncclSystemError, with the reason in *why,
// when the library is missing or lacks a required symbol (too old). Logs at INFO only:
// the caller decides whether a missing verbs stack deserves a warning.
ncclResult_t ibvInit(std::string* why = nullptr);
// ibv_reg_dmabuf_mr exists in the loaded library (the kernel/provider may still refuse it).
bool ibvHasDmaBufSymbol();

}  // namespace mk
