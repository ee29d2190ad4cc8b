// Memory of the inter-node state: process-wide pools of pinned, device and shareable
// blocks and of proxy rings. Nothing here is ever freed (see net_state_impl.h: freeing
// synchronises the device); blocks are recycled by (kind, device, size).
#include <cstdint>
#include <utility>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "base/checks.h"
#include "transport/net_state_impl.h"
#include "transport/peer_mem.h"
#include "transport/proxy_ring.h"

namespace mk {
namespace {

struct Pools {
  std::mutex mu;
  std::map<std::tuple<int, int, size_t>, std::vector<NetBlock>> blocks;  // (kind, dev, bytes)
  std::map<std::pair<int, uint64_t>, std::vector<ProxyRing*>> rings;     // (dev, nslots)
};
Pools& pools() {
  static Pools* p = new Pools();  // never destroyed (exit order)
  return *p;
}

ncclResult_t zeroFill(NetBlock* b, cudaStream_t s) {
  if (b->kind == NetMem::kHostMapped) {
    memset(b->host, 0, b->bytes);
    return ncclSuccess;
  }
  CUDACHECK(cudaMemsetAsync(b->dev, 0, b->bytes, s));
  CUDACHECK(cudaStreamSynchronize(s));
  return ncclSuccess;
}

ncclResult_t allocBlock(NetMem kind, int cudaDev, size_t bytes, NetBlock* b) {
  b->kind = kind;
  b->cudaDev = cudaDev;
  b->bytes = bytes;
  switch (kind) {
    case NetMem::kHostMapped:
      CUDACHECK(cudaHostAlloc(&b->host, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
      CUDACHECK(cudaHostGetDevicePointer(&b->dev, b->host, 0));
      break;
    case NetMem::kDevice:
      CUDACHECK(cudaMalloc(&b->dev, bytes));
      break;
    case NetMem::kShared:
      NCCLCHECK(memAlloc(&b->dev, bytes));
      break;
  }
  MK_INFO(kNet | kAlloc, "net: new %s block of %zu bytes on GPU %d",
          kind == NetMem::kHostMapped ? "host-mapped"
          : kind == NetMem::kDevice   ? "device"
                                      : "shared",
          bytes, cudaDev);
  return ncclSuccess;
}

}  // namespace

ncclResult_t netMemGet(NetMem kind, int cudaDev, size_t bytes, cudaStream_t s, NetBlock* out) {
  *out = NetBlock{};
  NetBlock b;
  bool found = false;
  {
    Pools& p = pools();
    std::lock_guard<std::mutex> lk(p.mu);
    auto it = p.blocks.find(std::make_tuple((int)kind, cudaDev, bytes));
    if (it != p.blocks.end() && !it->second.empty()) {
      b = it->second.back();
      it->second.pop_back();
      found = true;
    }
  }
  if (!found) NCCLCHECK(allocBlock(kind, cudaDev, bytes, &b));
  ncclResult_t res = zeroFill(&b, s);
  if (res != ncclSuccess) {
    netMemPut(&b);
    return res;
  }
  *out = b;
  return ncclSuccess;
}

void netMemPut(NetBlock* b) {
  if (b->dev == nullptr && b->host == nullptr) return;
  Pools& p = pools();
  std::lock_guard<std::mutex> lk(p.mu);
  p.blocks[std::make_tuple((int)b->kind, b->cudaDev, b->bytes)].push_back(*b);
  *b = NetBlock{};
}

ncclResult_t netRingGet(int cudaDev, uint64_t nslots, ProxyRing** out) {
  *out = nullptr;
  uint64_t n = 1;
  while (n < nslots) n <<= 1;
  {
    Pools& p = pools();
    std::lock_guard<std::mutex> lk(p.mu);
    auto it = p.rings.find(std::make_pair(cudaDev, n));
    if (it != p.rings.end() && !it->second.empty()) {
      *out = it->second.back();
      it->second.pop_back();
      return ncclSuccess;
    }
  }
  return ProxyRing::create(n, ProxyRingMem::kCudaMapped, out);
}

namespace {
// A pinned word to read the device tail into; recycled like everything else here.
std::mutex gWordMu;
std::vector<uint64_t*> gWords;
uint64_t* wordGet() {
  {
    std::lock_guard<std::mutex> lk(gWordMu);
    if (!gWords.empty()) {
      uint64_t* w = gWords.back();
      gWords.pop_back();
      return w;
    }
  }
  uint64_t* w = nullptr;
  return cudaHostAlloc((void**)&w, sizeof(uint64_t), cudaHostAllocPortable) == cudaSuccess
             ? w
             : nullptr;
}
void wordPut(uint64_t* w) {
  if (!w) return;
  std::lock_guard<std::mutex> lk(gWordMu);
  gWords.push_back(w);
}
}  // namespace

void netRingPut(int cudaDev, ProxyRing* r, cudaStream_t s) {
  if (r == nullptr) return;
  // The device tail counts tickets GPU producers took; the host cannot see it directly.
  // A producer that gave up after taking a ticket (timeout) left a hole that would stall
  // the ring forever: such a ring is leaked, never handed to another comm.
  bool clean = !r->aborted();
  uint64_t* word = clean ? wordGet() : nullptr;
  clean = clean && word != nullptr;
  if (clean) {
    clean = cudaMemcpyAsync(word, r->deviceView().tail, sizeof(uint64_t), cudaMemcpyDeviceToHost,
                            s) == cudaSuccess &&
            cudaStreamSynchronize(s) == cudaSuccess;
    clean = clean && *word == r->tail() && r->done() == r->tail();
  }
  wordPut(word);
  cudaGetLastError();
  if (!clean) {
    MK_INFO(kNet, "net: proxy ring %p not clean (aborted or abandoned tickets); not recycled",
            (void*)r);
    return;
  }
  Pools& p = pools();
  std::lock_guard<std::mutex> lk(p.mu);
  p.rings[std::make_pair(cudaDev, r->nslots())].push_back(r);
}

}  // namespace mk
