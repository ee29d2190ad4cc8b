// The one internal interface to inter-node networks. It is shaped like the NCCL net
// plugin ABI (mkernel/net_plugin/) so that the three kinds of backend fit behind it
// with thin adapters:
//   - socket (net_socket.cc): TCP, always available, the fallback and test transport;
//   - verbs  (net_verbs.cc):  InfiniBand/RoCE RC QPs through dlopen'd libibverbs;
//   - plugin (net_plugin.cc): any external libnccl-net-*.so (ncclNetPlugin_v8..v11).
// and so that plugin/ can export our own backends as a standard NCCL plugin.
//
// Semantics (those of the NCCL plugin ABI, which every caller may rely on):
//   - listen() fills an opaque handle of kNetHandleSize bytes; the caller ships it to
//     the peer out of band, which passes it to connect().
//   - connect()/accept() never block on the peer: they may return a NULL comm, and the
//     caller calls them again (netConnectBlocking/netAcceptBlocking loop with a deadline).
//   - isend/irecv are asynchronous and may return a NULL request ("busy, retry").
//     Messages on one send/recv comm pair are matched in posting order; an irecv of n
//     buffers (multi-receive, n <= maxRecvs) takes the next n messages and places each in
//     the buffer whose tag equals the message's tag. A message larger than its buffer is
//     an error; a smaller one is fine and test() reports its size.
//   - a send may make no progress until the caller's next test() on that comm (the socket
//     backend's inline connection queues isend frames and writes them, gathered, in test():
//     MKERNEL_SOCKET_TX_COALESCE), so a caller tests its requests soon after posting; close
//     drops frames still queued (as NCCL's socket plugin does).
//   - test() frees a request when it reports done, or fails; a failure returns
//     ncclRemoteError (peer gone, link down) or ncclSystemError with MK_WARN naming the peer.
//   - close*() never block longer than a few hundred ms and release every thread and fd.
#pragma once
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "mkernel/net_plugin/net_common.h"

namespace mk {

constexpr int kNetHandleSize = NCCL_NET_HANDLE_MAXSIZE;
// Largest multi-receive any of our backends accepts (NCCL's IB transport uses 8).
constexpr int kNetMaxRecvs = 8;

struct NetProperties {
  std::string name;     // interface or HCA name ("lo", "mlx5_0:1")
  std::string pciPath;  // sysfs path of the PCI function, "" when virtual
  uint64_t guid = 0;
  int ptrSupport = NCCL_PTR_HOST;  // NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF
  bool regIsGlobal = false;
  bool forceFlush = false;
  int speedMbps = 10000;
  int port = 0;
  float latencyUs = 0;
  int maxComms = 65536;
  int maxRecvs = 1;
  size_t maxP2pBytes = (size_t)1 << 31;
  size_t maxCollBytes = (size_t)1 << 31;
};

// Receive system calls of a recv comm (diagnostics: MKERNEL_PROXY_STATS).
struct NetRecvCounts {
  uint64_t calls = 0;  // receive system calls on the path the caller's test() drives
  uint64_t empty = 0;  // of which found nothing to read
  uint64_t msgs = 0;   // messages (chunks of messages) they delivered
};
// Send system calls of a send comm on the path the caller's isend/test drive (tests and
// diagnostics: they prove MKERNEL_SOCKET_TX_COALESCE gathers queued messages into one call).
struct NetSendCounts {
  uint64_t calls = 0;  // send system calls made
  uint64_t msgs = 0;   // messages (chunks of messages) they wrote out completely
};

class Net {
 public:
  virtual ~Net() = default;
  virtual const char* name() const = 0;
  virtual ncclResult_t devices(int* ndev) = 0;
  virtual ncclResult_t getProperties(int dev, NetProperties* props) = 0;
  // handle: kNetHandleSize bytes, written here.
  virtual ncclResult_t listen(int dev, void* handle, void** listenComm) = 0;
  // handle: the peer's listen handle; backends may keep connection state in it between
  // calls (as NCCL's IB transport does), so it must stay the same buffer until a comm is
  // returned.
  virtual ncclResult_t connect(int dev, void* handle, void** sendComm) = 0;
  virtual ncclResult_t accept(void* listenComm, void** recvComm) = 0;
  // type: NCCL_PTR_HOST or NCCL_PTR_CUDA. comm: a send or a recv comm.
  virtual ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) = 0;
  virtual ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset,
                                   int fd, void** mhandle) = 0;
  virtual ncclResult_t deregMr(void* comm, void* mhandle) = 0;
  virtual ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                             void** request) = 0;
  virtual ncclResult_t irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                             void** mhandles, void** request) = 0;
  // Makes data received into GPU memory visible to the GPU; *request NULL = nothing to do.
  virtual ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                              void** request) = 0;
  // sizes (may be NULL): for a receive, one entry per buffer; for a send, one entry.
  virtual ncclResult_t test(void* request, int* done, size_t* sizes) = 0;
  virtual ncclResult_t closeSend(void* sendComm) = 0;
  virtual ncclResult_t closeRecv(void* recvComm) = 0;
  virtual ncclResult_t closeListen(void* listenComm) = 0;
  // Diagnostics: false (the default) when the backend does not count them.
  virtual bool recvCounts(void* recvComm, NetRecvCounts* out) { return false; }
  virtual bool sendCounts(void* sendComm, NetSendCounts* out) { return false; }
  // The owning comm's abort word (may stay null). The internal backends' blocking socket steps
  // of connection set-up (connect, the first handshake) give up when it is set, so that
  // ncclCommAbort during a comm's init returns at once rather than after
  // MKERNEL_NET_TIMEOUT_S. A plugin's connect and accept do not block, so it needs none.
  void setAbortFlag(const uint32_t* flag) { abortFlag_ = flag; }

 protected:
  const uint32_t* abortFlag_ = nullptr;
};

// Backends. Each returns ncclSystemError with a "not available: why" warning when it
// cannot run here (verbs without libibverbs or RDMA devices, a plugin that fails to load).
ncclResult_t netCreateSocket(std::unique_ptr<Net>* out);
ncclResult_t netCreateVerbs(std::unique_ptr<Net>* out);
// nameOrPath: "foo" -> libnccl-net-foo.so (searched by the dynamic loader), or a path
// containing '/', or a file name ending in ".so". Tries ncclNetPlugin_v11 .. _v8.
ncclResult_t netLoadPlugin(const char* nameOrPath, std::unique_ptr<Net>* out);
// The same, pinned to one ABI version (8..11; 0 = newest exported). Tests use it to run
// the conformance suite through every version a plugin exports.
ncclResult_t netLoadPluginVersion(const char* nameOrPath, int version, std::unique_ptr<Net>* out);
// MKERNEL_NET (socket | verbs | plugin) or, when empty: NCCL_NET_PLUGIN if set, then
// verbs, then socket. A backend with zero devices counts as unavailable.
ncclResult_t netCreate(std::unique_ptr<Net>* out);

// Loop connect()/accept() until a comm comes back or timeoutMs passes
// (ncclRemoteError naming what was awaited). abortFlag (optional) stops early.
ncclResult_t netConnectBlocking(Net* net, int dev, void* handle, void** sendComm, int64_t timeoutMs,
                                const volatile uint32_t* abortFlag = nullptr);
ncclResult_t netAcceptBlocking(Net* net, void* listenComm, void** recvComm, int64_t timeoutMs,
                               const volatile uint32_t* abortFlag = nullptr);
// Loop test() until done (or error/timeout). Test helper and slow-path use only.
ncclResult_t netWaitRequest(Net* net, void* request, size_t* sizes, int64_t timeoutMs);

// Seconds a socket may stay silent with data or keepalives outstanding before the peer
// is declared dead (TCP_USER_TIMEOUT / keepalive), and the connect/accept bound.
int64_t netTimeoutMs();

}  // namespace mk
