// Windows and the zero-copy plan without a GPU: argument checks of ncclCommWindowRegister /
// ncclCommWindowDeregister (ncclInvalidArgument + message before any CUDA call, inside and
// outside a group), the table of buffers each collective touches remotely, and the
// reduction plan of the zero-copy ReduceScatter / Reduce.
#include <cstdint>
#include <functional>
#include <gtest/gtest.h>
#include <nccl.h>
#include <string>

#include "base/debug.h"
#include "coll/algo.h"
#include "coll/redop.h"
#include "coll/zc_plan.h"
#include "comm/comm.h"
#include "unit/fake_comm.h"

namespace {

using unittest::FakeComm;

void expectErr(ncclResult_t expected, const std::function<ncclResult_t()>& call, const char* what,
               const char* needle = nullptr) {
  mk::setLastError("");
  ncclResult_t r = call();
  EXPECT_EQ(r, expected) << what;
  std::string msg = ncclGetLastError(nullptr);
  EXPECT_NE(msg, "") << what << ": no message";
  if (needle) EXPECT_NE(msg.find(needle), std::string::npos) << what << ": " << msg;
}

void* const kBuf = reinterpret_cast<void*>(0x10000);  // never dereferenced: checks fail first

TEST(WindowArgs, RegisterRejectsBadInput) {
  FakeComm f(0, 2);
  ncclWindow_t w = reinterpret_cast<ncclWindow_t>(0x1);
  expectErr(
      ncclInvalidArgument, [&] { return ncclCommWindowRegister(nullptr, kBuf, 4096, &w, 0); },
      "null comm");
  expectErr(
      ncclInvalidArgument, [&] { return ncclCommWindowRegister(f.c, kBuf, 4096, nullptr, 0); },
      "null win", "win is NULL");
  // As NCCL: a NULL buffer or size 0 is no error, and no window.
  EXPECT_EQ(ncclCommWindowRegister(f.c, nullptr, 4096, &w, 0), ncclSuccess);
  EXPECT_EQ(w, nullptr) << "the handle is cleared before anything can fail";
  w = reinterpret_cast<ncclWindow_t>(0x1);
  EXPECT_EQ(ncclCommWindowRegister(f.c, kBuf, 0, &w, 0), ncclSuccess);
  EXPECT_EQ(w, nullptr);
  expectErr(
      ncclInvalidArgument, [&] { return ncclCommWindowRegister(f.c, kBuf, 4096, &w, 0x40); },
      "unknown flags", "winFlags");
  // Valid arguments, but the comm has no peer memory: refused before any CUDA call.
  expectErr(
      ncclInvalidArgument,
      [&] { return ncclCommWindowRegister(f.c, kBuf, 4096, &w, NCCL_WIN_COLL_SYMMETRIC); },
      "no peer memory", "peer memory");
  EXPECT_EQ(w, nullptr);
}

TEST(WindowArgs, RegisterOnAFinalizedCommIsMisuse) {
  FakeComm f(0, 2);
  f.c->state.store(mk::CommState::kFinalized);
  ncclWindow_t w = nullptr;
  expectErr(
      ncclInvalidUsage, [&] { return ncclCommWindowRegister(f.c, kBuf, 4096, &w, 0); },
      "finalized comm", "finalized");
}

TEST(WindowArgs, FailureInsideAGroupIsReturnedByGroupEnd) {
  FakeComm f(0, 2);
  ncclWindow_t w = nullptr;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclCommWindowRegister(f.c, kBuf, 4096, &w, 0x40), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  EXPECT_EQ(w, nullptr);
}

TEST(WindowArgs, Deregister) {
  FakeComm f(0, 2);
  EXPECT_EQ(ncclCommWindowDeregister(f.c, nullptr), ncclSuccess) << "NULL is a no-op, as NCCL";
  expectErr(
      ncclInvalidArgument,
      [&] { return ncclCommWindowDeregister(f.c, reinterpret_cast<ncclWindow_t>(kBuf)); },
      "unknown window");
  expectErr(
      ncclInvalidArgument,
      [&] { return ncclCommWindowDeregister(nullptr, reinterpret_cast<ncclWindow_t>(kBuf)); },
      "null comm");
  // As NCCL: a NULL window is a no-op before the comm is looked at.
  EXPECT_EQ(ncclCommWindowDeregister(nullptr, nullptr), ncclSuccess);
}

mk::CollArgs args(mk::CollType t, const void* s, void* r, size_t count, int root = 0) {
  mk::CollArgs a{};
  a.type = t;
  a.sendbuff = s;
  a.recvbuff = r;
  a.count = count;
  a.dtype = ncclFloat32;
  a.op = ncclSum;
  a.root = root;
  return a;
}

// Which buffers the peers touch decides which must be registered (or in windows).
TEST(ZeroCopyPlan, RemoteBuffersOfEachCollective) {
  using mk::CollType;
  char* s = reinterpret_cast<char*>(0x100000);
  char* r = reinterpret_cast<char*>(0x900000);
  const int n = 4;
  const size_t cnt = 1000;
  const uint64_t B = cnt * 4;
  struct Want {
    CollType t;
    bool send, recv;
    uint64_t sendBytes, recvBytes, msg;
  } want[] = {
      {CollType::kAllReduce, true, true, B, B, B},
      {CollType::kReduceScatter, true, false, n * B, 0, n * B},
      {CollType::kAllGather, true, false, B, 0, n * B},
      {CollType::kReduce, true, false, B, 0, B},
      {CollType::kGather, true, false, B, 0, n * B},
      {CollType::kAlltoAll, true, false, n * B, 0, n * B},
      {CollType::kBroadcast, false, true, 0, B, B},
      {CollType::kScatter, false, true, 0, B, n * B},
      {CollType::kSend, false, false, 0, 0, 0},
      {CollType::kRecv, false, false, 0, 0, 0},
  };
  for (const Want& w : want) {
    mk::ZcRemote rm = mk::zcRemoteOf(args(w.t, s, r, cnt), n);
    SCOPED_TRACE(mk::collName(w.t));
    EXPECT_EQ(rm.send, w.send);
    EXPECT_EQ(rm.recv, w.recv);
    EXPECT_EQ(rm.sendBytes, w.sendBytes);
    EXPECT_EQ(rm.recvBytes, w.recvBytes);
    EXPECT_EQ(rm.msgBytes, w.msg);
  }
  // In-place AlltoAll (or any overlap) stages: a rank would overwrite blocks still being read.
  mk::ZcRemote a2a = mk::zcRemoteOf(args(CollType::kAlltoAll, s, s + B, cnt), n);
  EXPECT_FALSE(a2a.send || a2a.recv);
  a2a = mk::zcRemoteOf(args(CollType::kAlltoAll, s, s, cnt), n);
  EXPECT_FALSE(a2a.send || a2a.recv);
  a2a = mk::zcRemoteOf(args(CollType::kAlltoAll, s, s + n * B, cnt), n);
  EXPECT_TRUE(a2a.send) << "adjacent, not overlapping";
}

TEST(ZeroCopyPlan, ReductionPlans) {
  mk::WsLayout ws{};
  ASSERT_EQ(mk::wsLayoutCompute(64ull << 20, 4, &ws), ncclSuccess);
  for (mk::CollType t : {mk::CollType::kReduceScatter, mk::CollType::kReduce}) {
    mk::ReducePlan p = mk::planReduce(t, mk::Algo::kZeroCopy, 12345, 4, 4, ws);
    EXPECT_EQ(p.algo, mk::Algo::kZeroCopy) << mk::collName(t);
    EXPECT_EQ(p.segElems, 12345u);
    EXPECT_EQ(p.nChunks, 1u) << "one pass, never empty";
    EXPECT_EQ(p.lanes, 1);
    EXPECT_EQ(mk::planReduce(t, mk::Algo::kZeroCopy, 0, 4, 4, ws).nChunks, 0u) << "count 0";
    // Other forced algorithms do not apply to these collectives.
    EXPECT_EQ(mk::planReduce(t, mk::Algo::kRing, 12345, 4, 4, ws).algo, mk::Algo::kDirect);
  }
  mk::ReducePlan ar = mk::planReduce(mk::CollType::kAllReduce, mk::Algo::kZeroCopy, 1001, 4, 4, ws);
  EXPECT_EQ(ar.algo, mk::Algo::kZeroCopy);
  EXPECT_EQ(ar.segElems, 252u) << "a quarter, rounded up to 16 bytes";
}

}  // namespace
