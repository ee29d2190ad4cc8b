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
// consecutive (always true for virtual nodes; checked for real ones).
int lsaBase(const ncclComm* comm) {
  return comm->topo.nodeRanks[comm->topo.node].front();
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
  if (mk::commCheck(comm, "ncclTeamWorld") != ncclSuccess) return ncclTeam_t{0, -1, 0};
  return ncclTeam_t{comm->nRanks, comm->rank, 1};
}

MK_API(ncclTeam_t, ncclTeamLsa, ncclComm_t comm) {
  if (mk::commCheck(comm, "ncclTeamLsa") != ncclSuccess) return ncclTeam_t{0, -1, 0};
  return ncclTeam_t{comm->topo.localRanks, comm->topo.localRank, 1};
}

MK_API(ncclTeam_t, ncclTeamRail, ncclComm_t comm) {
  if (mk::commCheck(comm, "ncclTeamRail") != ncclSuccess) return ncclTeam_t{0, -1, 0};
  return ncclTeam_t{comm->topo.nNodes, comm->topo.node, comm->topo.localRanks};
}

MK_API(int, ncclTeamRankToWorld, ncclComm_t comm, ncclTeam_t team, int rank) {
  if (mk::commCheck(comm, "ncclTeamRankToWorld") != ncclSuccess) return -1;
  return comm->rank + (rank - team.rank) * team.stride;
}

MK_API(int, ncclTeamRankToLsa, ncclComm_t comm, ncclTeam_t team, int rank) {
  if (mk::commCheck(comm, "ncclTeamRankToLsa") != ncclSuccess) return -1;
  int world = comm->rank + (rank - team.rank) * team.stride;
  return world - lsaBase(comm);
}
