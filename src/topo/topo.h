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
// Ranks of one comm that are threads of one process on one GPU each launch their kernels on
// their own stream, and those kernels wait for each other. The GPU feeds a process's streams
// through a few hardware queues in submission order (CUDA_DEVICE_MAX_CONNECTIONS, 8 by
// default, at most 32): when two such ranks' streams share a queue, one rank's kernel can sit
// behind a peer's kernel that waits for it, and only the device timeout ends the wait. With
// more such ranks than queues two must share. Under CUDA MPS without the variable, comms of 3
// ranks of one process hung on the H200 where the variable at 32 let them run (session 32),
// though 16 streams of pending 1-thread kernels ran side by side there (session 33's probe):
// the cause under MPS is not established. Pure function of the ranks of
// this process on this GPU (Topo::ranksInMyProcess), whether the device runs under MPS and the
// variable's value (NULL: unset). Returns what to change, or "" when nothing is known to fail:
// without MPS the suites run up to 8 ranks in one process and pass.
constexpr int kDefaultMaxConnections = 8;
constexpr int kMaxConnections = 32;  // CUDA's cap on the variable
std::string topoQueueHint(int ranksInProcess, bool mps, const char* maxConnectionsEnv);
// hwloc: the GPU's NUMA node and the NICs nearest to it (best effort; logged at INFO).
void topoAffinity(int64_t busId, Topo* topo);

}  // namespace mk
