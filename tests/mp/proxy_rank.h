// A test rank's proxy over host memory it owns (test_proxy_e2e.cc, test_proxy_latency.cc):
// the socket backend, one host command ring, send and receive windows, signal words.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "mp/test_net_harness.inl"
#include "transport/net.h"
#include "transport/proxy.h"

namespace mknet {

struct ProxyRank {
  std::unique_ptr<mk::Net> net;
  std::unique_ptr<mk::ProxyRing> ring;
  std::vector<uint8_t> sendBuf, recvBuf;
  std::vector<uint64_t> signals;
  mk::Proxy* proxy = nullptr;

  // The proxy's configuration over these members (net, ring, buffers and signals set up
  // first); the hub's all-to-all exchanges the connection handles.
  mk::ProxyConfig config(const Ctx& ctx, std::vector<int> peers) {
    mk::ProxyConfig cfg;
    cfg.rank = ctx.rank;
    cfg.nranks = ctx.nranks;
    cfg.peers = peers;
    cfg.net = net.get();
    cfg.rings = {ring.get()};
    cfg.sendBuf = sendBuf.data();
    cfg.sendBytes = sendBuf.size();
    cfg.recvBuf = recvBuf.data();
    cfg.recvBytes = recvBuf.size();
    cfg.signals = signals.data();
    cfg.nSignals = signals.size();
    cfg.alltoall = [ctx](const void* s, void* d, size_t b) { return hubAllToAll(ctx, s, d, b); };
    return cfg;
  }
  ~ProxyRank() {
    if (proxy) mk::proxyDestroy(proxy);
  }
};

}  // namespace mknet
