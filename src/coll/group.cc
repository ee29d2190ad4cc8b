#include "coll/group.h"

#include <functional>
#include <string>
#include <thread>
#include <vector>
#include <utility>

#include "base/checks.h"
#include "base/guard.h"
#include "comm/comm.h"

namespace mk {
namespace {
struct CommJob {
  ncclComm* comm;
  std::function<ncclResult_t()> fn;
};
struct GroupState {
  int depth = 0;
  ncclResult_t error = ncclSuccess;  // first error of a call inside the group
  std::string errorMsg;              // its message (later warnings overwrite the last error)
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

ncclResult_t groupRecordError(ncclResult_t res) {
  if (res != ncclSuccess && res != ncclInProgress && tls.depth > 0 && tls.error == ncclSuccess) {
    tls.error = res;
    tls.errorMsg = lastError();
  }
  return res;
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

void groupStart() {
  tls.depth++;
}

ncclResult_t groupEnd(ncclSimInfo_t* sim) {
  if (tls.depth == 0) {
    MK_WARN("ncclGroupEnd: not in a group (unmatched ncclGroupEnd)");
    return ncclInvalidUsage;
  }
  if (--tls.depth > 0) return ncclSuccess;  // as in NCCL: errors surface at the outermost end
  std::vector<CommJob> jobs = std::move(tls.jobs);
  std::vector<CollArgs> ops = std::move(tls.ops);
  tls.jobs.clear();
  tls.ops.clear();
  ncclResult_t err = tls.error;
  std::string errMsg = std::move(tls.errorMsg);
  tls.error = ncclSuccess;
  tls.errorMsg.clear();
  if (err != ncclSuccess) {
    // A call inside the group failed: as NCCL, return its error and run none of the group's
    // work (the other ranks' parts of it cannot be matched any more). Communicators whose
    // init was deferred here never start it: they carry the error, to be destroyed.
    for (auto& j : jobs)
      commSetAsyncError(j.comm, err, "not initialized: a call in its group failed");
    MK_WARN(
        "%s: a call inside the group failed (error %d); %zu operations and %zu communicator "
        "inits of the group were not run: %s",
        sim ? "ncclGroupSimulateEnd" : "ncclGroupEnd", (int)err, ops.size(), jobs.size(),
        errMsg.c_str());
    return err;
  }
  if (sim) {
    float us = 0;
    NCCLCHECK(collEstimateGroup(ops, &us));
    sim->estimatedTime = us;
    return ncclSuccess;
  }
  // All comm jobs start before any is waited for: they are ranks of one clique.
  bool anyNonblocking = false;
  for (auto& j : jobs) {
    startJob(j.comm, std::move(j.fn));
    anyNonblocking |= !j.comm->config.blocking;
  }
  ncclResult_t res = ncclSuccess;
  if (anyNonblocking) {
    res = jobs.empty() ? ncclSuccess : ncclInProgress;
  } else {
    for (auto& j : jobs) {
      ncclResult_t r = joinJob(j.comm);
      if (res == ncclSuccess) res = r;
    }
  }
  if (!ops.empty()) {
    ncclResult_t r = apiGuard("ncclGroupEnd", [&] { return collLaunchGroup(ops); });
    if (r != ncclSuccess && (res == ncclSuccess || res == ncclInProgress)) res = r;
  }
  return res;
}

}  // namespace mk
