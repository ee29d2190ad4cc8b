// Argument checks of the data-movement API. They run before any CUDA call, so they
// behave the same with or without a GPU, and leave the comm untouched on failure.
#include <cstdint>

#include "coll/coll.h"
#include "coll/redop.h"
#include "base/checks.h"
#include "comm/comm.h"

namespace mk {

const char* collName(CollType t) {
  static const char* names[] = {"AllReduce", "Broadcast", "Reduce",  "AllGather", "ReduceScatter",
                                "AlltoAll",  "Gather",    "Scatter", "Send",      "Recv"};
  int i = static_cast<int>(t);
  return i >= 0 && i < static_cast<int>(CollType::kCount) ? names[i] : "unknown";
}

size_t dtypeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

namespace {
bool usesReduction(CollType t) {
  return t == CollType::kAllReduce || t == CollType::kReduce || t == CollType::kReduceScatter;
}
bool rooted(CollType t) {
  return t == CollType::kBroadcast || t == CollType::kReduce || t == CollType::kGather ||
         t == CollType::kScatter;
}
}  // namespace

ncclResult_t collCheckArgs(CollArgs& a, const char* api) {
  NCCLCHECK(commCheck(a.comm, api));
  NCCLCHECK(commCheckReady(a.comm, api));
  const int n = a.comm->nRanks, me = a.comm->rank;
  size_t esize = dtypeSize(a.dtype);
  MK_ARGCHECK(esize != 0, "%s: invalid datatype %d", api, (int)a.dtype);
  if (usesReduction(a.type)) NCCLCHECK(redOpLookup(a.comm, a.op, a.dtype, &a.red));
  if (rooted(a.type))
    MK_ARGCHECK(a.root >= 0 && a.root < n, "%s: invalid root %d (nranks %d)", api, a.root, n);
  if (a.type == CollType::kSend || a.type == CollType::kRecv)
    MK_ARGCHECK(a.root >= 0 && a.root < n, "%s: invalid peer %d (nranks %d)", api, a.root, n);
  // The largest buffer any rank touches is count * nranks elements for the gather/scatter
  // family; refuse sizes whose byte count does not fit in size_t.
  bool perRank = a.type == CollType::kAllGather || a.type == CollType::kReduceScatter ||
                 a.type == CollType::kAlltoAll || a.type == CollType::kGather ||
                 a.type == CollType::kScatter;
  size_t mult = perRank ? (size_t)n : 1;
  MK_ARGCHECK(a.count <= SIZE_MAX / esize / mult,
              "%s: count %zu of %zu-byte elements overflows the buffer size", api, a.count, esize);
  if (a.count == 0) return ncclSuccess;
  bool needSend = true, needRecv = true;
  switch (a.type) {
    case CollType::kBroadcast:
      needSend = me == a.root;
      break;
    case CollType::kReduce:
      needRecv = me == a.root;
      break;
    case CollType::kGather:
      needRecv = me == a.root;
      break;
    case CollType::kScatter:
      needSend = me == a.root;
      break;
    case CollType::kSend:
      needRecv = false;
      break;
    case CollType::kRecv:
      needSend = false;
      break;
    default:
      break;
  }
  MK_ARGCHECK(!needSend || a.sendbuff != nullptr, "%s: sendbuff is NULL with count %zu", api,
              a.count);
  MK_ARGCHECK(!needRecv || a.recvbuff != nullptr, "%s: recvbuff is NULL with count %zu", api,
              a.count);
  return ncclSuccess;
}

}  // namespace mk
