// Registry of the per-process clique blocks of the fused operators (clique_block.h).
#include "fused/core/clique_block.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <cuda_runtime.h>

#include "base/checks.h"
#include "comm/comm.h"

namespace mk {
namespace fused {

namespace {
struct Entry {
  void* block = nullptr;
  size_t bytes = 0;
  int refs = 0;
};
std::mutex gMutex;
std::map<std::pair<uint64_t, int>, Entry>& registry() {
  static std::map<std::pair<uint64_t, int>, Entry> m;
  return m;
}
}  // namespace

bool cliqueEligible(const ncclComm* comm, int maxLocal) {
  if (comm->nRanks > maxLocal || comm->topo.nNodes != 1) return false;
  const RankInfo& me = comm->peerInfo[comm->rank];
  for (const RankInfo& r : comm->peerInfo) {
    if (r.hostHash != me.hostHash || r.pidHash != me.pidHash || r.cudaDev != me.cudaDev)
      return false;
  }
  return true;
}

bool cliqueBlockHeld(const ncclComm* comm, CliqueTag tag) {
  return (comm->fusedCliqueRefs >> tag) & 1u;
}

ncclResult_t cliqueBlockGet(ncclComm* comm, CliqueTag tag, size_t bytes, void** out) {
  std::lock_guard<std::mutex> lock(gMutex);
  Entry& e = registry()[{comm->commHash, (int)tag}];
  if (e.block == nullptr) {
    cudaStream_t s = nullptr;
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    // Zeroed before any kernel of any rank can use it, on a private stream: a device-wide
    // synchronisation here could wait for a peer's kernel that waits for this thread.
    if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (err == cudaSuccess) err = cudaMemsetAsync(p, 0, bytes, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (s != nullptr) cudaStreamDestroy(s);
    if (err != cudaSuccess) {
      if (p != nullptr) cudaFree(p);
      cudaGetLastError();
      MK_WARN(
          "fused clique block (%zu bytes): %s (the first fused call of a comm must not be "
          "captured: it allocates)",
          bytes, cudaGetErrorString(err));
      registry().erase({comm->commHash, (int)tag});
      return err == cudaErrorStreamCaptureUnsupported || err == cudaErrorStreamCaptureImplicit
                 ? ncclInvalidUsage
                 : ncclUnhandledCudaError;
    }
    e.block = p;
    e.bytes = bytes;
  } else if (e.bytes < bytes) {
    MK_WARN("fused clique block: %zu bytes needed, %zu allocated (comm hash collision?)", bytes,
            e.bytes);
    return ncclInternalError;
  }
  if (!cliqueBlockHeld(comm, tag)) {
    comm->fusedCliqueRefs |= 1u << tag;
    e.refs++;
  }
  *out = e.block;
  return ncclSuccess;
}

ncclResult_t cliqueBlockForCall(ncclComm* comm, CliqueTag tag, size_t bytes, cudaStream_t stream,
                                const char* api, void** out) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  CUDACHECK(cudaStreamIsCapturing(stream, &cap));
  if (cap != cudaStreamCaptureStatusNone && !cliqueBlockHeld(comm, tag)) {
    MK_WARN(
        "%s: rank %d: the first call on a comm allocates its shared state and cannot be "
        "captured: make one call outside the capture first",
        api, comm->rank);
    return ncclInvalidUsage;
  }
  return cliqueBlockGet(comm, tag, bytes, out);
}

void cliqueBlocksRelease(ncclComm* comm) {
  if (comm->fusedCliqueRefs == 0) return;
  std::lock_guard<std::mutex> lock(gMutex);
  for (int tag = 0; tag < kCliqueTags; ++tag) {
    if (!((comm->fusedCliqueRefs >> tag) & 1u)) continue;
    auto it = registry().find({comm->commHash, tag});
    if (it == registry().end()) continue;
    if (--it->second.refs == 0) {
      cudaFree(it->second.block);
      registry().erase(it);
    }
  }
  comm->fusedCliqueRefs = 0;
}

}  // namespace fused
}  // namespace mk
