// Comm-level side of the channel engine: argument checks, the comm's topology as an XTopo,
// plans (hier_plan.cc) turned into kernel arguments.
#include <cstdint>
#include <string>
#include <vector>

#include "coll/hier.h"
#include "coll/launch.h"
#include "base/checks.h"
#include "comm/comm.h"

namespace mk {
namespace {

XTopo commXTopo(ncclComm* comm) {
  const Topo& t = comm->topo;
  XTopo x;
  x.nRanks = comm->nRanks;
  x.me = comm->rank;
  x.nodeRanks = t.nodeRanks;
  x.node = t.node;
  x.local = t.localRank;
  std::vector<int> sizes;
  for (auto& nr : t.nodeRanks) sizes.push_back((int)nr.size());
  x.even = hierEvenNodes((int)sizes.size(), sizes.data());
  return x;
}

ncclResult_t checkAligned(const void* p, size_t es, const char* api, const char* what) {
  MK_ARGCHECK(es > 0 && (uintptr_t)p % es == 0,
              "nccl%s: %s %p is not aligned to its %zu-byte elements", api, what, p, es);
  return ncclSuccess;
}

// Kernel arguments of one planned launch; the reduction fields come from `red` (or none).
ncclResult_t toArgs(ncclComm* comm, XPlanLaunch& pl, ncclDataType_t dt, const RedOpInfo* red,
                    const char* api, HierLaunch* out) {
  HierXArgs& x = out->x;
  out->kind = HierLaunch::kChannels;
  NCCLCHECK(netDevView(comm, &x.d));
  if (x.d.nSignals < kXSigEnd) {
    MK_WARN("%s: rank %d: %u signal slots, the inter-node paths need %u", api, comm->rank,
            x.d.nSignals, kXSigEnd);
    return ncclInternalError;
  }
  // The zero-copy source area holds the reduce-to-peer scratch ([0, 2 * slotBytes)) and the
  // PreMulSum send scratch (the channel areas' offsets, hier_xfer.cu sendChunk).
  if (!hierChanGeom(x.d.windowBytes, comm->nRanks, &x.areaBase, &x.areaBytes, &x.slotBytes) ||
      2 * x.slotBytes > x.areaBase ||
      x.areaBase + (uint64_t)comm->nRanks * x.areaBytes > x.d.sendUser) {
    MK_WARN("%s: rank %d: the net window (%llu bytes) is too small for %d ranks", api, comm->rank,
            (unsigned long long)x.d.windowBytes, comm->nRanks);
    return ncclInvalidUsage;
  }
  hierAssignPositions(&pl, x.slotBytes);
  std::string bad = hierCheckLaunch(pl, comm->rank);
  if (!bad.empty()) {
    MK_WARN("%s: rank %d: internal plan error: %s", api, comm->rank, bad.c_str());
    return ncclInternalError;
  }
  x.me = comm->rank;
  x.nRanks = comm->nRanks;
  x.dtype = (int)dt;
  if (red)
    hierRedFields(*red, comm->nRanks, &x.red, &x.postDiv, &x.premul, &x.scalarOnDevice,
                  &x.scalarPtr, &x.scalarBits);
  if (pl.noPostDiv) x.postDiv = 0;
  for (int k = 0; k < 2; k++) {
    x.listLen[k] = (int16_t)pl.list[k].size();
    for (size_t j = 0; j < pl.list[k].size(); j++) x.list[k][j] = (int16_t)pl.list[k][j];
  }
  x.nLanes = (int)pl.lanes.size();
  x.nSteps = 0;
  for (int li = 0; li < x.nLanes; li++) {
    const XPlanLane& ln = pl.lanes[li];
    if (x.nSteps + ln.steps.size() > (size_t)kXMaxSteps) {
      MK_WARN("%s: rank %d: more than %d transfers in one launch across nodes; split the group",
              api, comm->rank, kXMaxSteps);
      return ncclInvalidUsage;
    }
    x.lanes[li] = XLane{(uint16_t)x.nSteps, (uint16_t)ln.steps.size(), (uint8_t)ln.interleave};
    for (const XStep& s : ln.steps) x.steps[x.nSteps++] = s;
  }
  return ncclSuccess;
}

// Device-sized AlltoAll (CollArgs::sized): its transfers (the plain lanes of the direct plan:
// sends, receives, the copy to myself) read their sizes on the device.
void sizeSteps(const CollArgs& a, HierXArgs* x) {
  x->sized = a.sized;
  for (int li = 0; li < x->nLanes; li++) {
    if (x->lanes[li].interleave) continue;  // positions were planned from the whole sizes
    for (int i = x->lanes[li].first; i < x->lanes[li].first + x->lanes[li].count; i++) {
      XStep& s = x->steps[i];
      if (s.kind == kXSend || s.kind == kXRecv || s.kind == kXCopy) s.flags |= kXSized;
    }
  }
}

bool isReduction(CollType t) {
  return t == CollType::kAllReduce || t == CollType::kReduce || t == CollType::kReduceScatter;
}

}  // namespace

ncclResult_t hierPlanXColl(ncclComm* comm, const CollArgs& a, std::vector<HierLaunch>* out) {
  const char* api = collName(a.type);
  const size_t es = dtypeSize(a.dtype);
  NCCLCHECK(checkAligned(a.sendbuff, es, api, "sendbuff"));
  NCCLCHECK(checkAligned(a.recvbuff, es, api, "recvbuff"));
  XOp op{a.type, (uint64_t)(uintptr_t)a.sendbuff, (uint64_t)(uintptr_t)a.recvbuff, a.count, es,
         a.root};
  std::vector<XPlanLaunch> plan;
  std::string why = hierPlanColl(commXTopo(comm), op, &plan);
  if (!why.empty()) {
    MK_WARN("nccl%s: rank %d: %s", api, comm->rank, why.c_str());
    return ncclInvalidUsage;
  }
  const bool red = isReduction(a.type);
  for (XPlanLaunch& pl : plan) {
    out->emplace_back();
    NCCLCHECK(
        toArgs(comm, pl, red ? a.dtype : ncclUint8, red ? &a.red : nullptr, api, &out->back()));
    if (a.type == CollType::kAlltoAll && a.sized.on()) sizeSteps(a, &out->back().x);
  }
  MK_INFO(kColl, "nccl%s: rank %d across %d nodes (%s): count %zu, %zu launches", api, comm->rank,
          comm->topo.nNodes, commXTopo(comm).even ? "rail-aligned" : "flat", a.count, plan.size());
  return ncclSuccess;
}

ncclResult_t hierPlanXP2p(ncclComm* comm, const std::vector<CollArgs>& p2p,
                          std::vector<HierLaunch>* out) {
  const char* api = "ncclSend/ncclRecv";
  std::vector<XOp> ops;
  for (const CollArgs& a : p2p) {
    const size_t es = dtypeSize(a.dtype);
    const bool isSend = a.type == CollType::kSend;
    NCCLCHECK(checkAligned(isSend ? a.sendbuff : a.recvbuff, es, api, "buffer"));
    ops.push_back(XOp{a.type, (uint64_t)(uintptr_t)a.sendbuff, (uint64_t)(uintptr_t)a.recvbuff,
                      a.count, es, a.root});
  }
  std::vector<XPlanLaunch> plan;
  std::string why = hierPlanP2p(commXTopo(comm), ops, &plan);
  if (!why.empty()) {
    MK_WARN("%s: rank %d: %s", api, comm->rank, why.c_str());
    return ncclInvalidUsage;
  }
  for (XPlanLaunch& pl : plan) {
    out->emplace_back();
    NCCLCHECK(toArgs(comm, pl, ncclUint8, nullptr, api, &out->back()));
  }
  return ncclSuccess;
}

}  // namespace mk
