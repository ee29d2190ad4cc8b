// Where ranks live: hosts, processes, GPUs, (virtual) nodes and GPU/NIC/NUMA affinity.
#pragma once
#include <cstdint>
#include <nccl.h>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace mk {

uint64_t hostHash();  // same value for every process of this host (hostname + boot id)
uint64_t pidHash();   // distinct per process of this host (pid + pid namespace)
// Fills this rank's RankInfo (needs comm->cudaDev set; reads the bus id and SM count).
ncclResult_t topoLocalInfo(ncclComm* comm, RankInfo* info);
// Pure function: nodes, local ranks and device sharing from every rank's info.
// emulateNodes > 1 splits the ranks into that many virtual nodes of consecutive ranks.
ncclResult_t topoCompute(const std::vector<RankInfo>& info, int rank, int emulateNodes, Topo* out);
// hwloc: the GPU's NUMA node and the NICs nearest to it (best effort; logged at INFO).
void topoAffinity(int64_t busId, Topo* topo);

}  // namespace mk
