// Parameters that every rank of a communicator must set alike. Each rank's values travel in
// its RankInfo (the init allgather); a mismatch would make ranks run different protocols
// (other virtual nodes, another AllReduce algorithm, fused against sequential, another MoE
// route), which ends in a timeout at best. Init compares them and refuses a mismatch.
#pragma once
#include <cstdint>
#include <nccl.h>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace mk {

// This process's values, in RankInfo::agreed order (strings as a hash of their lower-case
// text, so "Ring" and "ring" agree).
void agreedParamsFill(int64_t out[kAgreedParams]);

// ncclSuccess when every rank's values equal this rank's; otherwise ncclInvalidUsage with
// *why naming the first differing parameter, this rank's setting and a rank that differs.
// Every rank sees the same table, so all of them refuse together (none waits for another).
ncclResult_t agreedParamsCheck(const std::vector<RankInfo>& info, int rank, std::string* why);

}  // namespace mk
