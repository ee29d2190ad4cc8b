#include "comm/agreed.h"

#include <cctype>
#include <cstdio>

#include "base/param.h"

namespace mk {
namespace {

// The list. Left out on purpose: parameters one rank may set alone (timeouts, logging, CTA
// bounds, proxy timing) and those whose peers learn the choice at connection time (socket
// connections and inline mode travel in the socket hello).
constexpr ParamId kAgreed[kAgreedParams] = {
    ParamId::EmulateNodes,  // the (virtual) node map every transport is built on
    ParamId::Algo,          // the AllReduce protocol inside a node
    ParamId::RegZeroCopy,   // zero-copy on registered buffers against staging
    ParamId::FusedAuto,     // ncclFusedAuto: fused kernel against GEMM then collective
    ParamId::MoeNodeDedup,  // the MoE AllToAll path's routes and message layout
};

int64_t strValue(const char* s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (; *s; ++s) {
    h ^= (unsigned char)std::tolower((unsigned char)*s);
    h *= 1099511628211ull;
  }
  return (int64_t)h;
}

bool isStr(ParamId id) {
  const char* t = paramInfo(id).type;
  return t[0] == 'S';
}

}  // namespace

void agreedParamsFill(int64_t out[kAgreedParams]) {
  for (int i = 0; i < kAgreedParams; ++i)
    out[i] = isStr(kAgreed[i]) ? strValue(paramStr(kAgreed[i])) : paramInt(kAgreed[i]);
}

ncclResult_t agreedParamsCheck(const std::vector<RankInfo>& info, int rank, std::string* why) {
  if (rank < 0 || rank >= (int)info.size()) return ncclInternalError;
  const RankInfo& me = info[rank];
  for (int i = 0; i < kAgreedParams; ++i) {
    for (int r = 0; r < (int)info.size(); ++r) {
      if (info[r].agreed[i] == me.agreed[i]) continue;
      const ParamInfo& p = paramInfo(kAgreed[i]);
      char msg[512];
      if (isStr(kAgreed[i]))
        snprintf(msg, sizeof(msg),
                 "%s must be the same on every rank of a communicator: rank %d has \"%s\", rank "
                 "%d another value",
                 p.env, rank, paramStr(kAgreed[i]), r);
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
