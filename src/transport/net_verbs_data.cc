// Verbs net backend: device discovery, QPs and the data path (scheme in net_verbs.h).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "base/checks.h"
#include "base/param.h"
#include "transport/net_verbs.h"

namespace mk {

using namespace verbs;

namespace {

template <typename T>
T* allocRegistered(ibv_pd* pd, size_t count, ibv_mr** mr, int access) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, count * sizeof(T)) != 0) return nullptr;
  memset(p, 0, count * sizeof(T));
  *mr = ibv.regMr(pd, p, count * sizeof(T), access);
  if (!*mr) {
    free(p);
    return nullptr;
  }
  return static_cast<T*>(p);
}

ibv_mtu mtuOf(uint32_t v) {
  return static_cast<ibv_mtu>(v);
}

ncclResult_t qpToInit(Dev* d, ibv_qp* qp, int access) {
  ibv_qp_attr qa;
  memset(&qa, 0, sizeof(qa));
  qa.qp_state = IBV_QPS_INIT;
  qa.pkey_index = 0;
  qa.port_num = (uint8_t)d->port;
  qa.qp_access_flags = access;
  if (ibv.modifyQp(qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    MK_WARN("verbs net: QP to INIT failed: %s", strerror(errno));
    return ncclSystemError;
  }
  return ncclSuccess;
}

// INIT -> RTR -> RTS towards QP `destQpn` at the address in r (the peer's, or our own for
// the flush QP). One outstanding RDMA READ each way is all the data path uses.
ncclResult_t qpToRts(Dev* d, ibv_qp* qp, uint32_t localMtu, const QpInfo& r, uint32_t destQpn,
                     const std::string& peer) {
  ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = mtuOf(std::min(localMtu, r.mtu));
  a.dest_qp_num = destQpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = (uint8_t)d->port;
  if (r.linkLayer == IBV_LINK_LAYER_ETHERNET) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = r.gid;
    a.ah_attr.grh.sgid_index = (uint8_t)d->gidIndex;
    a.ah_attr.grh.hop_limit = 255;
  } else {
    a.ah_attr.dlid = r.lid;
  }
  if (ibv.modifyQp(qp, &a,
                   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    MK_WARN("verbs net: QP to RTR failed (peer %s, gid %s): %s", peer.c_str(),
            gidStr(r.gid).c_str(), strerror(errno));
    return ncclSystemError;
  }
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 18;  // ~1 s per try; 7 tries bound how long a dead peer goes unnoticed
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  if (ibv.modifyQp(qp, &a,
                   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) {
    MK_WARN("verbs net: QP to RTS failed: %s", strerror(errno));
    return ncclSystemError;
  }
  return ncclSuccess;
}

}  // namespace

ncclResult_t VerbsNet::fail(Comm* c, const std::string& msg) {
  if (c->error == ncclSuccess) {
    c->error = ncclRemoteError;
    c->errMsg = msg;
  }
  MK_WARN("%s", c->errMsg.c_str());
  return c->error;
}

ncclResult_t VerbsNet::createQps(Comm* c) {
  Dev* d = c->dev;
  int cqe = kQps * kRecvWrs * 2 + 3 * kSlots;  // + kSlots flush READs
  c->cq = ibv.createCq(d->ctx, cqe, nullptr, nullptr, 0);
  if (!c->cq) {
    MK_WARN("verbs net: ibv_create_cq(%d) failed: %s", cqe, strerror(errno));
    return ncclSystemError;
  }
  for (int q = 0; q < kQps; q++) {
    ibv_qp_init_attr a;
    memset(&a, 0, sizeof(a));
    a.send_cq = a.recv_cq = c->cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = kRecvWrs * 2 + kSlots;
    a.cap.max_recv_wr = kRecvWrs;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    a.cap.max_inline_data = 64;
    c->qps[q] = ibv.createQp(d->pd, &a);
    if (!c->qps[q]) {
      MK_WARN("verbs net: ibv_create_qp failed: %s", strerror(errno));
      return ncclSystemError;
    }
    NCCLCHECK(qpToInit(d, c->qps[q], IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE));
    c->local.qpn[q] = c->qps[q]->qp_num;
  }
  c->local.mtu = d->portAttr.active_mtu;
  c->local.lid = d->portAttr.lid;
  c->local.linkLayer = d->portAttr.link_layer;
  c->local.gid = d->gid;
  return ncclSuccess;
}

ncclResult_t VerbsNet::allocSendSide(Comm* c) {
  int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  c->fifo = allocRegistered<FifoEntry>(c->dev->pd, kSlots, &c->fifoMr, acc);
  if (!c->fifo) {
    MK_WARN("verbs net: cannot register the FIFO: %s", strerror(errno));
    return ncclSystemError;
  }
  c->local.fifoAddr = (uintptr_t)c->fifo;
  c->local.fifoRkey = c->fifoMr->rkey;
  return ncclSuccess;
}

ncclResult_t VerbsNet::allocRecvSide(Comm* c) {
  int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  c->cts = allocRegistered<FifoEntry>(c->dev->pd, kSlots, &c->ctsMr, IBV_ACCESS_LOCAL_WRITE);
  c->sizes = allocRegistered<uint64_t>(c->dev->pd, (size_t)kSlots * kNetMaxRecvs, &c->sizesMr, acc);
  if (!c->cts || !c->sizes) {
    MK_WARN("verbs net: cannot register receive-side tables: %s", strerror(errno));
    return ncclSystemError;
  }
  c->local.sizesAddr = (uintptr_t)c->sizes;
  c->local.sizesRkey = c->sizesMr->rkey;
  // Every incoming WRITE_WITH_IMM consumes a receive WR: keep kRecvWrs posted per QP.
  for (int q = 0; q < kQps; q++) {
    for (int i = 0; i < kRecvWrs; i++) {
      ibv_recv_wr wr, *bad;
      memset(&wr, 0, sizeof(wr));
      wr.wr_id = (uint64_t)q;
      if (ibv_post_recv(c->qps[q], &wr, &bad)) {
        MK_WARN("verbs net: ibv_post_recv failed");
        return ncclSystemError;
      }
    }
  }
  return ncclSuccess;
}

ncclResult_t VerbsNet::connectQps(Comm* c) {
  for (int q = 0; q < kQps; q++)
    NCCLCHECK(qpToRts(c->dev, c->qps[q], c->local.mtu, c->remote, c->remote.qpn[q], c->peer));
  return ncclSuccess;
}

// The flush QP reads from our own GPU buffers: it is connected to itself, so it needs
// remote-read access, and its completions land on the comm's CQ (poll() counts them).
ncclResult_t VerbsNet::createFlushQp(Comm* c) {
  if (c->flushQp) return ncclSuccess;
  Dev* d = c->dev;
  if (!c->flushBuf) {
    c->flushBuf = allocRegistered<uint64_t>(d->pd, 1, &c->flushMr, IBV_ACCESS_LOCAL_WRITE);
    if (!c->flushBuf) {
      MK_WARN("verbs net: cannot register the flush buffer: %s", strerror(errno));
      return ncclSystemError;
    }
  }
  ibv_qp_init_attr a;
  memset(&a, 0, sizeof(a));
  a.send_cq = a.recv_cq = c->cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = kSlots;
  a.cap.max_recv_wr = 1;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv.createQp(d->pd, &a);
  if (!qp) {
    MK_WARN("verbs net: ibv_create_qp (flush QP) failed: %s", strerror(errno));
    return ncclSystemError;
  }
  QpInfo self = c->local;
  ncclResult_t res = qpToInit(d, qp, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE);
  if (res == ncclSuccess) res = qpToRts(d, qp, self.mtu, self, qp->qp_num, "self (flush QP)");
  if (res != ncclSuccess) {
    ibv.destroyQp(qp);
    return res;
  }
  c->flushQp = qp;
  return ncclSuccess;
}

ncclResult_t VerbsNet::destroy(Comm* c) {
  if (!c) return ncclSuccess;
  for (int q = 0; q < kQps; q++)
    if (c->qps[q]) ibv.destroyQp(c->qps[q]);
  if (c->flushQp) ibv.destroyQp(c->flushQp);
  if (c->cq) ibv.destroyCq(c->cq);
  if (c->fifoMr) ibv.deregMr(c->fifoMr);
  if (c->ctsMr) ibv.deregMr(c->ctsMr);
  if (c->sizesMr) ibv.deregMr(c->sizesMr);
  if (c->flushMr) ibv.deregMr(c->flushMr);
  free(c->fifo);
  free(c->cts);
  free(c->sizes);
  free(c->flushBuf);
  for (Request* r : c->live) delete r;
  socketClose(&c->sock);
  delete c;
  return ncclSuccess;
}

// Drains the comm's CQ: send completions count down their request; immediates count
// down the receive request of their slot and get their receive WR back.
ncclResult_t VerbsNet::poll(Comm* c) {
  if (c->error != ncclSuccess) return c->error;
  ibv_wc wcs[16];
  int n = ibv_poll_cq(c->cq, 16, wcs);
  if (n < 0) return fail(c, "verbs net: ibv_poll_cq failed (peer " + c->peer + ")");
  for (int i = 0; i < n; i++) {
    const ibv_wc& wc = wcs[i];
    if (wc.status != IBV_WC_SUCCESS && c->flushQp && wc.qp_num == c->flushQp->qp_num)
      return fail(c, std::string("verbs net: flush READ of a received GPU buffer failed: '") +
                         ibv.wcStatusStr(wc.status) + "' (device " + c->dev->name +
                         "; is the GPU memory readable by the NIC?)");
    if (wc.status != IBV_WC_SUCCESS)
      return fail(c, std::string("verbs net: work completion error '") +
                         ibv.wcStatusStr(wc.status) + "' with peer " + c->peer +
                         " (peer process or link gone?)");
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
      uint32_t slot = wc.imm_data;
      if (slot >= (uint32_t)kSlots || !c->slots[slot])
        return fail(c, "verbs net: unexpected immediate from peer " + c->peer);
      c->slots[slot]->pending--;
      ibv_recv_wr wr, *bad;
      memset(&wr, 0, sizeof(wr));
      wr.wr_id = wc.wr_id;
      if (ibv_post_recv(c->qps[wc.wr_id % kQps], &wr, &bad))
        return fail(c, "verbs net: ibv_post_recv failed");
    } else if (wc.wr_id != 0) {
      reinterpret_cast<Request*>(wc.wr_id)->pending--;
    }
  }
  return ncclSuccess;
}

ncclResult_t VerbsNet::irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                             void** mhandles, void** request) {
  Comm* c = static_cast<Comm*>(recvComm);
  *request = nullptr;
  MK_ARGCHECK(n >= 1 && n <= kNetMaxRecvs, "verbs net: irecv of %d buffers", n);
  MK_ARGCHECK(mhandles != nullptr, "verbs net: irecv needs registered buffers");
  NCCLCHECK(poll(c));
  int slot = (int)(c->recvSeq % kSlots);
  if (c->slots[slot]) return ncclSuccess;  // FIFO full: busy
  FifoEntry& e = c->cts[slot];
  for (int i = 0; i < n; i++) {
    MK_ARGCHECK(mhandles[i] != nullptr || sizes[i] == 0, "verbs net: unregistered buffer");
    MK_ARGCHECK(sizes[i] <= kMaxMsg, "verbs net: receive of %zu bytes over 1 GiB", sizes[i]);
    e.addr[i] = (uintptr_t)data[i];
    e.size[i] = sizes[i];
    e.rkey[i] = mhandles[i] ? static_cast<Mr*>(mhandles[i])->mr->rkey : 0;
    e.tag[i] = tags ? tags[i] : 0;
  }
  e.n = (uint32_t)n;
  e.seq = c->recvSeq + 1;
  Request* r = new Request{c, false, slot, n, n * kQps, 0};
  ibv_sge sge = {(uintptr_t)&e, (uint32_t)sizeof(e), c->ctsMr->lkey};
  ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof(wr));
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = c->remote.fifoAddr + (uint64_t)slot * sizeof(FifoEntry);
  wr.wr.rdma.rkey = c->remote.fifoRkey;
  wr.wr_id = 0;  // nothing waits on the CTS write itself
  if (ibv_post_send(c->qps[0], &wr, &bad)) {
    delete r;
    return fail(c, "verbs net: posting the clear-to-send to " + c->peer + " failed");
  }
  c->slots[slot] = r;
  c->live.insert(r);
  c->recvSeq++;
  *request = r;
  return ncclSuccess;
}

ncclResult_t VerbsNet::isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                             void** request) {
  Comm* c = static_cast<Comm*>(sendComm);
  *request = nullptr;
  NCCLCHECK(poll(c));
  int slot = (int)(c->sendSlotSeq % kSlots);
  volatile FifoEntry* e = &c->fifo[slot];
  if (e->seq != c->sendSlotSeq + 1) return ncclSuccess;  // receiver has not posted: busy
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  int n = (int)e->n, idx = -1;
  for (int i = 0; i < n && idx < 0; i++)
    if (!c->used[i] && e->tag[i] == tag) idx = i;
  if (idx < 0)
    return fail(c, "verbs net: message tag " + std::to_string(tag) +
                       " matches no receive buffer posted by " + c->peer);
  if (size > e->size[idx])
    return fail(c, "verbs net: message of " + std::to_string(size) + " bytes exceeds the " +
                       std::to_string(e->size[idx]) + "-byte receive buffer of " + c->peer);
  MK_ARGCHECK(mhandle != nullptr || size == 0, "verbs net: isend of an unregistered buffer");
  Request* r = new Request{c, true, slot, 1, kQps, size};
  uint32_t lkey = mhandle ? static_cast<Mr*>(mhandle)->mr->lkey : 0;
  uint64_t raddr = e->addr[idx];
  uint32_t rkey = e->rkey[idx];
  // The size first (inline, QP 0), then one WRITE_WITH_IMM per QP carrying a share of
  // the data: the immediate on a QP follows that QP's data, and the size precedes QP 0's.
  uint64_t sz = size;
  ibv_sge ssge = {(uintptr_t)&sz, sizeof(sz), 0};
  ibv_send_wr swr, *bad;
  memset(&swr, 0, sizeof(swr));
  swr.opcode = IBV_WR_RDMA_WRITE;
  swr.send_flags = IBV_SEND_INLINE;
  swr.sg_list = &ssge;
  swr.num_sge = 1;
  swr.wr.rdma.remote_addr = c->remote.sizesAddr + ((uint64_t)slot * kNetMaxRecvs + idx) * 8;
  swr.wr.rdma.rkey = c->remote.sizesRkey;
  if (ibv_post_send(c->qps[0], &swr, &bad)) {
    delete r;
    return fail(c, "verbs net: posting to " + c->peer + " failed");
  }
  size_t part = (size + kQps - 1) / kQps;
  for (int q = 0; q < kQps; q++) {
    size_t off = std::min(size, part * q), len = std::min(size - off, part);
    ibv_sge sge = {(uintptr_t)data + off, (uint32_t)len, lkey};
    ibv_send_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = (uint32_t)slot;
    wr.sg_list = len ? &sge : nullptr;
    wr.num_sge = len ? 1 : 0;
    wr.wr.rdma.remote_addr = raddr + off;
    wr.wr.rdma.rkey = rkey;
    wr.wr_id = reinterpret_cast<uint64_t>(r);
    if (ibv_post_send(c->qps[q], &wr, &bad)) {
      // Already-posted parts still complete against r: keep it alive in `live`.
      c->live.insert(r);
      return fail(c, "verbs net: posting to " + c->peer + " failed");
    }
  }
  c->used[idx] = true;
  if (++c->usedInSlot == n) {  // every buffer of this receive is served: next FIFO entry
    c->usedInSlot = 0;
    memset(c->used, 0, sizeof(c->used));
    c->sendSlotSeq++;
  }
  c->live.insert(r);
  *request = r;
  return ncclSuccess;
}

ncclResult_t VerbsNet::test(void* request, int* done, size_t* sizes) {
  Request* r = static_cast<Request*>(request);
  Comm* c = r->comm;
  *done = 0;
  NCCLCHECK(poll(c));
  if (r->pending > 0) return ncclSuccess;
  if (r->isFlush) {
    c->flushes--;
  } else if (sizes) {
    if (r->isSend)
      sizes[0] = r->size;
    else
      for (int i = 0; i < r->n; i++)
        sizes[i] = (size_t)__atomic_load_n(&c->sizes[r->slot * kNetMaxRecvs + i], __ATOMIC_ACQUIRE);
  }
  if (!r->isSend && !r->isFlush) c->slots[r->slot] = nullptr;
  c->live.erase(r);
  delete r;
  *done = 1;
  return ncclSuccess;
}

ncclResult_t netCreateVerbs(std::unique_ptr<Net>* out) {
  bool forced = strcmp(MK_PARAM_STR(Net), "verbs") == 0;
  auto unavailable = [&](const std::string& why) {
    if (forced)
      MK_WARN("verbs net not available: %s", why.c_str());
    else
      MK_INFO(kNet, "verbs net not available: %s", why.c_str());
    return ncclSystemError;
  };
  if (MK_PARAM_INT(IbDisable) != 0) return unavailable("NCCL_IB_DISABLE=1");
  std::string why;
  if (ibvInit(&why) != ncclSuccess) return unavailable(why);
  std::unique_ptr<VerbsNet> net(new VerbsNet());
  if (ifFind(&net->ifs, 1) != ncclSuccess) return unavailable("no interface for the side channel");
  int ndev = 0;
  ibv_device** list = ibv.getDeviceList(&ndev);
  if (!list || ndev == 0) {
    if (list) ibv.freeDeviceList(list);
    return unavailable("no RDMA device (ibv_get_device_list found none)");
  }
  const char* hca = MK_PARAM_STR(IbHca);
  bool peermem = access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0 ||
                 access("/sys/module/nvidia_peermem", F_OK) == 0;
  for (int i = 0; i < ndev; i++) {
    const char* name = ibv.getDeviceName(list[i]);
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    ibv_device_attr da;
    for (int port = 1;; port++) {
      if (!ctx) {
        ctx = ibv.openDevice(list[i]);
        if (!ctx) break;
        if (ibv.queryDevice(ctx, &da) != 0) {
          ibv.closeDevice(ctx);
          ctx = nullptr;
          break;
        }
      }
      if (port > da.phys_port_cnt) break;
      if (!hcaMatches(hca, name, port)) continue;
      Dev d = {};
      d.name = name;
      d.port = port;
      d.ctx = ctx;
      if (ibv.queryPort(ctx, (uint8_t)port, &d.portAttr) != 0) continue;
      if (d.portAttr.state != IBV_PORT_ACTIVE) continue;
      if (d.portAttr.link_layer != IBV_LINK_LAYER_INFINIBAND &&
          d.portAttr.link_layer != IBV_LINK_LAYER_ETHERNET)
        continue;
      if (!pd) pd = ibv.allocPd(ctx);
      if (!pd) break;
      d.pd = pd;
      d.gidIndex = pickGid(d);
      ibv.queryGid(ctx, (uint8_t)port, d.gidIndex, &d.gid);
      char real[PATH_MAX];
      std::string sys = std::string("/sys/class/infiniband/") + name + "/device";
      if (realpath(sys.c_str(), real)) d.pciPath = real;
      d.speedMbps = speedOf(d.portAttr);
      d.peermem = peermem;
      // The symbol alone is not enough: probe with a bad fd. EOPNOTSUPP/EPROTONOSUPPORT
      // mean the kernel or provider lacks dma-buf support; EBADF means it would try.
      d.dmabuf = false;
      if (ibv.regDmabufMr) {
        errno = 0;
        ibv_mr* mr = ibv.regDmabufMr(pd, 0, 0, 0, -1, 0);
        if (mr) ibv.deregMr(mr);
        d.dmabuf = errno != EOPNOTSUPP && errno != EPROTONOSUPPORT;
      }
      MK_INFO(kNet, "verbs net: %s:%d %s, %d Mb/s, gid index %d, dma-buf %d, peermem %d", name,
              port, d.portAttr.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB", d.speedMbps,
              d.gidIndex, d.dmabuf, d.peermem);
      net->devs.push_back(d);
    }
    bool used = false;
    for (Dev& d : net->devs) used |= d.ctx == ctx;
    if (!used) {
      if (pd) ibv.deallocPd(pd);
      if (ctx) ibv.closeDevice(ctx);
    }
  }
  ibv.freeDeviceList(list);
  if (net->devs.empty()) return unavailable("no active RDMA port matches NCCL_IB_HCA");
  *out = std::move(net);
  return ncclSuccess;
}

}  // namespace mk
