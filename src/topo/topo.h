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
// The most ranks any live comm of this process has placed on the GPU `busId`: topoNoteDevice at
// comm init (after topoCompute), topoForgetDevice when the comm goes (a comm never noted is
// ignored); 0 when none. A comm split from a larger one counts only its own ranks on the GPU,
// but the parent's other ranks may run kernels there at the same time (the other halves of a
// split): persistent kernels that wait for their peers size their grids from this.
void topoNoteDevice(const void* comm, int64_t busId, int ranksOnDevice);
void topoForgetDevice(const void* comm);
int topoMostRanksOnDevice(int64_t busId);
// hwloc: the GPU's NUMA node and the NICs nearest to it (best effort; logged at INFO).
void topoAffinity(int64_t busId, Topo* topo);

}  // namespace mk
