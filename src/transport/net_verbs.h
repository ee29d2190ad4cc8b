#pragma once
// Verbs net backend (net_verbs.cc: devices, connection setup, registration;
// net_verbs_data.cc: QPs and the data path): InfiniBand / RoCE RC queue pairs through dlopen'd
// libibverbs.
//
// Data path (the receiver-driven scheme NCCL's IB transport uses):
//   - irecv writes a clear-to-send entry {addr, rkey, size, tag per buffer, seq} into the
//     sender's FIFO (RDMA WRITE on QP 0);
//   - isend waits for that entry (NULL request = "busy" until it arrives), then writes the
//     data straight into the receiver's buffer: the message is split over kQps QPs, each
//     part an RDMA WRITE_WITH_IMM (imm = FIFO slot); the message size goes first with an
//     inline RDMA WRITE into the receiver's size table on QP 0;
//   - the receiver completes slot s after n x kQps immediates for it. RC ordering makes
//     every byte written before an immediate visible when its completion is polled.
// Connection setup exchanges QP numbers, LID/GID, MTU and the FIFO/size-table keys over
// a TCP socket (bootstrap/socket.h) as a non-blocking state machine kept in the handle.
// GPU buffers: ibv_reg_dmabuf_mr on a dma-buf from cuMemGetHandleForAddressRange, else
// ibv_reg_mr (works with nvidia-peermem).
// Flush (GPUDirect RDMA, as NCCL does it): a receive's completion says the NIC has
// written the data, not that the GPU sees it yet. iflush posts a 1-byte RDMA READ of the
// last received GPU buffer on a QP connected to itself ("flush QP", one per recv comm);
// PCIe does not let the read's completion pass the NIC's earlier writes to that GPU,
// so once the read completes every byte received before it is visible to the GPU.
// Receives into host memory need no flush (iflush returns a NULL request).
#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "bootstrap/ifaces.h"
#include "bootstrap/socket.h"
#include "transport/ibvwrap.h"
#include "transport/net.h"

namespace mk {
namespace verbs {

constexpr uint64_t kHandleMagic = 0x3173627265762d6dull;  // "m-verbs1"
constexpr int kQps = 2;     // QPs per comm (messages are striped over them)
constexpr int kSlots = 64;  // outstanding receives per comm (FIFO depth)
constexpr size_t kMaxMsg = 1ull << 30;
constexpr int kRecvWrs = kSlots * kNetMaxRecvs;  // immediates in flight per QP, at most

struct FifoEntry {
  uint64_t addr[kNetMaxRecvs];
  uint64_t size[kNetMaxRecvs];
  uint32_t rkey[kNetMaxRecvs];
  int32_t tag[kNetMaxRecvs];
  uint32_t n;
  uint32_t pad;
  uint64_t seq;  // receive sequence + 1; last field, so a complete entry is recognisable
};

struct QpInfo {
  uint32_t qpn[kQps];
  uint32_t mtu;
  uint16_t lid;
  uint8_t linkLayer;
  uint8_t pad;
  ibv_gid gid;
  uint64_t fifoAddr;  // sender: its FIFO
  uint32_t fifoRkey;
  uint32_t sizesRkey;  // receiver: its size table
  uint64_t sizesAddr;
};

struct Handle {
  uint64_t magic;
  SocketWireAddress addr;
  uint64_t stageComm;  // connect state kept by the caller between calls (as NCCL does)
  int stage;
};
static_assert(sizeof(Handle) <= kNetHandleSize, "verbs handle too large");

struct Dev {
  std::string name;  // "mlx5_0"
  int port;
  ibv_context* ctx;
  ibv_pd* pd;
  ibv_port_attr portAttr;
  int gidIndex;
  ibv_gid gid;
  std::string pciPath;
  int speedMbps;
  bool dmabuf;
  bool peermem;
};

struct Mr {
  ibv_mr* mr;
  bool gpu;  // registered as NCCL_PTR_CUDA: receives into it need a flush
};

struct Comm;
struct Request {
  Comm* comm;
  bool isSend;
  int slot;
  int n;
  int pending;  // completions still expected
  size_t size;  // send
  bool isFlush = false;
};

struct Comm {
  Dev* dev = nullptr;
  bool isSend = false;
  Socket sock;
  ibv_cq* cq = nullptr;
  ibv_qp* qps[kQps] = {};
  QpInfo local{}, remote{};
  size_t remoteGot = 0;
  bool ready = false;
  // send side
  FifoEntry* fifo = nullptr;
  ibv_mr* fifoMr = nullptr;
  uint64_t sendSlotSeq = 0;  // receive requests consumed
  int usedInSlot = 0;
  bool used[kNetMaxRecvs] = {};
  // recv side
  FifoEntry* cts = nullptr;  // staging of the entries we write into the sender's FIFO
  ibv_mr* ctsMr = nullptr;
  uint64_t* sizes = nullptr;  // [kSlots][kNetMaxRecvs], written by the sender
  ibv_mr* sizesMr = nullptr;
  uint64_t recvSeq = 0;
  Request* slots[kSlots] = {};
  ibv_qp* flushQp = nullptr;     // connected to itself (see the top of this file)
  uint64_t* flushBuf = nullptr;  // where flush READs land (host memory)
  ibv_mr* flushMr = nullptr;
  int flushes = 0;  // flush READs in flight (at most kSlots)
  std::unordered_set<Request*> live;
  ncclResult_t error = ncclSuccess;
  std::string errMsg;
  std::string peer;
};

struct Listen {
  Dev* dev;
  Socket sock;
  Comm* pending = nullptr;
  int stage = 0;
};

// Helpers (net_verbs.cc).
std::string gidStr(const ibv_gid& g);
// NCCL_IB_HCA syntax: prefix list, '^' excludes, '=' exact, "name:port" items.
bool hcaMatches(const char* spec, const std::string& name, int port);
int pickGid(Dev& d);
int speedOf(const ibv_port_attr& a);

}  // namespace verbs

class VerbsNet : public Net {
 public:
  std::vector<verbs::Dev> devs;
  std::vector<NetIf> ifs;  // for the TCP side channel
  ~VerbsNet() override;

  const char* name() const override { return "verbs"; }
  ncclResult_t devices(int* ndev) override;
  ncclResult_t getProperties(int dev, NetProperties* p) override;
  ncclResult_t listen(int dev, void* handle, void** listenComm) override;
  ncclResult_t connect(int dev, void* handle, void** sendComm) override;
  ncclResult_t accept(void* listenComm, void** recvComm) override;
  ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) override;
  ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                           void** mhandle) override;
  ncclResult_t deregMr(void* comm, void* mhandle) override;
  ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                     void** request) override;
  ncclResult_t irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                     void** request) override;
  ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                      void** request) override;
  ncclResult_t test(void* request, int* done, size_t* sizes) override;
  ncclResult_t closeSend(void* c) override;
  ncclResult_t closeRecv(void* c) override;
  ncclResult_t closeListen(void* listenComm) override;

  // net_verbs_data.cc
  ncclResult_t createQps(verbs::Comm* c);
  ncclResult_t connectQps(verbs::Comm* c);
  ncclResult_t createFlushQp(verbs::Comm* c);
  ncclResult_t allocSendSide(verbs::Comm* c);
  ncclResult_t allocRecvSide(verbs::Comm* c);
  ncclResult_t poll(verbs::Comm* c);
  ncclResult_t fail(verbs::Comm* c, const std::string& msg);
  ncclResult_t destroy(verbs::Comm* c);
};

}  // namespace mk
