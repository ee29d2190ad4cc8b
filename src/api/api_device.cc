// The NCCL device API's host functions. mkernel does not provide the NCCL device API
// (device communicators, GIN, LSA barriers, LL all-to-all): those calls refuse with
// ncclInvalidUsage and a message. Team arithmetic is plain host math over the comm's
// topology, so it is implemented.
#include <cstddef>
#include <cstdint>
#include <nccl_device.h>

#include "api/api.h"
#include "base/checks.h"
#include "comm/comm.h"

namespace {
ncclResult_t unsupported(const char* api) {
  MK_WARN("%s: mkernel does not provide the NCCL device API", api);
  return ncclInvalidUsage;
}
// Ranks of one node are contiguous in mkernel's LSA team only when the node's ranks are
// consecutive (always true for virtual nodes; checked for real ones). -1 when the topology
// does not hold this rank's node (a comm that never finished its init has none).
int lsaBase(const ncclComm* comm) {
  const mk::Topo& t = comm->topo;
  if (t.node < 0 || t.node >= (int)t.nodeRanks.size() || t.nodeRanks[t.node].empty()) return -1;
  return t.nodeRanks[t.node].front();
}
// The team queries read what the init job writes: only once it finished (and succeeded).
bool usable(ncclComm_t comm, const char* api) {
  return mk::commCheck(comm, api) == ncclSuccess && mk::commCheckInitDone(comm, api) == ncclSuccess;
}
}  // namespace

MK_API(ncclResult_t, ncclDevCommCreate, ncclComm_t comm, ncclDevCommRequirements_t const* reqs,
       ncclDevComm_t* outDevComm) {
  return unsupported("ncclDevCommCreate");
}

MK_API(ncclResult_t, ncclDevCommDestroy, ncclComm_t comm, ncclDevComm_t const* devComm) {
  return unsupported("ncclDevCommDestroy");
}

MK_API(ncclResult_t, ncclGinBarrierCreateRequirement, ncclComm_t comm, ncclTeam_t team,
       int nBarriers, ncclGinBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq) {
  return unsupported("ncclGinBarrierCreateRequirement");
}

MK_API(ncclResult_t, ncclLsaBarrierCreateRequirement, ncclTeam_t team, int nBarriers,
       ncclLsaBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq) {
  return unsupported("ncclLsaBarrierCreateRequirement");
}

MK_API(ncclResult_t, ncclLLA2ACreateRequirement, int nBlocks, int nSlots,
       ncclLLA2AHandle_t* outHandle, ncclDevResourceRequirements_t* outReq) {
  return unsupported("ncclLLA2ACreateRequirement");
}

MK_API(int, ncclLLA2ACalcSlots, int maxElts, int maxEltSize) {
  unsupported("ncclLLA2ACalcSlots");
  return -1;  // no slot count exists without the device API; -1 is refused downstream
}

MK_API(ncclTeam_t, ncclTeamWorld, ncclComm_t comm) {
  if (!usable(comm, "ncclTeamWorld")) return ncclTeam_t{0, -1, 0};
  return ncclTeam_t{comm->nRanks, comm->rank, 1};
}

MK_API(ncclTeam_t, ncclTeamLsa, ncclComm_t comm) {
  if (!usable(comm, "ncclTeamLsa")) return ncclTeam_t{0, -1, 0};
  return ncclTeam_t{comm->topo.localRanks, comm->topo.localRank, 1};
}

MK_API(ncclTeam_t, ncclTeamRail, ncclComm_t comm) {
  if (!usable(comm, "ncclTeamRail")) return ncclTeam_t{0, -1, 0};
  return ncclTeam_t{comm->topo.nNodes, comm->topo.node, comm->topo.localRanks};
}

MK_API(int, ncclTeamRankToWorld, ncclComm_t comm, ncclTeam_t team, int rank) {
  if (!usable(comm, "ncclTeamRankToWorld")) return -1;
  return comm->rank + (rank - team.rank) * team.stride;
}

MK_API(int, ncclTeamRankToLsa, ncclComm_t comm, ncclTeam_t team, int rank) {
  if (!usable(comm, "ncclTeamRankToLsa")) return -1;
  int base = lsaBase(comm);
  if (base < 0) {
    MK_WARN("ncclTeamRankToLsa: rank %d: the communicator has no topology", comm->rank);
    return -1;
  }
  int world = comm->rank + (rank - team.rank) * team.stride;
  return world - base;
}
