#include "transport/ibvwrap.h"

#include <string>
#include <dlfcn.h>

#include <mutex>

#include "base/checks.h"

namespace mk {

IbvFuncs ibv;

namespace {

std::once_flag gOnce;
ncclResult_t gResult = ncclSystemError;
std::string gWhy;

// Versioned lookup first (the unversioned name may resolve to an old compat entry).
void* sym(void* dl, const char* name, const char* version) {
  void* p = dlvsym(dl, name, version);
  return p ? p : dlsym(dl, name);
}

template <typename T>
bool load(void* dl, T** slot, const char* name, const char* version, bool required) {
  *slot = reinterpret_cast<T*>(sym(dl, name, version));
  if (!*slot && required) gWhy = std::string("symbol ") + name + " missing (libibverbs too old)";
  return *slot || !required;
}

void loadAll() {
  void* dl = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!dl) dl = dlopen("libibverbs.so", RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char* e = dlerror();
    gWhy = std::string("cannot load libibverbs.so.1 (") + (e ? e : "?") +
           "); install rdma-core / libibverbs1";
    return;
  }
  bool ok = true;
#define MK_IBV_REQ(member, name) ok = ok && load(dl, &ibv.member, name, "IBVERBS_1.1", true)
  MK_IBV_REQ(getDeviceList, "ibv_get_device_list");
  MK_IBV_REQ(freeDeviceList, "ibv_free_device_list");
  MK_IBV_REQ(getDeviceName, "ibv_get_device_name");
  MK_IBV_REQ(openDevice, "ibv_open_device");
  MK_IBV_REQ(closeDevice, "ibv_close_device");
  MK_IBV_REQ(queryDevice, "ibv_query_device");
  MK_IBV_REQ(queryPort, "ibv_query_port");
  MK_IBV_REQ(queryGid, "ibv_query_gid");
  MK_IBV_REQ(allocPd, "ibv_alloc_pd");
  MK_IBV_REQ(deallocPd, "ibv_dealloc_pd");
  MK_IBV_REQ(regMr, "ibv_reg_mr");
  MK_IBV_REQ(deregMr, "ibv_dereg_mr");
  MK_IBV_REQ(createCq, "ibv_create_cq");
  MK_IBV_REQ(destroyCq, "ibv_destroy_cq");
  MK_IBV_REQ(createQp, "ibv_create_qp");
  MK_IBV_REQ(modifyQp, "ibv_modify_qp");
  MK_IBV_REQ(destroyQp, "ibv_destroy_qp");
  MK_IBV_REQ(wcStatusStr, "ibv_wc_status_str");
  MK_IBV_REQ(forkInit, "ibv_fork_init");
#undef MK_IBV_REQ
  load(dl, &ibv.regMrIova2, "ibv_reg_mr_iova2", "IBVERBS_1.8", false);
  load(dl, &ibv.regDmabufMr, "ibv_reg_dmabuf_mr", "IBVERBS_1.12", false);
  if (!ok) {
    dlclose(dl);
    ibv = IbvFuncs();
    return;
  }
  gResult = ncclSuccess;  // the handle stays open for the life of the process
}

}  // namespace

ncclResult_t ibvInit(std::string* why) {
  std::call_once(gOnce, loadAll);
  if (gResult != ncclSuccess) {
    MK_INFO(kNet, "verbs not available: %s", gWhy.c_str());
    if (why) *why = gWhy;
  }
  return gResult;
}

bool ibvHasDmaBufSymbol() {
  return ibv.regDmabufMr != nullptr;
}

}  // namespace mk
