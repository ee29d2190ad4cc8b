// ncclCommWindowRegister / ncclCommWindowDeregister (transport/peer_mem_win.h).
//
// Registration is collective: every rank of the comm calls it, in the same order. As in
// NCCL, inside ncclGroupStart/End it is deferred to ncclGroupEnd (the handle is written
// then), so that one thread can register the windows of several ranks (nccl-tests -R 2
// with -g N); on a nonblocking comm outside a group it runs in the background and returns
// ncclInProgress (the handle is valid once ncclCommGetAsyncError says ncclSuccess).
// Deregistration is local. As in NCCL, a NULL buffer or size 0 (register) and a NULL window
// (deregister) are no-ops that succeed.
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>
#include <nccl.h>

#include "api/api.h"
#include "base/checks.h"
#include "coll/coll.h"
#include "coll/group.h"
#include "comm/comm.h"
#include "transport/peer_mem_win.h"

using namespace mk;

namespace {

struct Pending {
  void* buff;
  size_t size;
  int flags;
  ncclWindow_t* win;
};

// The registrations of one comm deferred to one ncclGroupEnd, run in order by ONE comm
// job: with a job per registration, the second would first join the comm's first job,
// which waits for peers whose jobs the same ncclGroupEnd has not started yet.
struct Batch {
  std::mutex mu;
  bool started = false;
  std::vector<Pending> items;
};

std::mutex gBatchMu;
// The open batch of each comm. The job's closure owns the batch: once the job has run, or
// the group was discarded (a failed call inside it), the entry expires.
std::map<ncclComm*, std::weak_ptr<Batch>>& openBatches() {
  static auto* m = new std::map<ncclComm*, std::weak_ptr<Batch>>();
  return *m;
}

ncclResult_t runBatch(ncclComm* comm, const std::shared_ptr<Batch>& b) {
  std::vector<Pending> items;
  {
    std::lock_guard<std::mutex> g(b->mu);
    b->started = true;
    items.swap(b->items);
  }
  // Every failure is agreed by all ranks or breaks the comm: stopping at the first one
  // keeps the ranks' registrations in step.
  for (const Pending& p : items)
    NCCLCHECK(peerMemWinRegister(comm, p.buff, p.size, p.flags, p.win));
  return ncclSuccess;
}

ncclResult_t deferToGroup(ncclComm* comm, const Pending& p) {
  std::shared_ptr<Batch> b;
  {
    std::lock_guard<std::mutex> g(gBatchMu);
    auto& m = openBatches();
    for (auto it = m.begin(); it != m.end();) it = it->second.expired() ? m.erase(it) : ++it;
    auto it = m.find(comm);
    if (it != m.end()) b = it->second.lock();
    if (b) {
      std::lock_guard<std::mutex> g2(b->mu);
      if (!b->started) {
        b->items.push_back(p);
        return ncclSuccess;
      }
    }
    b = std::make_shared<Batch>();
    b->items.push_back(p);
    m[comm] = b;
  }
  // NCCL queues registrations as group tasks, which take the comm's blocking mode unchecked.
  return groupAddCommJob(
      comm, [comm, b] { return runBatch(comm, b); }, false);
}

ncclResult_t windowRegister(ncclComm* comm, void* buff, size_t size, ncclWindow_t* win, int flags) {
  MK_ARGCHECK(win != nullptr, "ncclCommWindowRegister: win is NULL");
  *win = nullptr;
  // As NCCL: nothing to register is no error (and not collective: no rank waits for this one).
  if (buff == nullptr || size == 0) return ncclSuccess;
  NCCLCHECK(commCheckReady(comm, "ncclCommWindowRegister"));
  // Checked now, on the caller's thread: a bad buffer is reported by this call, not by a
  // background job (which would leave the comm in an error state).
  NCCLCHECK(peerMemWinCheck(comm, buff, size, flags));
  if (groupActive()) return deferToGroup(comm, Pending{buff, size, flags, win});
  if (!comm->config.blocking)
    return commRunJob(comm, [=] { return peerMemWinRegister(comm, buff, size, flags, win); });
  return peerMemWinRegister(comm, buff, size, flags, win);
}

}  // namespace

MK_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void* buff, size_t size,
       ncclWindow_t* win, int winFlags) {
  NCCLCHECK(groupRecordError(commCheck(comm, "ncclCommWindowRegister")));
  return groupRecordError(apiGuard(
      "ncclCommWindowRegister", [&] { return windowRegister(comm, buff, size, win, winFlags); }));
}

MK_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win) {
  if (win == nullptr) return ncclSuccess;  // as NCCL, before looking at comm
  NCCLCHECK(commCheck(comm, "ncclCommWindowDeregister"));
  return apiGuard("ncclCommWindowDeregister", [&]() -> ncclResult_t {
    // Kernels of this comm may still read the peers' windows through the mappings about to
    // go: wait for the comm's issued work first (bounded, as finalize waits). If that
    // fails, keep the window: a leak is better than a fault in a running kernel.
    ncclResult_t r = collFinalize(comm);
    if (r != ncclSuccess) {
      MK_WARN(
          "ncclCommWindowDeregister: rank %d: the comm's operations did not finish (error "
          "%d); the window stays registered",
          comm->rank, (int)r);
      return r;
    }
    return peerMemWinDeregister(comm, win);
  });
}
