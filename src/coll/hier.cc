// Host side of the hierarchical (inter-node) AllReduce: topology check, planning, launch
// arguments. See hier.h for the scheme.
#include "coll/hier.h"

#include <cstdint>
#include <vector>
#include <algorithm>
#include <string>

#include "coll/coll_state.h"
#include "coll/launch.h"
#include "coll/redop.h"
#include "base/checks.h"
#include "comm/comm.h"

namespace mk {

std::string hierTopoProblem(int nNodes, const int* nodeSizes) {
  if (nNodes < 2) return "the comm does not span several nodes";
  int total = 0;
  for (int b = 0; b < nNodes; b++) {
    if (nodeSizes[b] < 1) return "node " + std::to_string(b) + " has no ranks";
    total += nodeSizes[b];
  }
  if (total > kXMaxRanks)
    return std::to_string(total) + " ranks across nodes; at most " + std::to_string(kXMaxRanks) +
           " are supported";
  return std::string();
}

bool hierEvenNodes(int nNodes, const int* nodeSizes) {
  if (nNodes < 2 || nNodes > kHierMaxNodes) return false;
  if (nodeSizes[0] < 1 || nodeSizes[0] > kHierMaxLocal) return false;
  for (int b = 1; b < nNodes; b++)
    if (nodeSizes[b] != nodeSizes[0]) return false;
  return true;
}

uint64_t hierStride(uint64_t windowBytes, int nLocal, int nNodes, size_t esize) {
  if (nLocal < 1 || nNodes < 1 || esize == 0) return 0;
  uint64_t s = windowBytes / (kHierBanks * (uint64_t)(2 * nLocal + nNodes));
  s &= ~(uint64_t)255;
  return s < esize ? 0 : s;
}

namespace {

std::vector<int> nodeSizes(ncclComm* comm) {
  const Topo& t = comm->topo;
  std::vector<int> sizes(t.nNodes > 0 ? t.nNodes : 1, 0);
  for (int b = 0; b < t.nNodes && b < (int)t.nodeRanks.size(); b++)
    sizes[b] = (int)t.nodeRanks[b].size();
  return sizes;
}

std::string commTopoProblem(ncclComm* comm) {
  return hierTopoProblem(comm->topo.nNodes, nodeSizes(comm).data());
}

bool commEven(ncclComm* comm) {
  return hierEvenNodes(comm->topo.nNodes, nodeSizes(comm).data());
}

}  // namespace

ncclResult_t hierUsable(ncclComm* comm, const char* api) {
  std::string why = commTopoProblem(comm);
  if (!why.empty()) {
    MK_WARN("%s: rank %d: %s", api, comm->rank, why.c_str());
    return ncclInvalidUsage;
  }
  if (comm->net == nullptr) {
    MK_WARN("%s: rank %d: the comm spans %d nodes but has no inter-node state", api, comm->rank,
            comm->topo.nNodes);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

void hierRedFields(const RedOpInfo& info, int nRanks, int* red, int* postDiv, int* premul,
                   int* scalarOnDevice, const void** scalarPtr, uint64_t* scalarBits) {
  *postDiv = *premul = *scalarOnDevice = 0;
  *scalarPtr = nullptr;
  *scalarBits = 0;
  switch (info.builtin) {
    case ncclSum:
      *red = kRedSum;
      break;
    case ncclProd:
      *red = kRedProd;
      break;
    case ncclMax:
      *red = kRedMax;
      break;
    case ncclMin:
      *red = kRedMin;
      break;
    case ncclAvg:
      *red = kRedSum;
      *postDiv = nRanks;
      break;
    default:  // PreMulSum
      *red = kRedSum;
      *premul = 1;
      *scalarOnDevice = info.scalarOnDevice ? 1 : 0;
      *scalarPtr = info.scalarPtr;
      *scalarBits = info.scalarBits;
      break;
  }
}

ncclResult_t hierPlan(ncclComm* comm, const CollArgs& a, HierArgs* out, bool* empty) {
  const char* api = collName(a.type);
  NCCLCHECK(hierUsable(comm, api));
  const size_t es = dtypeSize(a.dtype);
  const RedOpInfo& info = a.red;  // resolved at call time (the op may be destroyed by now)
  MK_ARGCHECK((uintptr_t)a.sendbuff % es == 0,
              "nccl%s: sendbuff %p is not aligned to its %zu-byte elements", api, a.sendbuff, es);
  MK_ARGCHECK((uintptr_t)a.recvbuff % es == 0,
              "nccl%s: recvbuff %p is not aligned to its %zu-byte elements", api, a.recvbuff, es);
  *empty = a.count == 0;
  if (*empty) return ncclSuccess;
  const Topo& t = comm->topo;
  HierArgs& h = *out;
  h = HierArgs{};
  NCCLCHECK(netDevView(comm, &h.d));
  h.node = t.node;
  h.nNodes = t.nNodes;
  h.local = t.localRank;
  h.nLocal = t.localRanks;
  h.stride = hierStride(h.d.windowBytes / 2, h.nLocal, h.nNodes, es);
  if (h.stride == 0) {
    MK_WARN("nccl%s: rank %d: the net window (%llu bytes) is too small for %d x %d ranks", api,
            comm->rank, (unsigned long long)h.d.windowBytes, t.nNodes, t.localRanks);
    return ncclInvalidUsage;
  }
  if (h.d.nSignals < kHierSigEnd) {
    MK_WARN("nccl%s: rank %d: %u signal slots, the hierarchical path needs %u", api, comm->rank,
            h.d.nSignals, kHierSigEnd);
    return ncclInternalError;
  }
  for (int j = 0; j < h.nLocal; j++) h.localPeer[j] = (int16_t)t.nodeRanks[t.node][j];
  for (int b = 0; b < h.nNodes; b++) h.railPeer[b] = (int16_t)t.nodeRanks[b][t.localRank];
  h.send = a.sendbuff;
  h.recv = a.recvbuff;
  h.count = a.count;
  h.chunkElems = (uint64_t)h.nLocal * (h.stride / es);
  h.nChunks = (a.count + h.chunkElems - 1) / h.chunkElems;
  h.dtype = (int)a.dtype;
  hierRedFields(info, comm->nRanks, &h.red, &h.postDiv, &h.premul, &h.scalarOnDevice, &h.scalarPtr,
                &h.scalarBits);
  MK_INFO(kColl, "nccl%s: rank %d hierarchical %d x %d count %zu dtype %d chunk %llu x %llu", api,
          comm->rank, h.nNodes, h.nLocal, a.count, (int)a.dtype, (unsigned long long)h.chunkElems,
          (unsigned long long)h.nChunks);
  return ncclSuccess;
}

ncclResult_t hierPlanWork(ncclComm* comm, const std::vector<const CollArgs*>& colls,
                          const std::vector<CollArgs>& p2p, std::vector<HierLaunch>* out) {
  NCCLCHECK(hierUsable(comm, colls.empty() ? "ncclSend/ncclRecv" : collName(colls[0]->type)));
  const bool even = commEven(comm);
  for (const CollArgs* a : colls) {
    if (a->type == CollType::kAllReduce && even) {
      HierLaunch l{};
      l.kind = HierLaunch::kAllReduce;
      bool empty = false;
      NCCLCHECK(hierPlan(comm, *a, &l.ar, &empty));
      if (!empty) out->push_back(l);
    } else {
      NCCLCHECK(hierPlanXColl(comm, *a, out));
    }
  }
  if (!p2p.empty()) NCCLCHECK(hierPlanXP2p(comm, p2p, out));
  return ncclSuccess;
}

ncclResult_t hierRun(ncclComm* comm, HierLaunch& l, cudaStream_t s) {
  (void)comm;
  if (l.kind == HierLaunch::kAllReduce)
    CUDACHECK(launchHierAllReduce(l.ar, s));
  else
    CUDACHECK(launchHierX(l.x, s));
  return ncclSuccess;
}

}  // namespace mk
