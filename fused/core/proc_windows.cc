// Fused operators' windows in the processes layout (proc_windows.h).
#include "fused/core/proc_windows.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "base/checks.h"
#include "bootstrap/bootstrap.h"
#include "comm/comm.h"
#include "transport/peer_mem.h"
#include "transport/peer_mem_win.h"

namespace mk {
namespace fused {

namespace {

// One memAlloc'ed buffer registered as a window of the comm, and every local rank's copy of
// it as mapped here.
struct Win {
  void* ptr = nullptr;
  size_t bytes = 0;
  ncclWindow_t win = nullptr;
  std::vector<void*> bases;  // by local rank
};

struct State {
  std::mutex mu;  // one registration at a time per comm (they are collective and blocking)
  Win ctl, data;
  std::vector<Win> retired;  // regions replaced by a growth (graphs and kernels may use them)
  bool mapped = true;        // every local rank mapped every window so far
};

std::mutex gMu;
using Key = std::pair<const ncclComm*, int>;  // (comm, CliqueTag)
std::map<Key, std::shared_ptr<State>>& states() {
  static auto* m = new std::map<Key, std::shared_ptr<State>>();
  return *m;
}

ncclResult_t winDrop(ncclComm* comm, Win* w) {
  ncclResult_t res = ncclSuccess;
  if (w->win != nullptr) res = peerMemWinDeregister(comm, w->win);
  if (w->ptr != nullptr) {
    const ncclResult_t r = memFree(w->ptr);
    if (res == ncclSuccess) res = r;
  }
  *w = Win{};
  return res;
}

const char* tagName(CliqueTag tag) {
  switch (tag) {
    case kCliqueGemmColl:
      return "GEMM + collective";
    case kCliqueMoe:
      return "MoE";
    case kCliqueMoeCombine:
      return "MoE combine";
    case kCliqueRingAttn:
      return "ring attention";
    default:
      return "fused";
  }
}

// What a rank asks of one collective creation. Every rank of a call must ask the same: the
// sizes come from the call's arguments (maxRows, the shapes), and a rank that asked for more
// would grow alone later, waiting in a registration its peers never enter.
struct Ask {
  int32_t allocated;  // 1: this rank's allocation (and zeroing) worked
  int32_t pad;
  uint64_t ctlBytes, halfBytes;
};

// Allocates `bytes` (zeroed when `zero`), registers it (collective) and finds every local
// rank's mapping; *mapped false when some rank could not allocate or map it. Every rank first
// says whether its allocation worked and what it asked for (one allgather), so that a local
// failure sends every rank to the sequential path instead of leaving the others in the
// registration, and a difference in the asks fails every rank's call with
// ncclInvalidArgument at once (nothing is kept: a later call with agreeing arguments creates).
ncclResult_t winCreate(ncclComm* comm, CliqueTag tag, const Ask& ask, size_t bytes, bool zero,
                       Win* w, bool* mapped) {
  *w = Win{};
  *mapped = false;
  ncclResult_t res = memAlloc(&w->ptr, bytes);
  if (res != ncclSuccess) w->ptr = nullptr;
  w->bytes = bytes;
  if (res == ncclSuccess && zero) {
    // A private stream: a device-wide synchronisation could wait for this rank's earlier
    // kernels, which may wait for peers that are about to enter this registration.
    cudaStream_t s = nullptr;
    cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (err == cudaSuccess) err = cudaMemsetAsync(w->ptr, 0, bytes, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (s != nullptr) cudaStreamDestroy(s);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      MK_WARN("fused operator: zeroing %zu bytes of its control block: %s", bytes,
              cudaGetErrorString(err));
      res = ncclUnhandledCudaError;
    }
  }
  std::vector<Ask> asks(comm->nRanks, Ask{});
  asks[comm->rank] = ask;
  asks[comm->rank].allocated = res == ncclSuccess ? 1 : 0;
  const ncclResult_t ag = bootstrapAllGather(comm->bootstrap, asks.data(), sizeof(Ask));
  if (ag != ncclSuccess) {
    (void)winDrop(comm, w);  // this rank's allocation, not registered
    MK_WARN(
        "%s operator's windows (processes layout): rank %d's peers did not all join the "
        "collective creation of %zu bytes (%s); every rank of the comm must make the same "
        "fused calls with the same sizes (the same maxRows for MoE calls)",
        tagName(tag), comm->rank, bytes, ncclGetErrorString(ag));
    return ag;
  }
  bool all = true;
  int differs = -1;
  for (int r = 0; r < comm->nRanks; ++r) {
    all = all && asks[r].allocated == 1;
    if (differs < 0 && (asks[r].ctlBytes != ask.ctlBytes || asks[r].halfBytes != ask.halfBytes))
      differs = r;
  }
  if (differs >= 0) {
    (void)winDrop(comm, w);  // this rank's allocation, not registered
    MK_WARN(
        "%s operator (processes layout): rank %d asks for windows of %llu + 2 x %llu bytes, "
        "rank %d for %llu + 2 x %llu: every rank must pass the same sizes (for MoE calls the "
        "same maxRows, as fused.h requires); nothing was created",
        tagName(tag), comm->rank, (unsigned long long)ask.ctlBytes,
        (unsigned long long)ask.halfBytes, differs, (unsigned long long)asks[differs].ctlBytes,
        (unsigned long long)asks[differs].halfBytes);
    return ncclInvalidArgument;
  }
  if (all) res = peerMemWinRegister(comm, w->ptr, bytes, NCCL_WIN_DEFAULT, &w->win);
  if (!all || res != ncclSuccess) {
    (void)winDrop(comm, w);          // not registered (w->win stays null when that failed)
    return all ? res : ncclSuccess;  // a peer's (or my) allocation failed: sequential path
  }
  uint64_t key = 0, off = 0;
  *mapped = peerMemWinFind(comm, w->ptr, bytes, &key, &off, &w->bases) && off == 0 &&
            (int)w->bases.size() == comm->topo.localRanks;
  return ncclSuccess;
}

}  // namespace

bool procWindowsEligible(const ncclComm* comm, int maxLocal) {
  if (comm->topo.nNodes != 1 || comm->nRanks > std::min(maxLocal, kProcMaxLocal) ||
      comm->nRanks < 2)
    return false;
  const RankInfo& me = comm->peerInfo[comm->rank];
  for (int r = 0; r < comm->nRanks; ++r) {
    const RankInfo& a = comm->peerInfo[r];
    if (a.hostHash != me.hostHash) return false;
    for (int q = r + 1; q < comm->nRanks; ++q)
      if (comm->peerInfo[q].pidHash == a.pidHash) return false;  // two ranks in one process
  }
  return true;
}

ncclResult_t procWindowsGet(ncclComm* comm, CliqueTag tag, size_t ctlBytes, size_t halfBytes,
                            cudaStream_t stream, ProcView* view, bool* ok) {
  *ok = false;
  std::shared_ptr<State> st;
  {
    std::lock_guard<std::mutex> g(gMu);
    auto& s = states()[Key(comm, (int)tag)];
    if (!s) s = std::make_shared<State>();
    st = s;
  }
  std::lock_guard<std::mutex> g(st->mu);
  if (!st->mapped) return ncclSuccess;  // an earlier creation failed somewhere: sequential
  const bool needCtl = st->ctl.ptr == nullptr, needData = st->data.bytes < 2 * halfBytes;
  if (needCtl || needData) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CUDACHECK(cudaStreamIsCapturing(stream, &cap));
    if (cap != cudaStreamCaptureStatusNone) return ncclSuccess;  // sequential path
  }
  const Ask ask{0, 0, ctlBytes, halfBytes};
  if (needCtl) {
    bool mapped = false;
    NCCLCHECK(winCreate(comm, tag, ask, ctlBytes, true, &st->ctl, &mapped));
    st->mapped = st->mapped && mapped;
  }
  if (needData && st->mapped) {
    // Doubling (every rank computes the same size from the same calls): a few growths at most,
    // and the retired regions together stay below the live one.
    const size_t grain = 2u << 20;                      // per half
    size_t half = std::max(halfBytes, st->data.bytes);  // at least twice the old half
    half = (half + grain - 1) / grain * grain;
    Win grown;
    bool mapped = false;
    NCCLCHECK(winCreate(comm, tag, ask, 2 * half, false, &grown, &mapped));
    st->mapped = st->mapped && mapped;
    if (grown.ptr != nullptr) {
      if (st->data.ptr != nullptr) st->retired.push_back(st->data);
      st->data = grown;
    }
  }
  if (!st->mapped) return ncclSuccess;
  for (int r = 0; r < comm->nRanks; ++r) {
    const int l = comm->topo.rankToLocalRank[r];
    view->ctl[r] = st->ctl.bases[l];
    view->data[r] = static_cast<uint8_t*>(st->data.bases[l]);
  }
  view->halfBytes = st->data.bytes / 2;
  *ok = true;
  return ncclSuccess;
}

namespace {
// Removes comm's sets from the registry and hands them over.
std::vector<std::shared_ptr<State>> takeStates(const ncclComm* comm) {
  std::vector<std::shared_ptr<State>> mine;
  std::lock_guard<std::mutex> g(gMu);
  for (auto it = states().begin(); it != states().end();) {
    if (it->first.first == comm) {
      mine.push_back(it->second);
      it = states().erase(it);
    } else {
      ++it;
    }
  }
  return mine;
}
}  // namespace

void procWindowsForget(ncclComm* comm) {
  // The States go, but their Win records do not own memory: the regions stay allocated and
  // mapped.
  (void)takeStates(comm);
}

void procWindowsRelease(ncclComm* comm) {
  for (auto& st : takeStates(comm)) {
    std::lock_guard<std::mutex> g(st->mu);
    winDrop(comm, &st->data);
    for (Win& w : st->retired) winDrop(comm, &w);
    winDrop(comm, &st->ctl);
  }
}

}  // namespace fused
}  // namespace mk
