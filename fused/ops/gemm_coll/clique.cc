// Registry of the per-process clique blocks of the fused GEMM + collective kernels.
#include "fused/ops/gemm_coll/clique.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <cuda_runtime.h>

#include "base/checks.h"
#include "comm/comm.h"

namespace mk {
namespace fused {

namespace {
struct Entry {
  GcClique* block = nullptr;
  int refs = 0;
  int device = -1;
};
std::mutex gMutex;
std::map<uint64_t, Entry>& registry() {
  static std::map<uint64_t, Entry> m;
  return m;
}
size_t blockBytes(int n) {
  return sizeof(GcClique) + 2ull * n * kGcMaxTiles * sizeof(uint64_t);
}

// Every rank of the comm lives in this process and on one (virtual) node.
bool eligible(const ncclComm* comm) {
  if (comm->nRanks > kGcMaxLocal || comm->topo.nNodes != 1) return false;
  const RankInfo& me = comm->peerInfo[comm->rank];
  for (const RankInfo& r : comm->peerInfo) {
    if (r.hostHash != me.hostHash || r.pidHash != me.pidHash || r.cudaDev != me.cudaDev)
      return false;
  }
  return true;
}
}  // namespace

ncclResult_t gcCliqueGet(ncclComm* comm, GcClique** q, uint64_t** flags) {
  if (!eligible(comm)) return ncclInvalidUsage;
  std::lock_guard<std::mutex> lock(gMutex);
  Entry& e = registry()[comm->commHash];
  if (e.block == nullptr) {
    void* p = nullptr;
    const size_t bytes = blockBytes(comm->nRanks);
    CUDACHECK(cudaMalloc(&p, bytes));
    // Zeroed before any kernel of any rank can use it, on a private stream: a device-wide
    // synchronisation here could wait for a peer's kernel that waits for this thread.
    cudaStream_t s = nullptr;
    cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (err == cudaSuccess) err = cudaMemsetAsync(p, 0, bytes, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (s != nullptr) cudaStreamDestroy(s);
    if (err != cudaSuccess) {
      cudaFree(p);
      MK_WARN("fused clique block: %s", cudaGetErrorString(err));
      return ncclUnhandledCudaError;
    }
    e.block = static_cast<GcClique*>(p);
    e.device = comm->cudaDev;
  }
  if (!comm->fusedCliqueRef) {
    comm->fusedCliqueRef = true;
    e.refs++;
  }
  *q = e.block;
  *flags = reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(e.block) + sizeof(GcClique));
  return ncclSuccess;
}

void gcCliqueRelease(ncclComm* comm) {
  if (!comm->fusedCliqueRef) return;
  std::lock_guard<std::mutex> lock(gMutex);
  auto it = registry().find(comm->commHash);
  comm->fusedCliqueRef = false;
  if (it == registry().end()) return;
  if (--it->second.refs == 0) {
    cudaFree(it->second.block);
    registry().erase(it);
  }
}

}  // namespace fused
}  // namespace mk
