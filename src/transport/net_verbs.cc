// Verbs net backend: devices, connection setup and memory registration (the data path
// is in net_verbs_data.cc; the scheme is described in net_verbs.h).
#include "transport/net_verbs.h"

#include <cstdint>
#include <string>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <fstream>

#include "base/checks.h"
#include "base/cudawrap.h"
#include "base/param.h"

namespace mk {

using namespace verbs;

namespace verbs {

std::string gidStr(const ibv_gid& g) {
  char b[64];
  snprintf(b, sizeof(b), "%016llx:%016llx", (unsigned long long)g.global.subnet_prefix,
           (unsigned long long)g.global.interface_id);
  return b;
}

bool hcaMatches(const char* spec, const std::string& name, int port) {
  if (!spec || !*spec) return true;
  bool exclude = false, exact = false;
  if (*spec == '^') exclude = true, spec++;
  if (*spec == '=') exact = true, spec++;
  bool hit = false;
  std::string list(spec);
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(pos, end - pos);
    int p = -1;
    size_t colon = item.find(':');
    if (colon != std::string::npos) p = atoi(item.c_str() + colon + 1), item.resize(colon);
    bool nm = exact ? item == name : (!item.empty() && name.compare(0, item.size(), item) == 0);
    if (nm && (p < 0 || p == port)) hit = true;
    pos = end + 1;
  }
  return exclude ? !hit : hit;
}

// RoCE: the GID of a RoCE v2 type with an IPv4-mapped address, else the first RoCE v2,
// else 0 (as NCCL's automatic choice does). NCCL_IB_GID_INDEX overrides.
int pickGid(Dev& d) {
  int64_t forced = MK_PARAM_INT(IbGidIndex);
  if (forced >= 0) return (int)forced;
  if (d.portAttr.link_layer != IBV_LINK_LAYER_ETHERNET) return 0;
  int firstV2 = -1;
  for (int i = 0; i < d.portAttr.gid_tbl_len && i < 256; i++) {
    std::ifstream f("/sys/class/infiniband/" + d.name + "/ports/" + std::to_string(d.port) +
                    "/gid_attrs/types/" + std::to_string(i));
    std::string type;
    if (!std::getline(f, type) || type.find("v2") == std::string::npos) continue;
    ibv_gid g;
    if (ibv.queryGid(d.ctx, d.port, i, &g) != 0) continue;
    const uint8_t* r = g.raw;
    bool v4 = true;
    for (int k = 0; k < 10; k++) v4 &= r[k] == 0;
    v4 &= r[10] == 0xff && r[11] == 0xff;
    if (v4) return i;
    if (firstV2 < 0) firstV2 = i;
  }
  return firstV2 >= 0 ? firstV2 : 0;
}

int speedOf(const ibv_port_attr& a) {
  int lane;  // Mb/s per lane
  switch (a.active_speed) {
    case 1:
      lane = 2500;
      break;
    case 2:
      lane = 5000;
      break;
    case 4:
    case 8:
      lane = 10000;
      break;
    case 16:
      lane = 14000;
      break;
    case 32:
      lane = 25000;
      break;
    case 64:
      lane = 50000;
      break;
    case 128:
      lane = 100000;
      break;
    default:
      lane = 200000;
  }
  int w = a.active_width == 1 ? 1 : a.active_width == 2 ? 4 : a.active_width == 4 ? 8 : 12;
  return lane * w;
}

}  // namespace verbs

ncclResult_t VerbsNet::devices(int* ndev) {
  *ndev = (int)devs.size();
  return ncclSuccess;
}

ncclResult_t VerbsNet::getProperties(int dev, NetProperties* p) {
  MK_ARGCHECK(dev >= 0 && dev < (int)devs.size(), "verbs net: bad device %d", dev);
  const Dev& d = devs[dev];
  *p = NetProperties();
  p->name = d.name + ":" + std::to_string(d.port);
  p->pciPath = d.pciPath;
  p->guid = 0;
  ibv_device_attr attr;
  if (ibv.queryDevice(d.ctx, &attr) == 0) p->guid = attr.sys_image_guid;
  p->ptrSupport = NCCL_PTR_HOST | ((d.peermem || d.dmabuf) ? NCCL_PTR_CUDA : 0) |
                  (d.dmabuf ? NCCL_PTR_DMABUF : 0);
  p->regIsGlobal = true;  // one PD per device: an MR works on every comm of it
  p->speedMbps = d.speedMbps;
  p->port = d.port;
  p->latencyUs = 0;
  p->maxComms = 65536;
  p->maxRecvs = kNetMaxRecvs;
  p->maxP2pBytes = p->maxCollBytes = kMaxMsg;
  return ncclSuccess;
}

ncclResult_t VerbsNet::listen(int dev, void* handle, void** listenComm) {
  MK_ARGCHECK(dev >= 0 && dev < (int)devs.size(), "verbs net: bad device %d", dev);
  Listen* l = new Listen();
  l->dev = &devs[dev];
  socketInit(&l->sock, abortFlag_, netTimeoutMs());
  SocketAddress a = ifs[0].addr;
  socketAddressSetPort(&a, 0);
  ncclResult_t res = socketListen(&l->sock, &a);
  if (res != ncclSuccess) {
    delete l;
    return res;
  }
  Handle h;
  memset(&h, 0, sizeof(h));
  h.magic = kHandleMagic;
  socketAddressToWire(&l->sock.addr, &h.addr);
  memset(handle, 0, kNetHandleSize);
  memcpy(handle, &h, sizeof(h));
  *listenComm = l;
  return ncclSuccess;
}

ncclResult_t VerbsNet::connect(int dev, void* handle, void** sendComm) {
  *sendComm = nullptr;
  Handle* h = static_cast<Handle*>(handle);
  MK_ARGCHECK(h->magic == kHandleMagic, "verbs net: connect handle is not a verbs handle");
  MK_ARGCHECK(dev >= 0 && dev < (int)devs.size(), "verbs net: bad device %d", dev);
  Comm* c = reinterpret_cast<Comm*>(h->stageComm);
  if (h->stage == 0) {
    SocketAddress addr;
    NCCLCHECK(socketAddressFromWire(&h->addr, &addr));
    c = new Comm();
    c->isSend = true;
    c->dev = &devs[dev];
    char str[kSocketAddrStrLen];
    c->peer = socketAddressToString(&addr, str, sizeof(str));
    socketInit(&c->sock, abortFlag_, netTimeoutMs());
    ncclResult_t res = socketConnect(&c->sock, &addr, true);
    if (res == ncclSuccess) res = createQps(c);
    if (res == ncclSuccess) res = allocSendSide(c);
    if (res == ncclSuccess) res = socketSend(&c->sock, &c->local, sizeof(c->local));
    if (res != ncclSuccess) {
      destroy(c);
      return res;
    }
    h->stageComm = reinterpret_cast<uint64_t>(c);
    h->stage = 1;
  }
  if (h->stage == 1) {
    NCCLCHECK(
        socketProgress(&c->sock, SocketOp::kRecv, &c->remote, sizeof(c->remote), &c->remoteGot));
    if (c->remoteGot < sizeof(c->remote)) return ncclSuccess;
    NCCLCHECK(connectQps(c));
    uint8_t ready = 1;
    NCCLCHECK(socketSend(&c->sock, &ready, 1));
    h->stage = 2;
    h->stageComm = 0;
    *sendComm = c;
  }
  return ncclSuccess;
}

ncclResult_t VerbsNet::accept(void* listenComm, void** recvComm) {
  *recvComm = nullptr;
  Listen* l = static_cast<Listen*>(listenComm);
  if (l->stage == 0) {
    Socket s;
    bool accepted = false;
    NCCLCHECK(socketTryAccept(&l->sock, &s, &accepted));
    if (!accepted) return ncclSuccess;
    Comm* c = new Comm();
    c->dev = l->dev;
    c->sock = s;
    c->sock.timeoutMs = netTimeoutMs();
    char str[kSocketAddrStrLen];
    c->peer = socketAddressToString(&s.addr, str, sizeof(str));
    l->pending = c;
    l->stage = 1;
  }
  Comm* c = l->pending;
  if (l->stage == 1) {
    NCCLCHECK(
        socketProgress(&c->sock, SocketOp::kRecv, &c->remote, sizeof(c->remote), &c->remoteGot));
    if (c->remoteGot < sizeof(c->remote)) return ncclSuccess;
    NCCLCHECK(createQps(c));
    NCCLCHECK(allocRecvSide(c));
    NCCLCHECK(connectQps(c));
    // Receives into GPU memory will need flushes: set the flush QP up now, not on the
    // first signal.
    if (c->dev->peermem || c->dev->dmabuf) NCCLCHECK(createFlushQp(c));
    NCCLCHECK(socketSend(&c->sock, &c->local, sizeof(c->local)));
    l->stage = 2;
    c->remoteGot = 0;
  }
  if (l->stage == 2) {
    uint8_t ready = 0;
    NCCLCHECK(socketProgress(&c->sock, SocketOp::kRecv, &ready, 1, &c->remoteGot));
    if (c->remoteGot < 1) return ncclSuccess;
    l->stage = 0;
    l->pending = nullptr;
    *recvComm = c;
  }
  return ncclSuccess;
}

ncclResult_t VerbsNet::regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  Comm* c = static_cast<Comm*>(comm);
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_mr* mr = nullptr;
  if (type == NCCL_PTR_CUDA && c->dev->dmabuf && cudaLibInit() == ncclSuccess &&
      cu.cuMemGetHandleForAddressRange) {
    // GPUDirect through dma-buf: the range must be page aligned.
    uintptr_t pg = 4096, base = (uintptr_t)data & ~(pg - 1);
    size_t len = (((uintptr_t)data + size + pg - 1) & ~(pg - 1)) - base;
    int fd = -1;
    if (cu.cuMemGetHandleForAddressRange(&fd, (CUdeviceptr)base, len,
                                         CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) == CUDA_SUCCESS) {
      mr = ibv.regDmabufMr(c->dev->pd, (uintptr_t)data - base, size, (uintptr_t)data, fd, access);
      close(fd);
    }
    if (!mr) MK_INFO(kNet, "verbs net: dma-buf registration failed; trying ibv_reg_mr");
  }
  if (!mr) mr = ibv.regMr(c->dev->pd, data, size, access);
  if (!mr) {
    MK_WARN("verbs net: ibv_reg_mr(%p, %zu, %s) failed: %s%s", data, size,
            type == NCCL_PTR_CUDA ? "GPU" : "host", strerror(errno),
            type == NCCL_PTR_CUDA ? " (no dma-buf support and no nvidia-peermem?)" : "");
    return ncclSystemError;
  }
  *mhandle = new Mr{mr, type == NCCL_PTR_CUDA};
  return ncclSuccess;
}

ncclResult_t VerbsNet::regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset,
                                   int fd, void** mhandle) {
  Comm* c = static_cast<Comm*>(comm);
  if (!ibv.regDmabufMr) {
    MK_WARN("verbs net: ibv_reg_dmabuf_mr not available (libibverbs older than 1.12)");
    return ncclSystemError;
  }
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_mr* mr = ibv.regDmabufMr(c->dev->pd, offset, size, (uintptr_t)data, fd, access);
  if (!mr) {
    MK_WARN("verbs net: ibv_reg_dmabuf_mr failed: %s", strerror(errno));
    return ncclSystemError;
  }
  *mhandle = new Mr{mr, type == NCCL_PTR_CUDA};
  return ncclSuccess;
}

ncclResult_t VerbsNet::deregMr(void*, void* mhandle) {
  Mr* m = static_cast<Mr*>(mhandle);
  if (m) ibv.deregMr(m->mr);
  delete m;
  return ncclSuccess;
}

// Called after test() reported the receive done (NCCL's order). One READ behind the
// writes of every receive completed so far (see net_verbs.h); the caller polls the
// request with test(), so the wait is the caller's to bound and abort.
ncclResult_t VerbsNet::iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                              void** request) {
  Comm* c = static_cast<Comm*>(recvComm);
  *request = nullptr;
  MK_ARGCHECK(c != nullptr && !c->isSend, "verbs net: iflush needs a receive comm");
  MK_ARGCHECK(n >= 1 && n <= kNetMaxRecvs, "verbs net: iflush of %d buffers", n);
  MK_ARGCHECK(data != nullptr && sizes != nullptr, "verbs net: iflush without buffers");
  NCCLCHECK(poll(c));
  int last = -1;
  for (int i = n - 1; i >= 0 && last < 0; i--) {
    Mr* m = mhandles ? static_cast<Mr*>(mhandles[i]) : nullptr;
    if (sizes[i] > 0 && m && m->gpu) last = i;
  }
  if (last < 0) return ncclSuccess;  // host memory: visible once the completion is polled
  if (c->flushes >= kSlots) {
    MK_WARN("verbs net: more than %d flushes in flight on one comm (test() them first)", kSlots);
    return ncclInvalidUsage;
  }
  NCCLCHECK(createFlushQp(c));
  Mr* m = static_cast<Mr*>(mhandles[last]);
  Request* r = new Request{c, false, -1, 0, 1, 0, true};
  ibv_sge sge = {(uintptr_t)c->flushBuf, 1, c->flushMr->lkey};
  ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof(wr));
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = (uintptr_t)data[last];
  wr.wr.rdma.rkey = m->mr->rkey;
  wr.wr_id = reinterpret_cast<uint64_t>(r);
  if (ibv_post_send(c->flushQp, &wr, &bad)) {
    delete r;
    return fail(c, std::string("verbs net: posting the flush READ failed: ") + strerror(errno));
  }
  c->live.insert(r);
  c->flushes++;
  *request = r;
  return ncclSuccess;
}

ncclResult_t VerbsNet::closeSend(void* c) {
  return destroy(static_cast<Comm*>(c));
}

ncclResult_t VerbsNet::closeRecv(void* c) {
  return destroy(static_cast<Comm*>(c));
}
ncclResult_t VerbsNet::closeListen(void* listenComm) {
  Listen* l = static_cast<Listen*>(listenComm);
  if (!l) return ncclSuccess;
  if (l->pending) destroy(l->pending);
  socketClose(&l->sock);
  delete l;
  return ncclSuccess;
}

VerbsNet::~VerbsNet() {
  // Ports of one device share its context and protection domain: release each once.
  for (size_t i = 0; i < devs.size(); i++) {
    bool first = true;
    for (size_t j = 0; j < i; j++) first &= devs[j].ctx != devs[i].ctx;
    if (!first) continue;
    if (devs[i].pd) ibv.deallocPd(devs[i].pd);
    if (devs[i].ctx) ibv.closeDevice(devs[i].ctx);
  }
}

}  // namespace mk
