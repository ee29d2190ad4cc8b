// ncclGroupStart/End/SimulateEnd: the group logic is in src/coll/group.cc.
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
  // As NCCL: NULL is a plain ncclGroupEnd; simInfo is checked where the group closes, so that
  // a bad one cannot leave the group open (src/coll/group.cc).
  return mk::groupEnd(simInfo);
}
