// Parameters that every rank of a communicator must set alike. Each rank's values travel in
// its RankInfo (the init allgather); a mismatch would make ranks run different protocols
// (other virtual nodes, another AllReduce algorithm, fused against sequential, another MoE
// route), which ends in a timeout at best. Init compares them and refuses a mismatch.
#pragma once
#include <cstdint>
#include <nccl.h>
#include <string>
#include <vector>

#include "comm/comm.h"  // RankInfo, kAgreedParams

namespace mk {

// This process's values, in RankInfo::agreed order, as the library will use them for a comm of
// nRanks ranks (so that equal behaviour is never refused): MKERNEL_ALGO as the algorithm it
// parses to ("one-shot" = "oneshot", "auto" = unset, an unknown word = automatic, as at call
// time), MKERNEL_EMULATE_NODES as the node count topoCompute builds (0 = 1 = none, capped at
// nRanks). The values compared are those read at init: the parameters read at call time
// (MKERNEL_ALGO, MKERNEL_FUSED_AUTO, MKERNEL_MOE_NODE_DEDUP,
// MKERNEL_FUSED_XNODE) escape the check when changed later.
void agreedParamsFill(int nRanks, int64_t out[kAgreedParams]);

// ncclSuccess when every rank's values equal this rank's; otherwise ncclInvalidUsage with
// *why naming the first differing parameter, this rank's setting and a rank that differs.
// Every rank sees the same table, so all of them refuse together (none waits for another).
ncclResult_t agreedParamsCheck(const std::vector<RankInfo>& info, int rank, std::string* why);

}  // namespace mk
