// libnccl-net-mkernel.so: mkernel's own verbs and socket backends as a standard NCCL net
// plugin (ncclNetPlugin_v8 .. _v11), so a stock libnccl (NCCL_NET_PLUGIN=mkernel) or our
// own loader can drive them. Backend choice at init: MKERNEL_NET=socket|verbs, else verbs
// when it has a device, else socket. Never loads another plugin (that could be us again).
//
// The plugin carries its own static copy of mkernel's transport code; only the four
// ncclNetPlugin_vN tables are exported (see plugin/CMakeLists.txt).
#include <cstdint>
#include <strings.h>

#include <climits>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/checks.h"
#include "base/param.h"
#include "mkernel/net_plugin/net_plugin.h"
#include "transport/net.h"

#define MK_PLUGIN_EXPORT __attribute__((visibility("default")))

namespace {

std::mutex gMu;
std::unique_ptr<mk::Net> gNet;
int gRefs = 0;
// Property strings must outlive getProperties(): one copy per device, kept until unload.
std::vector<std::string> gNames, gPaths;
int gCtx;  // v11 context: the plugin keeps no per-communicator state
// The core's logger. Our code logs through its own NCCL_DEBUG handling; failures are
// also handed to the core's logger so that its last-error text (ncclGetLastError) names
// the cause.
ncclDebugLogger_t gLogger = nullptr;

ncclResult_t report(ncclResult_t res, const char* fn) {
  if (res != ncclSuccess && res != ncclInProgress && gLogger)
    gLogger(NCCL_LOG_WARN, NCCL_NET, "mkernel_net_plugin.cc", 0, "NET/mkernel %s: %s", fn,
            mk::lastError());
  return res;
}
#define MK_REPORT(call) report((call), __func__)

struct Req {
  void* inner;
  int n;
};

ncclResult_t initOnce() {
  std::lock_guard<std::mutex> lk(gMu);
  if (gNet) {
    gRefs++;
    return ncclSuccess;
  }
  const char* which = MK_PARAM_STR(Net);
  ncclResult_t res;
  if (strcasecmp(which, "socket") == 0) {
    res = mk::netCreateSocket(&gNet);
  } else if (strcasecmp(which, "verbs") == 0) {
    res = mk::netCreateVerbs(&gNet);
  } else {
    int ndev = 0;
    res = ncclSystemError;
    if (MK_PARAM_INT(IbDisable) == 0 && mk::netCreateVerbs(&gNet) == ncclSuccess &&
        gNet->devices(&ndev) == ncclSuccess && ndev > 0)
      res = ncclSuccess;
    if (res != ncclSuccess) res = mk::netCreateSocket(&gNet);
  }
  if (res != ncclSuccess) {
    gNet.reset();
    return res;
  }
  int ndev = 0;
  NCCLCHECK(gNet->devices(&ndev));
  gNames.assign(ndev, "");
  gPaths.assign(ndev, "");
  gRefs = 1;
  MK_INFO(mk::kNet, "libnccl-net-mkernel: %s backend, %d device(s)", gNet->name(), ndev);
  return ncclSuccess;
}

ncclResult_t finalizeOnce() {
  std::lock_guard<std::mutex> lk(gMu);
  if (gRefs > 0 && --gRefs == 0) gNet.reset();
  return ncclSuccess;
}

// Fills the fields common to every version from the internal properties.
template <typename P>
ncclResult_t baseProps(int dev, P* out, mk::NetProperties* p) {
  if (!gNet) return ncclInvalidUsage;
  NCCLCHECK(gNet->getProperties(dev, p));
  std::lock_guard<std::mutex> lk(gMu);
  if (dev < 0 || dev >= (int)gNames.size()) return ncclInvalidArgument;
  gNames[dev] = p->name;
  gPaths[dev] = p->pciPath;
  memset(out, 0, sizeof(*out));
  out->name = const_cast<char*>(gNames[dev].c_str());
  out->pciPath = gPaths[dev].empty() ? nullptr : const_cast<char*>(gPaths[dev].c_str());
  out->guid = p->guid;
  out->ptrSupport = p->ptrSupport;
  out->regIsGlobal = p->regIsGlobal;
  out->speed = p->speedMbps;
  out->port = p->port;
  out->latency = p->latencyUs;
  out->maxComms = p->maxComms;
  out->maxRecvs = p->maxRecvs;
  out->netDeviceType = NCCL_NET_DEVICE_HOST;
  out->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION;
  return ncclSuccess;
}
template <typename P>
ncclResult_t fullProps(int dev, P* out) {
  mk::NetProperties p;
  NCCLCHECK(baseProps(dev, out, &p));
  out->forceFlush = p.forceFlush;
  out->vProps.ndevs = 1;
  out->vProps.devs[0] = dev;
  out->maxP2pBytes = p.maxP2pBytes;
  out->maxCollBytes = p.maxCollBytes;
  return ncclSuccess;
}

ncclResult_t pDevices(int* ndev) {
  return gNet ? gNet->devices(ndev) : ncclInvalidUsage;
}
ncclResult_t pProps8(int dev, ncclNetProperties_v8_t* out) {
  mk::NetProperties p;
  return baseProps(dev, out, &p);
}
ncclResult_t pProps9(int dev, ncclNetProperties_v9_t* out) {
  return fullProps(dev, out);
}
ncclResult_t pProps10(int dev, ncclNetProperties_v10_t* out) {
  return fullProps(dev, out);
}
ncclResult_t pProps11(int dev, ncclNetProperties_v11_t* out) {
  NCCLCHECK(fullProps(dev, out));
  out->maxMultiRequestSize = 1;
  return ncclSuccess;
}

ncclResult_t pListen(int dev, void* handle, void** listenComm) {
  return MK_REPORT(gNet->listen(dev, handle, listenComm));
}
ncclResult_t pConnect(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v8_t**) {
  return MK_REPORT(gNet->connect(dev, handle, sendComm));
}
ncclResult_t pAccept(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t**) {
  return MK_REPORT(gNet->accept(listenComm, recvComm));
}
ncclResult_t pRegMr(void* comm, void* data, size_t size, int type, void** mh) {
  return MK_REPORT(gNet->regMr(comm, data, size, type, mh));
}
ncclResult_t pRegMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                          void** mh) {
  return MK_REPORT(gNet->regMrDmaBuf(comm, data, size, type, offset, fd, mh));
}
ncclResult_t pDeregMr(void* comm, void* mh) {
  return gNet->deregMr(comm, mh);
}

ncclResult_t wrap(void* inner, int n, void** request) {
  *request = inner ? new Req{inner, n} : nullptr;
  return ncclSuccess;
}
ncclResult_t pIsend(void* comm, void* data, size_t size, int tag, void* mh, void** request) {
  void* inner = nullptr;
  NCCLCHECK(MK_REPORT(gNet->isend(comm, data, size, tag, mh, &inner)));
  return wrap(inner, 1, request);
}
ncclResult_t pIsend8(void* comm, void* data, int size, int tag, void* mh, void** request) {
  if (size < 0) return ncclInvalidArgument;
  return pIsend(comm, data, (size_t)size, tag, mh, request);
}
ncclResult_t pIsend10(void* comm, void* data, size_t size, int tag, void* mh, void*,
                      void** request) {
  return pIsend(comm, data, size, tag, mh, request);
}
ncclResult_t pIrecv(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs,
                    void** request) {
  void* inner = nullptr;
  NCCLCHECK(MK_REPORT(gNet->irecv(comm, n, data, sizes, tags, mhs, &inner)));
  return wrap(inner, n, request);
}
ncclResult_t pIrecv8(void* comm, int n, void** data, int* sizes, int* tags, void** mhs,
                     void** request) {
  if (n < 1 || n > mk::kNetMaxRecvs) return ncclInvalidArgument;
  size_t s[mk::kNetMaxRecvs];
  for (int i = 0; i < n; i++) s[i] = sizes[i] < 0 ? 0 : (size_t)sizes[i];
  return pIrecv(comm, n, data, s, tags, mhs, request);
}
ncclResult_t pIrecv10(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs, void**,
                      void** request) {
  return pIrecv(comm, n, data, sizes, tags, mhs, request);
}
ncclResult_t pIflush(void* comm, int n, void** data, int* sizes, void** mhs, void** request) {
  void* inner = nullptr;
  NCCLCHECK(MK_REPORT(gNet->iflush(comm, n, data, sizes, mhs, &inner)));
  return wrap(inner, 1, request);
}
ncclResult_t pTest(void* request, int* done, int* sizes) {
  Req* r = static_cast<Req*>(request);
  size_t s[mk::kNetMaxRecvs] = {};
  NCCLCHECK(MK_REPORT(gNet->test(r->inner, done, s)));
  if (*done) {
    if (sizes)
      for (int i = 0; i < r->n; i++) sizes[i] = s[i] > (size_t)INT_MAX ? INT_MAX : (int)s[i];
    delete r;
  }
  return ncclSuccess;
}
ncclResult_t pCloseSend(void* c) {
  return gNet->closeSend(c);
}
ncclResult_t pCloseRecv(void* c) {
  return gNet->closeRecv(c);
}
ncclResult_t pCloseListen(void* c) {
  return gNet->closeListen(c);
}
ncclResult_t pGetDeviceMr(void*, void*, void**) {
  return ncclInvalidUsage;
}  // no offload
ncclResult_t pIrecvConsumed(void*, int, void*) {
  return ncclSuccess;
}
template <typename V>
ncclResult_t pMakeVDevice(int* d, V* props) {
  // No NIC fusion: a "virtual" device of one physical device is that device.
  if (!props || props->ndevs != 1) return ncclInvalidUsage;
  *d = props->devs[0];
  return ncclSuccess;
}

ncclResult_t pInit8(ncclDebugLogger_t log) {
  gLogger = log;
  return MK_REPORT(initOnce());
}
ncclResult_t pInit10(ncclDebugLogger_t log, ncclProfilerCallback_t) {
  return pInit8(log);
}
ncclResult_t pInit11(void** ctx, uint64_t, ncclNetCommConfig_v11_t*, ncclDebugLogger_t log,
                     ncclProfilerCallback_t) {
  NCCLCHECK(pInit8(log));
  *ctx = &gCtx;
  return ncclSuccess;
}
ncclResult_t pFinalize11(void*) {
  return finalizeOnce();
}
ncclResult_t pListen11(void*, int dev, void* handle, void** listenComm) {
  return pListen(dev, handle, listenComm);
}
ncclResult_t pConnect10(int dev, ncclNetCommConfig_v10_t*, void* handle, void** sendComm,
                        ncclNetDeviceHandle_v10_t** devComm) {
  return pConnect(dev, handle, sendComm, devComm);
}
ncclResult_t pConnect11(void*, int dev, void* handle, void** sendComm,
                        ncclNetDeviceHandle_v11_t** devComm) {
  return pConnect(dev, handle, sendComm, devComm);
}
ncclResult_t pSetNetAttr11(void*, ncclNetAttr_v11_t*) {
  return ncclSuccess;
}

}  // namespace

extern "C" {

MK_PLUGIN_EXPORT ncclNet_v8_t ncclNetPlugin_v8 = {
    "mkernel",  pInit8,       pDevices,     pProps8,      pListen,       pConnect, pAccept,
    pRegMr,     pRegMrDmaBuf, pDeregMr,     pIsend8,      pIrecv8,       pIflush,  pTest,
    pCloseSend, pCloseRecv,   pCloseListen, pGetDeviceMr, pIrecvConsumed};

MK_PLUGIN_EXPORT ncclNet_v9_t ncclNetPlugin_v9 = {
    "mkernel",  pInit8,       pDevices,     pProps9,        pListen,
    pConnect,   pAccept,      pRegMr,       pRegMrDmaBuf,   pDeregMr,
    pIsend,     pIrecv,       pIflush,      pTest,          pCloseSend,
    pCloseRecv, pCloseListen, pGetDeviceMr, pIrecvConsumed, pMakeVDevice<ncclNetVDeviceProps_v9_t>};

MK_PLUGIN_EXPORT ncclNet_v10_t ncclNetPlugin_v10 = {
    "mkernel",    pInit10,      pDevices,       pProps10,
    pListen,      pConnect10,   pAccept,        pRegMr,
    pRegMrDmaBuf, pDeregMr,     pIsend10,       pIrecv10,
    pIflush,      pTest,        pCloseSend,     pCloseRecv,
    pCloseListen, pGetDeviceMr, pIrecvConsumed, pMakeVDevice<ncclNetVDeviceProps_v10_t>};

MK_PLUGIN_EXPORT ncclNet_v11_t ncclNetPlugin_v11 = {
    "mkernel",    pInit11,      pDevices,       pProps11,
    pListen11,    pConnect11,   pAccept,        pRegMr,
    pRegMrDmaBuf, pDeregMr,     pIsend10,       pIrecv10,
    pIflush,      pTest,        pCloseSend,     pCloseRecv,
    pCloseListen, pGetDeviceMr, pIrecvConsumed, pMakeVDevice<ncclNetVDeviceProps_v11_t>,
    pFinalize11,  pSetNetAttr11};

}  // extern "C"
