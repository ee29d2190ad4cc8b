// User-defined reduction operators (ncclRedOpCreatePreMulSum). The enqueue copies
// an op's description into the kernel arguments, so destroying the op right after
// the call that used it is safe.
#pragma once
#include <cstdint>
#include <nccl.h>

struct ncclComm;

namespace mk {

struct RedOpInfo {
  ncclRedOp_t builtin;    // ncclSum..ncclAvg, or ncclNumOps for PreMulSum
  ncclDataType_t dtype;   // PreMulSum: the dtype it was created for
  bool scalarOnDevice;    // ncclScalarDevice: read *scalarPtr at run time
  const void* scalarPtr;  // device pointer (ncclScalarDevice)
  uint64_t scalarBits;    // host-immediate scalar, its bytes (dtype-sized)
};

ncclResult_t redOpCreatePreMulSum(ncclComm* comm, ncclRedOp_t* op, void* scalar,
                                  ncclDataType_t dtype, ncclScalarResidence_t residence);
ncclResult_t redOpDestroy(ncclComm* comm, ncclRedOp_t op);
// Resolves op for dtype; ncclInvalidArgument (+message) for unknown/destroyed ops or a dtype
// different from the one the op was created for.
ncclResult_t redOpLookup(ncclComm* comm, ncclRedOp_t op, ncclDataType_t dtype, RedOpInfo* out);
// Table lifetime follows the comm (created in comm allocation, freed with it).
void redOpTableInit(ncclComm* comm);
void redOpFreeAll(ncclComm* comm);

}  // namespace mk
