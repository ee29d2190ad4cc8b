// ncclGroupStart/End: per-thread nesting; communicator creation and operations issued
// inside a group are deferred to the outermost ncclGroupEnd. The exported entry points
// are in src/api/api_group.cc.
#pragma once
#include <functional>
#include <nccl.h>
#include <vector>

#include "coll/coll.h"

namespace mk {

void groupStart();  // ncclGroupStart: one nesting level more on this thread
// ncclGroupEnd (sim null) or ncclGroupSimulateEnd (sim: fills sim->estimatedTime and launches
// no operation; a bad magic closes the group with ncclInvalidArgument). The outermost level
// runs the deferred comm jobs (also when simulated), then launches the ops.
ncclResult_t groupEnd(ncclSimInfo_t* sim);
bool groupActive();  // this thread is inside ncclGroupStart/End
// Called with the result of every API call that may be deferred to a group: inside a group,
// the first failure is remembered, and the outermost ncclGroupEnd returns it (and discards the
// group's work) as NCCL does. Returns res.
ncclResult_t groupRecordError(ncclResult_t res);
// Comm init/split work to run at group end; each comm's job runs in its own thread, so
// one thread can create several comms of one clique (ncclCommInitRank per GPU in a group).
// checkMode (NCCL's async jobs: init, split, shrink, finalize): a comm whose blocking mode
// differs from the group's comms' gives ncclInvalidArgument and the job is not queued.
// Without it (NCCL's group tasks: window registration) the group just takes comm's mode.
ncclResult_t groupAddCommJob(ncclComm* comm, std::function<ncclResult_t()> fn, bool checkMode);
// A data-movement operation to run at group end.
ncclResult_t groupAddColl(const CollArgs& a);

// Implemented by the collective layer: runs the deferred operations of one group
// (any mix of collectives and send/recv on one or several comms).
ncclResult_t collLaunchGroup(std::vector<CollArgs>& ops);
// Implemented by the collective layer: the model's time estimate (microseconds) for ops.
ncclResult_t collEstimateGroup(const std::vector<CollArgs>& ops, float* usec);

// Runs fn in comm->job; returns once it finished (blocking comms) — the shared path of
// blocking/nonblocking init, split and shrink. Nonblocking: returns ncclInProgress.
ncclResult_t commRunJob(ncclComm* comm, std::function<ncclResult_t()> fn);

}  // namespace mk
