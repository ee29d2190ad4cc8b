// ncclGroupStart/End/SimulateEnd: argument checks here, the group logic in src/coll/group.cc.
#include <nccl.h>

#include "api/api.h"
#include "base/checks.h"
#include "coll/group.h"

MK_API(ncclResult_t, ncclGroupStart) {
  mk::groupStart();
  return ncclSuccess;
}

MK_API(ncclResult_t, ncclGroupEnd) {
  return mk::groupEnd(nullptr);
}

MK_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t* simInfo) {
  MK_ARGCHECK(simInfo != nullptr, "ncclGroupSimulateEnd: simInfo is NULL");
  MK_ARGCHECK(simInfo->magic == 0x74685283u && simInfo->size >= sizeof(ncclSimInfo_t),
              "ncclGroupSimulateEnd: simInfo not initialised with NCCL_SIM_INFO_INITIALIZER");
  return mk::groupEnd(simInfo);
}
