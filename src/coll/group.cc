#include "coll/group.h"

#include <functional>
#include <thread>
#include <vector>
#include <utility>

#include "api/api.h"
#include "base/checks.h"
#include "comm/comm.h"

namespace mk {
namespace {
struct CommJob {
  ncclComm* comm;
  std::function<ncclResult_t()> fn;
};
struct GroupState {
  int depth = 0;
  ncclResult_t error = ncclSuccess;  // first error recorded inside the group
  std::vector<CommJob> jobs;
  std::vector<CollArgs> ops;
};
thread_local GroupState tls;

void startJob(ncclComm* comm, std::function<ncclResult_t()> fn) {
  if (comm->job.joinable()) comm->job.join();  // a finished earlier job on this comm
  comm->asyncResult.store(ncclInProgress);
  comm->job = std::thread([comm, fn = std::move(fn)] {
    logSetThreadDevice(comm->cudaDev);
    ncclResult_t res = ncclInternalError;
    try {
      res = fn();
    } catch (const std::exception& e) {
      MK_WARN("communicator job failed: %s", e.what());
    }
    if (res != ncclSuccess) commSetAsyncError(comm, res, lastError());
    // Keep an earlier asynchronous error; otherwise publish the job's result.
    int expected = ncclInProgress;
    comm->asyncResult.compare_exchange_strong(expected, res);
  });
}

ncclResult_t joinJob(ncclComm* comm) {
  if (comm->job.joinable()) comm->job.join();
  return static_cast<ncclResult_t>(comm->asyncResult.load());
}
}  // namespace

bool groupActive() {
  return tls.depth > 0;
}

ncclResult_t groupAddCommJob(ncclComm* comm, std::function<ncclResult_t()> fn) {
  tls.jobs.push_back({comm, std::move(fn)});
  return ncclSuccess;
}

ncclResult_t groupAddColl(const CollArgs& a) {
  tls.ops.push_back(a);
  return ncclSuccess;
}

ncclResult_t commRunJob(ncclComm* comm, std::function<ncclResult_t()> fn) {
  if (groupActive()) return groupAddCommJob(comm, std::move(fn));
  startJob(comm, std::move(fn));
  if (!comm->config.blocking) return ncclInProgress;
  return joinJob(comm);
}

}  // namespace mk

using mk::tls;

MK_API(ncclResult_t, ncclGroupStart) {
  tls.depth++;
  return ncclSuccess;
}

namespace {
ncclResult_t groupEndImpl(ncclSimInfo_t* sim) {
  if (tls.depth == 0) {
    MK_WARN("ncclGroupEnd: not in a group (unmatched ncclGroupEnd)");
    return ncclInvalidUsage;
  }
  if (--tls.depth > 0) return ncclSuccess;
  std::vector<mk::CommJob> jobs = std::move(tls.jobs);
  std::vector<mk::CollArgs> ops = std::move(tls.ops);
  tls.jobs.clear();
  tls.ops.clear();
  if (sim) {
    float us = 0;
    NCCLCHECK(mk::collEstimateGroup(ops, &us));
    sim->estimatedTime = us;
    return ncclSuccess;
  }
  // All comm jobs start before any is waited for: they are ranks of one clique.
  bool anyNonblocking = false;
  for (auto& j : jobs) {
    mk::startJob(j.comm, std::move(j.fn));
    anyNonblocking |= !j.comm->config.blocking;
  }
  ncclResult_t res = ncclSuccess;
  if (anyNonblocking) {
    res = jobs.empty() ? ncclSuccess : ncclInProgress;
  } else {
    for (auto& j : jobs) {
      ncclResult_t r = mk::joinJob(j.comm);
      if (res == ncclSuccess) res = r;
    }
  }
  if (!ops.empty()) {
    ncclResult_t r = mk::apiGuard("ncclGroupEnd", [&] { return mk::collLaunchGroup(ops); });
    if (r != ncclSuccess && (res == ncclSuccess || res == ncclInProgress)) res = r;
  }
  return res;
}
}  // namespace

MK_API(ncclResult_t, ncclGroupEnd) {
  return groupEndImpl(nullptr);
}

MK_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t* simInfo) {
  MK_ARGCHECK(simInfo != nullptr, "ncclGroupSimulateEnd: simInfo is NULL");
  MK_ARGCHECK(simInfo->magic == 0x74685283u && simInfo->size >= sizeof(ncclSimInfo_t),
              "ncclGroupSimulateEnd: simInfo not initialised with NCCL_SIM_INFO_INITIALIZER");
  return groupEndImpl(simInfo);
}
