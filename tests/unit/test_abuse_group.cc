// ncclGroupEnd must return the error of a call that failed inside the group, as NCCL does, and
// discard the group's deferred work (nothing of a half-valid group runs). Host-only: the
// failing calls fail on their arguments, before any CUDA call.
#include <cstring>
#include <gtest/gtest.h>
#include <nccl.h>
#include <string>

#include "base/debug.h"
#include "coll/redop.h"
#include "comm/comm.h"
#include "unit/fake_comm.h"

namespace {

using unittest::FakeComm;

void* const kBuf = reinterpret_cast<void*>(0x1000);  // never dereferenced

// The group machinery is per thread and must be idle between tests.
void expectGroupIdle() {
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << "a recorded error leaked into the next group";
}

}  // namespace

TEST(AbuseGroup, NullCommInsideGroupFailsGroupEnd) {
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(kBuf, kBuf, 4, ncclFloat, ncclSum, nullptr, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  EXPECT_STRNE(ncclGetLastError(nullptr), "");
  expectGroupIdle();
}

TEST(AbuseGroup, EveryKindOfCallReportsAtGroupEnd) {
  FakeComm fc(0, 2);
  struct Case {
    const char* what;
    ncclResult_t (*call)(ncclComm*);
  } cases[] = {
      {"send to a peer out of range",
       [](ncclComm* c) { return ncclSend(kBuf, 1, ncclFloat, 7, c, nullptr); }},
      {"recv with a bad datatype",
       [](ncclComm* c) { return ncclRecv(kBuf, 1, (ncclDataType_t)99, 1, c, nullptr); }},
      {"broadcast from a bad root",
       [](ncclComm* c) { return ncclBroadcast(kBuf, kBuf, 1, ncclInt, -1, c, nullptr); }},
      {"reduce-scatter with a bad op",
       [](ncclComm* c) {
         return ncclReduceScatter(kBuf, kBuf, 1, ncclInt, (ncclRedOp_t)77, c, nullptr);
       }},
      {"allgather with a NULL buffer",
       [](ncclComm* c) { return ncclAllGather(nullptr, kBuf, 1, ncclInt, c, nullptr); }},
  };
  for (const Case& k : cases) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ncclResult_t r = k.call(fc.c);
    EXPECT_EQ(r, ncclInvalidArgument) << k.what;
    EXPECT_EQ(ncclGroupEnd(), r) << k.what;
    expectGroupIdle();
  }
}

TEST(AbuseGroup, ErrorWinsOverValidWorkAndDiscardsIt) {
  FakeComm fc(0, 1);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  // Valid: queued. Launching it would fail with ncclInvalidUsage (no collective state).
  EXPECT_EQ(ncclAllReduce(kBuf, kBuf, 4, ncclFloat, ncclSum, fc.c, nullptr), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(kBuf, kBuf, 4, ncclFloat, ncclSum, nullptr, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(kBuf, kBuf, 4, ncclFloat, ncclSum, fc.c, nullptr), ncclSuccess);
  // The first error is the one returned, and the queued work never ran.
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  std::string msg = ncclGetLastError(nullptr);
  EXPECT_EQ(msg.find("collective state is not initialised"), std::string::npos) << msg;
  expectGroupIdle();
}

TEST(AbuseGroup, NestedGroupsReportAtTheOutermostEnd) {
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclSend(kBuf, 1, ncclFloat, 0, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);  // inner: NCCL reports at the outermost end
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  expectGroupIdle();
}

TEST(AbuseGroup, FailedCommInitRankInsideGroup) {
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  ncclComm_t comm = nullptr;
  for (int variant = 0; variant < 3; variant++) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ncclResult_t r = variant == 0   ? ncclCommInitRank(&comm, 0, id, 0)   // nranks <= 0
                     : variant == 1 ? ncclCommInitRank(&comm, 2, id, 2)   // rank >= nranks
                                    : ncclCommInitRank(&comm, 2, id, 0);  // id not from mkernel
    EXPECT_EQ(r, ncclInvalidArgument) << variant;
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument) << variant;
    expectGroupIdle();
  }
}

TEST(AbuseGroup, SimulateEndReportsTheErrorToo) {
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(kBuf, kBuf, 4, ncclFloat, ncclSum, nullptr, nullptr),
            ncclInvalidArgument);
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclInvalidArgument);
  expectGroupIdle();
}

TEST(AbuseGroup, OutsideAGroupNothingIsRecorded) {
  // A failure outside any group is returned by its call only; the next group is clean.
  EXPECT_EQ(ncclAllReduce(kBuf, kBuf, 4, ncclFloat, ncclSum, nullptr, nullptr),
            ncclInvalidArgument);
  expectGroupIdle();
}
