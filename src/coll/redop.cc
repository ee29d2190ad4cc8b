#include "coll/redop.h"

#include <cstring>
#include <mutex>
#include <vector>

#include "coll/coll.h"
#include "base/checks.h"
#include "comm/comm.h"

namespace mk {
namespace {
struct RedOpTable {
  std::mutex mu;
  std::vector<RedOpInfo> ops;  // index i <-> ncclRedOp_t (ncclNumOps + i)
  std::vector<bool> live;
};
RedOpTable* table(ncclComm* comm) {
  return static_cast<RedOpTable*>(comm->redOps);
}
}  // namespace

ncclResult_t redOpCreatePreMulSum(ncclComm* comm, ncclRedOp_t* op, void* scalar,
                                  ncclDataType_t dtype, ncclScalarResidence_t residence) {
  MK_ARGCHECK(op != nullptr, "ncclRedOpCreatePreMulSum: op is NULL");
  MK_ARGCHECK(scalar != nullptr, "ncclRedOpCreatePreMulSum: scalar is NULL");
  MK_ARGCHECK(dtypeSize(dtype) != 0, "ncclRedOpCreatePreMulSum: invalid datatype %d", (int)dtype);
  MK_ARGCHECK(residence == ncclScalarDevice || residence == ncclScalarHostImmediate,
              "ncclRedOpCreatePreMulSum: invalid residence %d", (int)residence);
  RedOpInfo info{};
  info.builtin = ncclNumOps;
  info.dtype = dtype;
  info.scalarOnDevice = residence == ncclScalarDevice;
  if (info.scalarOnDevice)
    info.scalarPtr = scalar;
  else
    memcpy(&info.scalarBits, scalar, dtypeSize(dtype));
  RedOpTable* t = table(comm);
  std::lock_guard<std::mutex> g(t->mu);
  size_t i = 0;
  while (i < t->live.size() && t->live[i]) i++;  // reuse destroyed slots
  if (i == t->ops.size()) {
    MK_ARGCHECK(i < 1u << 20, "ncclRedOpCreatePreMulSum: too many live reduction ops");
    t->ops.push_back(info);
    t->live.push_back(true);
  } else {
    t->ops[i] = info;
    t->live[i] = true;
  }
  *op = static_cast<ncclRedOp_t>(ncclNumOps + i);
  return ncclSuccess;
}

ncclResult_t redOpDestroy(ncclComm* comm, ncclRedOp_t op) {
  MK_ARGCHECK((int)op >= (int)ncclNumOps,
              "ncclRedOpDestroy: op %d is a built-in operator and cannot be destroyed", (int)op);
  RedOpTable* t = table(comm);
  std::lock_guard<std::mutex> g(t->mu);
  size_t i = (size_t)op - ncclNumOps;
  MK_ARGCHECK(i < t->live.size() && t->live[i],
              "ncclRedOpDestroy: op %d was not created on this communicator or was destroyed",
              (int)op);
  t->live[i] = false;
  return ncclSuccess;
}

ncclResult_t redOpLookup(ncclComm* comm, ncclRedOp_t op, ncclDataType_t dtype, RedOpInfo* out) {
  if ((int)op >= 0 && (int)op < (int)ncclNumOps) {
    *out = RedOpInfo{op, dtype, false, nullptr, 0};
    return ncclSuccess;
  }
  MK_ARGCHECK((int)op > 0, "invalid reduction operator %d", (int)op);
  RedOpTable* t = table(comm);
  std::lock_guard<std::mutex> g(t->mu);
  size_t i = (size_t)op - ncclNumOps;
  MK_ARGCHECK(i < t->live.size() && t->live[i],
              "reduction operator %d was not created on this communicator or was destroyed",
              (int)op);
  MK_ARGCHECK(t->ops[i].dtype == dtype,
              "reduction operator %d was created for datatype %d, used with datatype %d", (int)op,
              (int)t->ops[i].dtype, (int)dtype);
  *out = t->ops[i];
  return ncclSuccess;
}

void redOpTableInit(ncclComm* comm) {
  comm->redOps = new RedOpTable();
}

void redOpFreeAll(ncclComm* comm) {
  delete static_cast<RedOpTable*>(comm->redOps);
  comm->redOps = nullptr;
}

}  // namespace mk
