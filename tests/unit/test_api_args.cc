// The argument-check table: every bad input gets ncclInvalidArgument (or ncclInvalidUsage
// for misuse) plus a message in ncclGetLastError, before any CUDA call — so these run on
// machines without a GPU — and the comm stays usable afterwards.
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <gtest/gtest.h>
#include <nccl.h>
#include <nccl_device.h>
#include <string>

#include "bootstrap/bootstrap.h"
#include "coll/group.h"
#include "coll/redop.h"
#include "comm/config.h"
#include "base/debug.h"
#include "comm/comm.h"
#include "common/test_util.h"
#include "mkernel/nccl_extra.h"
#include "unit/fake_comm.h"

namespace {

using unittest::FakeComm;

void expectErr(ncclResult_t expected, std::function<ncclResult_t()> call, const char* what) {
  mk::setLastError("");
  ncclResult_t r = call();
  EXPECT_EQ(r, expected) << what;
  EXPECT_STRNE(ncclGetLastError(nullptr), "") << what << ": no message";
}

#define EXPECT_INVALID(call) \
  expectErr(                 \
      ncclInvalidArgument, [&] { return call; }, #call)
#define EXPECT_USAGE(call) \
  expectErr(               \
      ncclInvalidUsage, [&] { return call; }, #call)

void* const kBuf = reinterpret_cast<void*>(0x1000);  // never dereferenced: checks fail first

TEST(ApiArgs, VersionAndErrorStrings) {
  int v = 0;
  EXPECT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_VERSION_CODE);
  EXPECT_INVALID(ncclGetVersion(nullptr));
  EXPECT_STREQ(ncclGetErrorString(ncclSuccess), "no error");
  EXPECT_STREQ(ncclGetErrorString(ncclInvalidArgument),
               "invalid argument (run with NCCL_DEBUG=WARN for details)");
  EXPECT_STREQ(ncclGetErrorString(ncclRemoteError),
               "remote process exited or there was a network error");
  EXPECT_STREQ(ncclGetErrorString(ncclInProgress), "NCCL operation in progress");
  EXPECT_STREQ(ncclGetErrorString((ncclResult_t)99), "unknown result code");
}

TEST(ApiArgs, InitChecksComeBeforeAnyCudaCall) {
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  ncclComm_t comm = nullptr;
  EXPECT_INVALID(ncclGetUniqueId(nullptr));
  EXPECT_INVALID(ncclCommInitRank(nullptr, 2, id, 0));
  EXPECT_INVALID(ncclCommInitRank(&comm, 0, id, 0));
  EXPECT_INVALID(ncclCommInitRank(&comm, -3, id, 0));
  EXPECT_INVALID(ncclCommInitRank(&comm, 2, id, 2));
  EXPECT_INVALID(ncclCommInitRank(&comm, 2, id, -1));
  EXPECT_INVALID(ncclCommInitRank(&comm, 2, id, 0));  // all-zero id: bad magic
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclConfig_t bad = cfg;
  bad.magic = 0x12345678;
  EXPECT_INVALID(ncclCommInitRankConfig(&comm, 2, id, 0, &bad));
  bad = cfg;
  bad.size = 4;  // too short to hold the magic: refused like a bad one, as NCCL
  EXPECT_INVALID(ncclCommInitRankConfig(&comm, 2, id, 0, &bad));
  // NCCL refuses no version and no larger size: an old version's missing fields are
  // defaults, a newer struct's extra bytes are ignored (test_api_config.cc has the cases).
  mk::Config parsed;
  bad = cfg;
  bad.version = 1;
  EXPECT_EQ(mk::configParse(&bad, &parsed), ncclSuccess);
  bad = cfg;
  bad.size = sizeof(ncclConfig_t) + 64;
  EXPECT_EQ(mk::configParse(&bad, &parsed), ncclSuccess);
  bad = cfg;
  bad.blocking = 7;
  EXPECT_INVALID(ncclCommInitRankConfig(&comm, 2, id, 0, &bad));
  bad = cfg;
  bad.minCTAs = 8;
  bad.maxCTAs = 2;
  EXPECT_INVALID(ncclCommInitRankConfig(&comm, 2, id, 0, &bad));
  EXPECT_INVALID(ncclCommInitRankScalable(&comm, 2, 0, 0, &id, nullptr));
  EXPECT_INVALID(ncclCommInitRankScalable(&comm, 2, 0, 1, nullptr, nullptr));
  EXPECT_INVALID(ncclCommInitAll(nullptr, 2, nullptr));
  EXPECT_INVALID(ncclCommInitAll(&comm, 0, nullptr));
  int devs[2] = {0, -1};
  EXPECT_INVALID(ncclCommInitAll(&comm, 2, devs));
  EXPECT_EQ(comm, nullptr);
}

TEST(ApiArgs, CommHandleChecks) {
  int n = 0;
  EXPECT_INVALID(ncclCommCount(nullptr, &n));
  // A pointer that is not a live comm (freed, foreign or garbage) is refused without being
  // dereferenced.
  alignas(64) char garbage[sizeof(ncclComm)];
  memset(garbage, 0x5a, sizeof(garbage));
  EXPECT_INVALID(ncclCommCount(reinterpret_cast<ncclComm_t>(garbage), &n));
  EXPECT_INVALID(ncclAllReduce(kBuf, kBuf, 1, ncclFloat, ncclSum,
                               reinterpret_cast<ncclComm_t>(garbage), nullptr));
  ncclComm_t dead;
  {
    FakeComm f(0, 1);
    dead = f.c;
  }
  EXPECT_INVALID(ncclCommCount(dead, &n));
  EXPECT_INVALID(ncclCommDestroy(dead));
  EXPECT_INVALID(ncclCommAbort(dead));
  FakeComm f(0, 2);
  f.c->magicEnd = 0;  // corrupted
  EXPECT_INVALID(ncclCommCount(f.c, &n));
  f.c->magicEnd = mk::kCommMagic;
  EXPECT_EQ(ncclCommCount(f.c, &n), ncclSuccess);
  EXPECT_EQ(n, 2);
}

TEST(ApiArgs, QueryChecks) {
  FakeComm f(1, 3);
  EXPECT_INVALID(ncclCommCount(f.c, nullptr));
  EXPECT_INVALID(ncclCommCuDevice(f.c, nullptr));
  EXPECT_INVALID(ncclCommUserRank(f.c, nullptr));
  EXPECT_INVALID(ncclCommGetAsyncError(f.c, nullptr));
  // As NCCL: registering nothing (NULL or 0 bytes) succeeds with a NULL handle, and
  // deregistering a NULL handle is a no-op.
  void* h = kBuf;
  EXPECT_EQ(ncclCommRegister(f.c, nullptr, 64, &h), ncclSuccess);
  EXPECT_EQ(h, nullptr);
  h = kBuf;
  EXPECT_EQ(ncclCommRegister(f.c, kBuf, 0, &h), ncclSuccess);
  EXPECT_EQ(h, nullptr);
  EXPECT_INVALID(ncclCommRegister(f.c, kBuf, 64, nullptr));
  EXPECT_EQ(ncclCommDeregister(f.c, nullptr), ncclSuccess);
  EXPECT_INVALID(ncclCommDeregister(nullptr, nullptr));
  EXPECT_INVALID(ncclCommRevoke(f.c, 1));
  int r = -1;
  EXPECT_EQ(ncclCommUserRank(f.c, &r), ncclSuccess);
  EXPECT_EQ(r, 1);
}

TEST(ApiArgs, CollectiveChecks) {
  FakeComm f(1, 4);
  ncclComm_t c = f.c;
  EXPECT_INVALID(ncclAllReduce(kBuf, kBuf, 8, (ncclDataType_t)12, ncclSum, c, nullptr));
  EXPECT_INVALID(ncclAllReduce(kBuf, kBuf, 8, (ncclDataType_t)-1, ncclSum, c, nullptr));
  EXPECT_INVALID(ncclAllReduce(kBuf, kBuf, 8, ncclFloat, (ncclRedOp_t)99, c, nullptr));
  EXPECT_INVALID(ncclAllReduce(kBuf, kBuf, 8, ncclFloat, (ncclRedOp_t)-2, c, nullptr));
  EXPECT_INVALID(ncclAllReduce(nullptr, kBuf, 8, ncclFloat, ncclSum, c, nullptr));
  EXPECT_INVALID(ncclAllReduce(kBuf, nullptr, 8, ncclFloat, ncclSum, c, nullptr));
  EXPECT_INVALID(ncclAllReduce(kBuf, kBuf, SIZE_MAX / 2, ncclFloat, ncclSum, c, nullptr));
  EXPECT_INVALID(ncclAllGather(kBuf, kBuf, SIZE_MAX / 2, ncclInt8, c, nullptr));
  EXPECT_INVALID(ncclBroadcast(kBuf, kBuf, 8, ncclFloat, 4, c, nullptr));
  EXPECT_INVALID(ncclBroadcast(kBuf, kBuf, 8, ncclFloat, -1, c, nullptr));
  EXPECT_INVALID(ncclBcast(nullptr, 8, ncclFloat, 0, c, nullptr));
  EXPECT_INVALID(ncclReduce(kBuf, kBuf, 8, ncclFloat, ncclSum, 7, c, nullptr));
  EXPECT_INVALID(ncclReduce(nullptr, kBuf, 8, ncclFloat, ncclSum, 0, c, nullptr));
  EXPECT_INVALID(ncclGather(kBuf, kBuf, 8, ncclFloat, 9, c, nullptr));
  EXPECT_INVALID(ncclScatter(kBuf, kBuf, 8, ncclFloat, -2, c, nullptr));
  EXPECT_INVALID(ncclReduceScatter(kBuf, nullptr, 8, ncclFloat, ncclMax, c, nullptr));
  EXPECT_INVALID(ncclAlltoAll(nullptr, kBuf, 8, ncclFloat, c, nullptr));
  EXPECT_INVALID(ncclAllToAll(kBuf, nullptr, 8, ncclFloat, c, nullptr));
  EXPECT_INVALID(ncclSend(kBuf, 8, ncclFloat, 4, c, nullptr));
  EXPECT_INVALID(ncclSend(nullptr, 8, ncclFloat, 0, c, nullptr));
  EXPECT_INVALID(ncclRecv(kBuf, 8, ncclFloat, -1, c, nullptr));
  EXPECT_INVALID(ncclRecv(kBuf, 8, (ncclDataType_t)40, 0, c, nullptr));
  size_t counts[4] = {1, 1, 1, 1}, displs[4] = {0, 1, 2, 3};
  EXPECT_INVALID(ncclAllToAllv(kBuf, counts, nullptr, kBuf, counts, displs, ncclFloat, c, nullptr));
  EXPECT_INVALID(
      ncclAllToAllv(kBuf, counts, displs, kBuf, counts, displs, (ncclDataType_t)13, c, nullptr));
  int n = 0;
  EXPECT_EQ(ncclCommCount(c, &n), ncclSuccess);  // still usable
  EXPECT_EQ(n, 4);
}

TEST(ApiArgs, CommStateChecks) {
  FakeComm f(0, 2);
  f.c->state.store(mk::CommState::kRevoked);
  EXPECT_USAGE(ncclAllReduce(kBuf, kBuf, 8, ncclFloat, ncclSum, f.c, nullptr));
  f.c->state.store(mk::CommState::kFinalized);
  EXPECT_USAGE(ncclSend(kBuf, 8, ncclFloat, 1, f.c, nullptr));
  // As NCCL's ncclCommEnsureReady: a comm still initializing is an invalid argument...
  f.c->state.store(mk::CommState::kInitializing);
  EXPECT_INVALID(ncclBroadcast(kBuf, kBuf, 8, ncclFloat, 0, f.c, nullptr));
  // ...and one whose init failed gives that failure.
  f.c->asyncResult.store(ncclRemoteError);
  f.c->state.store(mk::CommState::kFailed);
  expectErr(
      ncclRemoteError, [&] { return ncclBroadcast(kBuf, kBuf, 8, ncclFloat, 0, f.c, nullptr); },
      "failed init");
}

// The queries read what the init job writes (a split child's rank and size, the topology): a
// comm still initializing gives ncclInvalidArgument instead of racing with it, as NCCL.
TEST(ApiArgs, QueriesWaitForInit) {
  FakeComm f(1, 3);
  f.c->state.store(mk::CommState::kInitializing);
  int v = -7;
  EXPECT_INVALID(ncclCommCount(f.c, &v));
  EXPECT_INVALID(ncclCommUserRank(f.c, &v));
  EXPECT_INVALID(ncclCommCuDevice(f.c, &v));
  EXPECT_EQ(v, -7);
  EXPECT_EQ(ncclTeamWorld(f.c).nRanks, 0);
  EXPECT_EQ(ncclTeamLsa(f.c).rank, -1);
  EXPECT_EQ(ncclTeamRail(f.c).rank, -1);
  EXPECT_EQ(ncclTeamRankToWorld(f.c, ncclTeam_t{3, 1, 1}, 2), -1);
  EXPECT_EQ(ncclTeamRankToLsa(f.c, ncclTeam_t{3, 1, 1}, 2), -1);
  f.c->asyncResult.store(ncclSystemError);
  f.c->state.store(mk::CommState::kFailed);
  EXPECT_EQ(ncclCommCount(f.c, &v), ncclSystemError);
  f.c->asyncResult.store(ncclSuccess);
  f.c->state.store(mk::CommState::kReady);
  EXPECT_EQ(ncclCommCount(f.c, &v), ncclSuccess);
  EXPECT_EQ(v, 3);
  EXPECT_EQ(ncclTeamWorld(f.c).rank, 1);
  // No topology (nodeRanks empty): -1 instead of reading outside it.
  EXPECT_EQ(ncclTeamRankToLsa(f.c, ncclTeam_t{3, 1, 1}, 2), -1);
  f.c->topo.nodeRanks = {{0, 1, 2}};
  EXPECT_EQ(ncclTeamRankToLsa(f.c, ncclTeam_t{3, 1, 1}, 2), 2);
}

// A failed init job leaves the comm kFailed: its calls report the job's error from then on.
TEST(ApiArgs, FailedInitJobMarksTheCommFailed) {
  FakeComm f(0, 2);
  f.c->state.store(mk::CommState::kInitializing);
  EXPECT_EQ(mk::commRunJob(f.c,
                           [] {
                             MK_WARN("test: init failed");
                             return ncclSystemError;
                           }),
            ncclSystemError);
  EXPECT_EQ(f.c->state.load(), mk::CommState::kFailed);
  int n = 0;
  EXPECT_EQ(ncclCommCount(f.c, &n), ncclSystemError);
  EXPECT_EQ(ncclAllReduce(kBuf, kBuf, 8, ncclFloat, ncclSum, f.c, nullptr), ncclSystemError);
  ncclResult_t ar = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(f.c, &ar), ncclSuccess);
  EXPECT_EQ(ar, ncclSystemError);
}

TEST(ApiArgs, Finalize) {
  EXPECT_EQ(ncclCommFinalize(nullptr), ncclSuccess);  // as NCCL
  FakeComm f(0, 2);
  f.c->state.store(mk::CommState::kInitializing);
  EXPECT_INVALID(ncclCommFinalize(f.c));
  f.c->state.store(mk::CommState::kReady);
  EXPECT_EQ(ncclCommFinalize(f.c), ncclSuccess);
  EXPECT_INVALID(ncclCommFinalize(f.c));  // twice: NCCL's ncclInvalidArgument
  // Inside a group, its error is the group's.
  FakeComm g(0, 2);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclCommFinalize(g.c), ncclSuccess);
  EXPECT_EQ(ncclCommFinalize(g.c), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
}

TEST(ApiArgs, RedOps) {
  FakeComm f(0, 2);
  ncclRedOp_t op;
  float s = 0.5f;
  EXPECT_INVALID(ncclRedOpCreatePreMulSum(nullptr, &s, ncclFloat, ncclScalarHostImmediate, f.c));
  EXPECT_INVALID(ncclRedOpCreatePreMulSum(&op, nullptr, ncclFloat, ncclScalarHostImmediate, f.c));
  EXPECT_INVALID(
      ncclRedOpCreatePreMulSum(&op, &s, (ncclDataType_t)20, ncclScalarHostImmediate, f.c));
  EXPECT_INVALID(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat, (ncclScalarResidence_t)5, f.c));
  ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat, ncclScalarHostImmediate, f.c),
            ncclSuccess);
  EXPECT_GE((int)op, (int)ncclNumOps);
  mk::RedOpInfo info;
  ASSERT_EQ(mk::redOpLookup(f.c, op, ncclFloat, &info), ncclSuccess);
  float back;
  memcpy(&back, &info.scalarBits, sizeof(back));
  EXPECT_EQ(back, 0.5f);
  // An op created for float cannot be used with double.
  EXPECT_INVALID(ncclAllReduce(kBuf, kBuf, 8, ncclDouble, op, f.c, nullptr));
  EXPECT_INVALID(ncclRedOpDestroy(ncclSum, f.c));
  EXPECT_EQ(ncclRedOpDestroy(op, f.c), ncclSuccess);
  EXPECT_INVALID(ncclRedOpDestroy(op, f.c));
  EXPECT_INVALID(ncclAllReduce(kBuf, kBuf, 8, ncclFloat, op, f.c, nullptr));
  // Another comm's op is not this comm's.
  FakeComm g(0, 2);
  ncclRedOp_t op2;
  ASSERT_EQ(ncclRedOpCreatePreMulSum(&op2, &s, ncclFloat, ncclScalarDevice, g.c), ncclSuccess);
  EXPECT_EQ(mk::redOpLookup(g.c, op2, ncclFloat, &info), ncclSuccess);
  EXPECT_TRUE(info.scalarOnDevice);
  EXPECT_EQ(info.scalarPtr, &s);
}

TEST(ApiArgs, Groups) {
  EXPECT_USAGE(ncclGroupEnd());  // unmatched
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_USAGE(ncclGroupEnd());
  // Outside a group, a simulated end is an unmatched end too, whatever simInfo is (NCCL).
  EXPECT_USAGE(ncclGroupSimulateEnd(nullptr));
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  sim.magic = 0;
  EXPECT_USAGE(ncclGroupSimulateEnd(&sim));
}

TEST(ApiArgs, SplitShrinkChecks) {
  FakeComm f(1, 4);
  ncclComm_t child;
  EXPECT_INVALID(ncclCommSplit(nullptr, 0, 0, &child, nullptr));
  EXPECT_INVALID(ncclCommSplit(f.c, 0, 0, nullptr, nullptr));
  EXPECT_INVALID(ncclCommSplit(f.c, -5, 0, &child, nullptr));
  int self[1] = {1}, range[1] = {4}, dup[2] = {2, 2};
  EXPECT_INVALID(ncclCommShrink(f.c, self, 1, &child, nullptr, NCCL_SHRINK_DEFAULT));
  EXPECT_INVALID(ncclCommShrink(f.c, range, 1, &child, nullptr, NCCL_SHRINK_DEFAULT));
  EXPECT_INVALID(ncclCommShrink(f.c, dup, 2, &child, nullptr, NCCL_SHRINK_DEFAULT));
  EXPECT_INVALID(ncclCommShrink(f.c, nullptr, 1, &child, nullptr, NCCL_SHRINK_DEFAULT));
  EXPECT_INVALID(ncclCommShrink(f.c, dup, 1, &child, nullptr, 0x10));
  EXPECT_INVALID(ncclCommShrink(f.c, dup, 1, nullptr, nullptr, NCCL_SHRINK_DEFAULT));
  // Excluding nobody is no shrink (NCCL: excludeRanksCount must be > 0).
  EXPECT_INVALID(ncclCommShrink(f.c, dup, 0, &child, nullptr, NCCL_SHRINK_DEFAULT));
  EXPECT_INVALID(ncclCommShrink(f.c, nullptr, 0, &child, nullptr, NCCL_SHRINK_DEFAULT));
}

// As NCCL: a failed init or split leaves *newcomm NULL, not what the caller had there.
TEST(ApiArgs, FailedCreationClearsNewcomm) {
  ncclComm_t const kStale = reinterpret_cast<ncclComm_t>(0x1234);
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  ncclComm_t comm = kStale;
  EXPECT_INVALID(ncclCommInitRank(&comm, 0, id, 0));
  EXPECT_EQ(comm, nullptr);
  comm = kStale;
  EXPECT_INVALID(ncclCommInitRank(&comm, 2, id, 5));
  EXPECT_EQ(comm, nullptr);
  comm = kStale;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0;
  EXPECT_INVALID(ncclCommInitRankConfig(&comm, 2, id, 0, &cfg));
  EXPECT_EQ(comm, nullptr);
  comm = kStale;
  EXPECT_INVALID(ncclCommInitRankScalable(&comm, 2, 0, 1, nullptr, nullptr));
  EXPECT_EQ(comm, nullptr);
  FakeComm f(1, 4);
  comm = kStale;
  EXPECT_INVALID(ncclCommSplit(f.c, -5, 0, &comm, nullptr));
  EXPECT_EQ(comm, nullptr);
  comm = kStale;
  EXPECT_INVALID(ncclCommSplit(f.c, 0, 0, &comm, &cfg));  // bad config
  EXPECT_EQ(comm, nullptr);
}

TEST(ApiArgs, MemAndDeviceApi) {
  void* p;
  EXPECT_INVALID(ncclMemAlloc(nullptr, 64));
  p = kBuf;
  EXPECT_EQ(ncclMemAlloc(&p, 0), ncclSuccess);  // as NCCL (cudaMalloc of 0 bytes)
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(ncclMemFree(nullptr), ncclSuccess);
  FakeComm f(0, 1);
  EXPECT_USAGE(ncclDevCommCreate(f.c, nullptr, nullptr));
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("device API"), std::string::npos);
  EXPECT_INVALID(ncclCommWindowRegister(f.c, kBuf, 4096, nullptr, 0));
  // As NCCL: a window of nothing is no error, and no window.
  ncclWindow_t w = reinterpret_cast<ncclWindow_t>(kBuf);
  EXPECT_EQ(ncclCommWindowRegister(f.c, nullptr, 4096, &w, 0), ncclSuccess);
  EXPECT_EQ(w, nullptr);
  w = reinterpret_cast<ncclWindow_t>(kBuf);
  EXPECT_EQ(ncclCommWindowRegister(f.c, kBuf, 0, &w, 0), ncclSuccess);
  EXPECT_EQ(w, nullptr);
  EXPECT_EQ(ncclCommWindowDeregister(f.c, nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommWindowDeregister(nullptr, nullptr), ncclSuccess);
}

}  // namespace

namespace {
// On a machine without a GPU, a well-formed init fails at once with a message instead of
// hanging in the bootstrap.
TEST(ApiNoGpu, InitFailsCleanlyWithoutAGpu) {
  std::string why;
  if (mktest::haveGpu(&why)) GTEST_SKIP() << "a GPU is present: this checks the no-GPU path";
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << "unique ids must work without a GPU";
  ncclComm_t comm = nullptr;
  auto t0 = std::chrono::steady_clock::now();
  mk::setLastError("");
  EXPECT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclUnhandledCudaError);
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("no usable CUDA device"), std::string::npos)
      << ncclGetLastError(nullptr);
  ncclComm_t comms[2] = {nullptr, nullptr};
  EXPECT_EQ(ncclCommInitAll(comms, 2, nullptr), ncclUnhandledCudaError);
  EXPECT_EQ(comms[0], nullptr);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  // The failed init never reached the root ncclGetUniqueId started; a one-rank bootstrap
  // on the same id ends it now (otherwise it waits for its timeout, and tests later in
  // this process that count live roots would see it).
  mk::Bootstrap* b = nullptr;
  ASSERT_EQ(mk::bootstrapInit(&id, 1, 0, 1, nullptr, &b), ncclSuccess);
  EXPECT_EQ(mk::bootstrapClose(b), ncclSuccess);
}
}  // namespace
