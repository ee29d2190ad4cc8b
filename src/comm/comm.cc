#include "comm/comm.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_set>

#include "base/checks.h"

namespace mk {
namespace {
struct Registry {
  std::mutex mu;
  std::unordered_set<const ncclComm*> live;
};
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}
}  // namespace

void commRegister(ncclComm* comm) {
  std::lock_guard<std::mutex> g(registry().mu);
  registry().live.insert(comm);
}

void commUnregister(ncclComm* comm) {
  std::lock_guard<std::mutex> g(registry().mu);
  registry().live.erase(comm);
}

int commMostRanksOnDevice(int64_t busId) {
  std::lock_guard<std::mutex> g(registry().mu);
  int most = 0;
  for (const ncclComm* c : registry().live) {
    // Topology and peer info are written by init before it leaves kInitializing, and never after.
    CommState st = c->state.load();
    if (st == CommState::kInitializing || st == CommState::kFailed ||
        (int)c->peerInfo.size() <= c->rank || c->rank < 0)
      continue;
    if (c->peerInfo[c->rank].busId == busId) most = std::max(most, c->topo.ranksOnMyDevice);
  }
  return most;
}

ncclResult_t commCheck(const ncclComm* comm, const char* api) {
  MK_ARGCHECK(comm != nullptr, "%s: comm is NULL", api);
  {
    std::lock_guard<std::mutex> g(registry().mu);
    MK_ARGCHECK(registry().live.count(comm) != 0,
                "%s: invalid communicator %p (destroyed, aborted or never created)", api,
                (const void*)comm);
  }
  MK_ARGCHECK(comm->magic == kCommMagic && comm->magicEnd == kCommMagic,
              "%s: communicator %p is corrupted (bad magic words)", api, (const void*)comm);
  return ncclSuccess;
}

ncclResult_t commCheckInitDone(ncclComm* comm, const char* api) {
  CommState st = comm->state.load();
  if (st != CommState::kInitializing && st != CommState::kFailed) return ncclSuccess;
  // As NCCL's ncclCommEnsureReady: a failed init reports its own error, one still running
  // is a misuse of the argument (the caller did not wait for ncclSuccess).
  int ar = comm->asyncResult.load();
  if (ar != ncclSuccess && ar != ncclInProgress) {
    std::string msg;
    {
      std::lock_guard<std::mutex> g(comm->asyncMu);
      msg = comm->asyncMsg;
    }
    MK_WARN("%s: communicator initialization failed (error %d): %s", api, ar, msg.c_str());
    return static_cast<ncclResult_t>(ar);
  }
  MK_WARN(
      "%s: communicator is still initializing: wait until ncclCommGetAsyncError returns "
      "ncclSuccess",
      api);
  return ncclInvalidArgument;
}

ncclResult_t commCheckReady(ncclComm* comm, const char* api) {
  switch (comm->state.load()) {
    case CommState::kReady:
      return ncclSuccess;
    case CommState::kInitializing:
    case CommState::kFailed: {
      ncclResult_t res = commCheckInitDone(comm, api);
      if (res != ncclSuccess) return res;
      // The init finished between the two loads.
      return commCheckReady(comm, api);
    }
    case CommState::kFinalized:
      MK_WARN("%s: communicator was finalized", api);
      return ncclInvalidUsage;
    case CommState::kRevoked:
      MK_WARN("%s: communicator was revoked", api);
      return ncclInvalidUsage;
    default:
      MK_WARN("%s: communicator is in an error state (see ncclCommGetAsyncError)", api);
      return ncclInvalidUsage;
  }
}

void commSetAsyncError(ncclComm* comm, ncclResult_t res, const char* msg) {
  std::lock_guard<std::mutex> g(comm->asyncMu);
  int cur = comm->asyncResult.load();
  if (cur == ncclSuccess || cur == ncclInProgress) {
    comm->asyncResult.store(res);
    comm->asyncMsg = msg ? msg : "";
  }
}

}  // namespace mk
