#include "fused/core/fused_comm.h"

#include <algorithm>
#include <cstdint>
#include <functional>

#include "base/checks.h"
#include "base/param.h"
#include "base/scratch.h"
#include "coll/coll.h"
#include "coll/coll_state.h"
#include "comm/comm.h"
#include "device/rt/err_host.h"

namespace mk {
namespace fused {

ncclResult_t fusedCommView(ncclComm* comm, int32_t op, FusedComm* out) {
  NCCLCHECK(commCheck(comm, "fused operator"));
  MK_ARGCHECK(op >= rt::kOpFusedFirst && op < rt::kOpFusedEnd,
              "fusedCommView: %d is not a fused operator", op);
  MK_ARGCHECK(comm->coll != nullptr, "%s: rank %d: the comm is not initialised", rt::opName(op),
              comm->rank);
  FusedComm f{};
  f.c = collCommDev(comm);
  f.c.w.op = op;
  // comm_dev.h: the call counters follow the channel counters in the comm's device state.
  f.seq = f.c.recvCnt + (size_t)kMaxLocalRanks * kMaxLanes;
  f.rank = comm->rank;
  f.nRanks = comm->nRanks;
  f.cudaDev = comm->cudaDev;
  f.smBudget = comm->coll->budget.hi;
  f.hasNet = comm->net != nullptr ? 1 : 0;
  if (f.hasNet) NCCLCHECK(netDevView(comm, &f.net));
  *out = f;
  return ncclSuccess;
}

int32_t seqGemmBudget(const FusedComm& f) {
  const int64_t v = MK_PARAM_INT(SeqGemmSms);
  return v < 0 ? f.smBudget : (int32_t)v;
}

int32_t seqGemmBudget(const ncclComm* comm) {
  const int64_t v = MK_PARAM_INT(SeqGemmSms);
  return v < 0 ? comm->coll->budget.hi : (int32_t)v;  // FusedComm::smBudget's source
}

int32_t fusedOwnShare(const ncclComm* comm) {
  return std::max(1, comm->smCount / std::max(1, comm->topo.ranksOnMyDevice));
}

int32_t fusedLeastShare(const ncclComm* comm) {
  return comm->topo.leastShare > 0 ? comm->topo.leastShare : fusedOwnShare(comm);
}

int32_t fusedGpuShare(const ncclComm* comm) {
  const int own = std::max(1, comm->topo.ranksOnMyDevice);
  const int most = std::max(own, commMostRanksOnDevice(comm->peerInfo[comm->rank].busId));
  return std::max(1, comm->smCount / most);
}

ncclResult_t fusedEnqueue(ncclComm* comm, cudaStream_t stream, const char* api,
                          const std::function<ncclResult_t(cudaStream_t)>& launch,
                          bool continuation) {
  return collEnqueueFn(comm, stream, api, launch, continuation);
}

ncclResult_t fusedFreeScratch(void* scratch, cudaStream_t stream, ncclResult_t res,
                              const char* api) {
  if (scratch == nullptr) return res;
  const ncclResult_t e = scratchFree(scratch, stream);
  if (e != ncclSuccess && res == ncclSuccess) {
    MK_WARN("%s: freeing the call's scratch failed", api);
    return e;
  }
  return res;
}

namespace {
CollArgs collOf(ncclComm* comm, cudaStream_t stream, int collType, const void* send, void* recv,
                size_t count, ncclDataType_t dtype) {
  CollArgs a{};
  a.type = static_cast<CollType>(collType);
  a.sendbuff = send;
  a.recvbuff = recv;
  a.count = count;
  a.dtype = dtype;
  a.op = ncclSum;
  a.root = -1;
  a.comm = comm;
  a.stream = stream;
  return a;
}
}  // namespace

ncclResult_t fusedCollective(ncclComm* comm, cudaStream_t stream, int collType, const void* send,
                             void* recv, size_t count, ncclDataType_t dtype, const char* api) {
  CollArgs a = collOf(comm, stream, collType, send, recv, count, dtype);
  NCCLCHECK(collCheckArgs(a, api));
  return collEnqueue(a);
}

ncclResult_t fusedAlltoAllSized(ncclComm* comm, cudaStream_t stream, const void* send, void* recv,
                                size_t count, ncclDataType_t dtype, const SizedUnits& u,
                                const char* api) {
  MK_ARGCHECK(u.on() && u.unitBytes > 0,
              "%s: a sized AlltoAll needs both unit arrays and a unit size", api);
  CollArgs a = collOf(comm, stream, (int)CollType::kAlltoAll, send, recv, count, dtype);
  NCCLCHECK(collCheckArgs(a, api));
  a.sized = u;
  return collEnqueue(a);
}

}  // namespace fused
}  // namespace mk
