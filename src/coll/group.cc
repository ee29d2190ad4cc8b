#include "coll/group.h"

#include <algorithm>
#include <cstring>
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
  // NCCL's ncclGroupBlocking: the blocking mode of the group's comms (-1: none yet). A comm
  // job of the other mode is refused; a collective sets it without a check, as in NCCL.
  int blocking = -1;
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
    if (res != ncclSuccess) {
      commSetAsyncError(comm, res, lastError());
      // An init (or split/shrink) that failed: calls on the comm report this error instead
      // of waiting for an init that will not finish.
      CommState init = CommState::kInitializing;
      comm->state.compare_exchange_strong(init, CommState::kFailed);
    }
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

ncclResult_t groupAddCommJob(ncclComm* comm, std::function<ncclResult_t()> fn, bool checkMode) {
  int mode = comm->config.blocking ? 1 : 0;
  if (checkMode && tls.blocking != -1 && tls.blocking != mode) {
    // One group end either waits for its jobs or returns ncclInProgress: it cannot do both.
    MK_WARN("Blocking and nonblocking communicators are not allowed in the same group");
    return ncclInvalidArgument;
  }
  tls.blocking = mode;
  tls.jobs.push_back({comm, std::move(fn)});
  return ncclSuccess;
}

ncclResult_t groupAddColl(const CollArgs& a) {
  if (a.comm) tls.blocking = a.comm->config.blocking ? 1 : 0;
  tls.ops.push_back(a);
  return ncclSuccess;
}

ncclResult_t commRunJob(ncclComm* comm, std::function<ncclResult_t()> fn) {
  if (groupActive()) return groupAddCommJob(comm, std::move(fn), true);
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
  tls.blocking = -1;
  ncclResult_t err = tls.error;
  std::string errMsg = std::move(tls.errorMsg);
  tls.error = ncclSuccess;
  tls.errorMsg.clear();
  const char* api = sim ? "ncclGroupSimulateEnd" : "ncclGroupEnd";
  // As NCCL: read the bytes of simInfo that the caller's and our layout share (an older,
  // shorter struct is accepted), and refuse it only for its magic, after the group is closed.
  ncclSimInfo_t simInfo = NCCL_SIM_INFO_INITIALIZER;
  size_t simSize = 0;
  if (sim && err == ncclSuccess) {
    simInfo.magic = 0;
    memcpy(&simSize, &sim->size, sizeof(simSize));
    simSize = std::min(simSize, sizeof(simInfo));
    memcpy(&simInfo, sim, simSize);
    if (simInfo.magic != 0x74685283u) {
      err = ncclInvalidArgument;
      MK_WARN("ncclGroupSimulateEnd: simInfo not initialized with NCCL_SIM_INFO_INITIALIZER");
      errMsg = lastError();
    }
  }
  if (err != ncclSuccess) {
    // A call inside the group failed: as NCCL, return its error and run none of the group's
    // work (the other ranks' parts of it cannot be matched any more). Communicators whose
    // init was deferred here never start it: they carry the error, to be destroyed.
    for (auto& j : jobs) {
      commSetAsyncError(j.comm, err, "not initialized: a call in its group failed");
      CommState init = CommState::kInitializing;
      j.comm->state.compare_exchange_strong(init, CommState::kFailed);
    }
    MK_WARN(
        "%s: a call inside the group failed (error %d); %zu operations and %zu communicator "
        "jobs of the group were not run: %s",
        api, (int)err, ops.size(), jobs.size(), errMsg.c_str());
    return err;
  }
  // All comm jobs start before any is waited for: they are ranks of one clique. A simulated
  // end runs them too (as NCCL: only the launch of the operations is simulated), or the
  // comms they create would stay initializing forever.
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
  if (sim) {
    if (res == ncclSuccess || res == ncclInProgress) {
      float us = 0;
      NCCLCHECK(collEstimateGroup(ops, &us));
      simInfo.estimatedTime = us;
      memcpy(sim, &simInfo, simSize);
    }
    return res;
  }
  if (!ops.empty()) {
    ncclResult_t r = apiGuard("ncclGroupEnd", [&] { return collLaunchGroup(ops); });
    if (r != ncclSuccess && (res == ncclSuccess || res == ncclInProgress)) res = r;
  }
  return res;
}

}  // namespace mk
