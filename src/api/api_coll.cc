// The data-movement entry points of the NCCL API: each builds CollArgs, checks them
// (before any CUDA call) and hands them to collEnqueue.
#include "coll/coll.h"
#include "coll/group.h"
#include "coll/redop.h"
#include "api/api.h"
#include "base/checks.h"
#include "comm/comm.h"
#include "mkernel/nccl_extra.h"

namespace {
ncclResult_t run(mk::CollArgs a, const char* api) {
  ncclResult_t res = mk::collCheckArgs(a, api);
  if (res == ncclSuccess) res = mk::apiGuard(api, [&] { return mk::collEnqueue(a); });
  return mk::groupRecordError(res);  // inside a group, ncclGroupEnd returns it too
}
}  // namespace

using mk::CollType;

MK_API(ncclResult_t, ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count,
       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return run({CollType::kAllReduce, sendbuff, recvbuff, count, datatype, op, -1, comm, stream},
             "ncclAllReduce");
}

MK_API(ncclResult_t, ncclBroadcast, const void* sendbuff, void* recvbuff, size_t count,
       ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return run(
      {CollType::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream},
      "ncclBroadcast");
}

MK_API(ncclResult_t, ncclBcast, void* buff, size_t count, ncclDataType_t datatype, int root,
       ncclComm_t comm, cudaStream_t stream) {
  return run({CollType::kBroadcast, buff, buff, count, datatype, ncclSum, root, comm, stream},
             "ncclBcast");
}

MK_API(ncclResult_t, ncclReduce, const void* sendbuff, void* recvbuff, size_t count,
       ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return run({CollType::kReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream},
             "ncclReduce");
}

MK_API(ncclResult_t, ncclAllGather, const void* sendbuff, void* recvbuff, size_t sendcount,
       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return run(
      {CollType::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, -1, comm, stream},
      "ncclAllGather");
}

MK_API(ncclResult_t, ncclReduceScatter, const void* sendbuff, void* recvbuff, size_t recvcount,
       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return run(
      {CollType::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream},
      "ncclReduceScatter");
}

MK_API(ncclResult_t, ncclAlltoAll, const void* sendbuff, void* recvbuff, size_t count,
       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return run({CollType::kAlltoAll, sendbuff, recvbuff, count, datatype, ncclSum, -1, comm, stream},
             "ncclAlltoAll");
}

MK_API(ncclResult_t, ncclAllToAll, const void* sendbuff, void* recvbuff, size_t count,
       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return run({CollType::kAlltoAll, sendbuff, recvbuff, count, datatype, ncclSum, -1, comm, stream},
             "ncclAllToAll");
}

MK_API(ncclResult_t, ncclGather, const void* sendbuff, void* recvbuff, size_t count,
       ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return run({CollType::kGather, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream},
             "ncclGather");
}

MK_API(ncclResult_t, ncclScatter, const void* sendbuff, void* recvbuff, size_t count,
       ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return run({CollType::kScatter, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream},
             "ncclScatter");
}

MK_API(ncclResult_t, ncclSend, const void* sendbuff, size_t count, ncclDataType_t datatype,
       int peer, ncclComm_t comm, cudaStream_t stream) {
  return run({CollType::kSend, sendbuff, nullptr, count, datatype, ncclSum, peer, comm, stream},
             "ncclSend");
}

MK_API(ncclResult_t, ncclRecv, void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
       ncclComm_t comm, cudaStream_t stream) {
  return run({CollType::kRecv, nullptr, recvbuff, count, datatype, ncclSum, peer, comm, stream},
             "ncclRecv");
}

namespace {
ncclResult_t allToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                       void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  NCCLCHECK(mk::commCheck(comm, "ncclAllToAllv"));
  MK_ARGCHECK(sendcounts && sdispls && recvcounts && rdispls,
              "ncclAllToAllv: count/displacement arrays must not be NULL");
  size_t esize = mk::dtypeSize(datatype);
  MK_ARGCHECK(esize != 0, "ncclAllToAllv: invalid datatype %d", (int)datatype);
  // Validate every pair before issuing anything, so a bad entry leaves nothing half-queued.
  for (int p = 0; p < comm->nRanks; p++) {
    mk::CollArgs s{CollType::kSend,
                   (const char*)sendbuff + sdispls[p] * esize,
                   nullptr,
                   sendcounts[p],
                   datatype,
                   ncclSum,
                   p,
                   comm,
                   stream};
    mk::CollArgs r{CollType::kRecv,
                   nullptr,
                   (char*)recvbuff + rdispls[p] * esize,
                   recvcounts[p],
                   datatype,
                   ncclSum,
                   p,
                   comm,
                   stream};
    NCCLCHECK(mk::collCheckArgs(s, "ncclAllToAllv"));
    NCCLCHECK(mk::collCheckArgs(r, "ncclAllToAllv"));
  }
  NCCLCHECK(ncclGroupStart());
  ncclResult_t res = ncclSuccess;
  for (int p = 0; p < comm->nRanks && res == ncclSuccess; p++) {
    res = ncclSend((const char*)sendbuff + sdispls[p] * esize, sendcounts[p], datatype, p, comm,
                   stream);
    if (res == ncclSuccess)
      res =
          ncclRecv((char*)recvbuff + rdispls[p] * esize, recvcounts[p], datatype, p, comm, stream);
  }
  ncclResult_t endRes = ncclGroupEnd();
  return res != ncclSuccess ? res : endRes;
}
}  // namespace

MK_API(ncclResult_t, ncclAllToAllv, const void* sendbuff, const size_t sendcounts[],
       const size_t sdispls[], void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return mk::groupRecordError(allToAllv(sendbuff, sendcounts, sdispls, recvbuff, recvcounts,
                                        rdispls, datatype, comm, stream));
}

MK_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t* op, void* scalar,
       ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm) {
  NCCLCHECK(mk::commCheck(comm, "ncclRedOpCreatePreMulSum"));
  return mk::apiGuard("ncclRedOpCreatePreMulSum", [&] {
    return mk::redOpCreatePreMulSum(comm, op, scalar, datatype, residence);
  });
}

MK_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm) {
  NCCLCHECK(mk::commCheck(comm, "ncclRedOpDestroy"));
  return mk::redOpDestroy(comm, op);
}
