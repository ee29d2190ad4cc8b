#include "api/agreed.h"

#include <cstdio>

#include "base/param.h"
#include "coll/algo.h"

namespace mk {
namespace {

// The list. Left out on purpose: parameters one rank may set alone (timeouts, logging, CTA
// bounds, proxy timing) and those whose peers learn the choice at connection time (socket
// connections and inline mode travel in the socket hello).
constexpr ParamId kAgreed[kAgreedParams] = {
    ParamId::EmulateNodes,       // the (virtual) node map every transport is built on
    ParamId::Algo,               // the AllReduce protocol inside a node
    ParamId::RegZeroCopy,        // zero-copy on registered buffers against staging
    ParamId::FusedAuto,          // ncclFusedAuto: fused kernel against GEMM then collective
    ParamId::MoeNodeDedup,       // the MoE AllToAll path's routes and message layout
    ParamId::FusedXnode,         // AllGatherGemm across nodes: fused kernel against sequential
    ParamId::RingSeqDirect,      // ring attention's sequential path: gathers or staged reads
    ParamId::MoeSwigluEpilogue,  // the MoE layer: fused kernels (they need it) or the AllToAll path
};

// The value the library acts on (see agreedParamsFill).
int64_t effective(ParamId id, int nRanks) {
  if (id == ParamId::Algo) {
    bool ok = false;
    return (int64_t)parseAlgo(paramStr(id), &ok);  // unknown: automatic, as collForcedAlgo
  }
  const int64_t v = paramInt(id);
  if (id == ParamId::EmulateNodes) return v <= 1 ? 0 : (v > nRanks ? nRanks : v);
  return v;
}

}  // namespace

void agreedParamsFill(int nRanks, int64_t out[kAgreedParams]) {
  for (int i = 0; i < kAgreedParams; ++i) out[i] = effective(kAgreed[i], nRanks);
}

ncclResult_t agreedParamsCheck(const std::vector<RankInfo>& info, int rank, std::string* why) {
  if (rank < 0 || rank >= (int)info.size()) return ncclInternalError;
  const RankInfo& me = info[rank];
  for (int i = 0; i < kAgreedParams; ++i) {
    for (int r = 0; r < (int)info.size(); ++r) {
      if (info[r].agreed[i] == me.agreed[i]) continue;
      const ParamInfo& p = paramInfo(kAgreed[i]);
      char msg[512];
      if (kAgreed[i] == ParamId::Algo)
        snprintf(msg, sizeof(msg),
                 "%s must be the same on every rank of a communicator: rank %d has \"%s\" "
                 "(%s), rank %d %s",
                 p.env, rank, paramStr(kAgreed[i]), algoName((Algo)me.agreed[i]), r,
                 algoName((Algo)info[r].agreed[i]));
      else
        snprintf(msg, sizeof(msg),
                 "%s must be the same on every rank of a communicator: rank %d has %lld, rank %d "
                 "has %lld",
                 p.env, rank, (long long)me.agreed[i], r, (long long)info[r].agreed[i]);
      if (why) *why = msg;
      return ncclInvalidUsage;
    }
  }
  return ncclSuccess;
}

}  // namespace mk
