// ncclGroupEnd must return the error of a call that failed inside the group, as NCCL does, and
// discard the group's deferred work (nothing of a half-valid group runs). Host-only: the
// failing calls fail on their arguments, before any CUDA call.
#include <cstddef>
#include <cstring>
#include <gtest/gtest.h>
#include <nccl.h>
#include <string>

#include "base/debug.h"
#include "coll/group.h"
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

// As NCCL: ncclGroupSimulateEnd(NULL) is a plain ncclGroupEnd, and a bad simInfo still closes
// the group; either way the next calls are not deferred to a group that stays open.
TEST(AbuseGroup, SimulateEndAlwaysClosesTheGroup) {
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(nullptr), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage) << "the group stayed open";
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  sim.magic = 0x1234;
  mk::setLastError("");
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("NCCL_SIM_INFO_INITIALIZER"),
            std::string::npos)
      << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage) << "the group stayed open";
  expectGroupIdle();
}

// An older, shorter ncclSimInfo_t is accepted; only the bytes it has are written.
TEST(AbuseGroup, SimulateEndAcceptsAShorterSimInfo) {
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  sim.size = offsetof(ncclSimInfo_t, estimatedTime);
  sim.estimatedTime = 42.0f;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclSuccess);
  EXPECT_EQ(sim.estimatedTime, 42.0f);
  sim = NCCL_SIM_INFO_INITIALIZER;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclSuccess);
  EXPECT_EQ(sim.estimatedTime, 0.0f);  // an empty group takes no time
  expectGroupIdle();
}

// A simulated end runs the group's communicator jobs (init, split, window registration) as
// NCCL does; only the operations are not launched. Skipping them would leave the comms
// initializing forever.
TEST(AbuseGroup, SimulateEndRunsCommJobs) {
  FakeComm fc(0, 2);
  fc.c->state.store(mk::CommState::kInitializing);
  bool ran = false;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(mk::commRunJob(fc.c,
                           [&] {
                             ran = true;
                             fc.c->state.store(mk::CommState::kReady);
                             return ncclSuccess;
                           }),
            ncclSuccess);
  int n = 0;
  EXPECT_EQ(ncclCommCount(fc.c, &n), ncclInvalidArgument) << "not initialised yet";
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclSuccess);
  EXPECT_TRUE(ran);
  EXPECT_EQ(ncclCommCount(fc.c, &n), ncclSuccess);
  EXPECT_EQ(n, 2);
  expectGroupIdle();
}

// As NCCL: "Blocking and nonblocking communicators are not allowed in the same group".
TEST(AbuseGroup, BlockingAndNonblockingCommsInOneGroup) {
  FakeComm blocking(0, 2), nonblocking(0, 2);
  nonblocking.c->config.blocking = false;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  // Deferred: a nonblocking finalize is a comm job of the group.
  EXPECT_EQ(ncclCommFinalize(nonblocking.c), ncclSuccess);
  mk::setLastError("");
  ncclComm_t child = nullptr;
  EXPECT_EQ(ncclCommSplit(blocking.c, NCCL_SPLIT_NOCOLOR, 0, &child, nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("not allowed in the same group"),
            std::string::npos)
      << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  EXPECT_EQ(nonblocking.c->state.load(), mk::CommState::kReady)
      << "the discarded finalize did not run";
  expectGroupIdle();
}
