// Communicator creation and teardown internals shared by the lifecycle API.
#pragma once
#include <nccl.h>
#include <vector>

#include "comm/comm.h"

namespace mk {

// Allocates and registers a comm for cudaDev (abort flag in mapped pinned memory).
ncclResult_t commAlloc(int cudaDev, const Config& cfg, int rank, int nRanks, ncclComm** out);
// The collective part of init once comm->bootstrap exists: exchange rank info, topology,
// peer memory, collective state, a final barrier. Runs in the comm's job.
ncclResult_t commSetup(ncclComm* comm);
// Joins a job, tears everything down in reverse order, poisons and frees the comm.
ncclResult_t commFree(ncclComm* comm);
// Stops device work (abort flag) and waits for it, bounded; the bootstrap stays usable.
ncclResult_t commStopDeviceWork(ncclComm* comm);

// ncclCommInitRank/Config/Scalable share this path.
ncclResult_t commInitRank(ncclComm_t* newcomm, int nranks, const ncclUniqueId* ids, int nIds,
                          int rank, const ncclConfig_t* config, const char* api);
// ncclCommSplit (color may be NCCL_SPLIT_NOCOLOR) and ncclCommShrink.
ncclResult_t commSplit(ncclComm* parent, int color, int key, ncclComm_t* newcomm,
                       const ncclConfig_t* config);
ncclResult_t commShrink(ncclComm* parent, const int* exclude, int nExclude, ncclComm_t* newcomm,
                        const ncclConfig_t* config, int flags);

}  // namespace mk
