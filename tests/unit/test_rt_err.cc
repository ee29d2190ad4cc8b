// The one host poller of device error records (device/rt/err_host.h): the result code and a
// message naming rank, peer and operation, for records of the collectives, the device
// communication API and fused operators alike (no GPU needed).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "device/rt/err_host.h"

using namespace mk;

namespace {

bool has(const std::string& m, const char* s) {
  return m.find(s) != std::string::npos;
}

// A published timeout record of operation `op` waiting for `peer`.
rt::ErrRecord timeoutRecord(int32_t op, int32_t peer, int32_t wait) {
  rt::ErrRecord e{};
  e.valid = 1;
  e.kind = rt::kErrTimeout;
  e.op = op;
  e.peer = peer;
  e.wait = wait;
  return e;
}

}  // namespace

TEST(RtErr, NetRecords) {
  std::string m;
  rt::ErrRecord e = timeoutRecord(rt::kOpWaitSignal, 5, rt::kWaitSignal);
  e.rank = 1;
  e.lane = 2;
  e.slot = 7;
  e.seq = 42;
  e.waitedNs = 1500000000ull;
  rt::ErrNames n;
  n.rank = 1;
  n.timeoutMs = 1500;
  EXPECT_EQ(rt::describe(e, n, &m), ncclRemoteError);
  EXPECT_TRUE(has(m, "rank 1")) << m;
  EXPECT_TRUE(has(m, "rank 5")) << m;
  EXPECT_TRUE(has(m, "slot 7")) << m;
  EXPECT_TRUE(has(m, "42")) << m;
  EXPECT_TRUE(has(m, "MKERNEL_TIMEOUT_MS=1500")) << m;

  e.op = rt::kOpPutSignal;
  e.wait = rt::kWaitRing;
  EXPECT_EQ(rt::describe(e, n, &m), ncclRemoteError);
  EXPECT_TRUE(has(m, "proxy command ring")) << m;
  EXPECT_TRUE(has(m, "put_signal")) << m;

  e.kind = rt::kErrAbort;
  EXPECT_EQ(rt::describe(e, n, &m), ncclSystemError);
  EXPECT_TRUE(has(m, "aborted")) << m;

  e.kind = rt::kErrProxy;
  n.proxyMsg = "proxy rank 1, peer rank 5: receive failed";
  EXPECT_EQ(rt::describe(e, n, &m), ncclRemoteError);
  EXPECT_TRUE(has(m, "proxy rank 1, peer rank 5")) << m;

  e.kind = rt::kErrArgs;
  e.op = rt::kOpPut;
  e.wait = rt::kWaitNone;
  e.seq = 1000;
  e.waitedNs = 99;
  EXPECT_EQ(rt::describe(e, n, &m), ncclInvalidUsage);
  EXPECT_TRUE(has(m, "dst_offset 1000 + 99 bytes")) << m;
}

// A comm whose rank streams may share hardware queues (ncclComm::queueHint) says so in the
// timeouts that blame a peer of this process (Topo::inMyProcess), and only there: a peer elsewhere,
// or a stalled proxy, keeps its own blame.
TEST(RtErr, QueueHintFollowsPeerTimeouts) {
  std::string m;
  rt::ErrRecord e = timeoutRecord(rt::kOpWaitSignal, 2, rt::kWaitData);
  rt::ErrNames n;
  n.rank = 0;
  EXPECT_EQ(rt::describe(e, n, &m), ncclRemoteError);
  EXPECT_TRUE(has(m, "rank 2 did not join the operation or failed (MKERNEL_TIMEOUT_MS")) << m;
  // As long as topoQueueHint's longest (under 400 characters): the message keeps its end.
  const std::string hint = "3 ranks share queues" + std::string(400, '.');
  n.hint = hint.c_str();
  const uint8_t sharing[3] = {1, 0, 1};  // ranks 0 and 2 are threads of this process
  n.hintPeers = sharing;
  n.nHintPeers = 3;
  EXPECT_EQ(rt::describe(e, n, &m), ncclRemoteError);
  EXPECT_TRUE(has(m, "did not join the operation or failed (3 ranks share queues")) << m;
  EXPECT_TRUE(has(m, "....) (MKERNEL_TIMEOUT_MS=")) << m;
  e.peer = 1;  // another process (or node): its queues are not this process's
  EXPECT_EQ(rt::describe(e, n, &m), ncclRemoteError);
  EXPECT_FALSE(has(m, "share queues")) << m;
  e.peer = 2;
  e.wait = rt::kWaitRing;
  EXPECT_EQ(rt::describe(e, n, &m), ncclRemoteError);
  EXPECT_FALSE(has(m, "share queues")) << m;
}

// Collective records name peers by local index: the poller maps them to comm ranks.
TEST(RtErr, CollectiveRecordsNameTheCommRank) {
  std::string m;
  rt::ErrRecord e{};
  e.valid = 1;
  e.kind = rt::kErrTimeout;
  e.op = rt::kOpAllReduce;
  e.peer = 1;  // local index 1 of node {4, 5, 6}: rank 5
  e.flags = rt::kErrPeerLocal;
  e.wait = rt::kWaitData;
  e.seq = 3;
  e.waitedNs = 2000000000ull;
  const int node[3] = {4, 5, 6};
  rt::ErrNames n;
  n.rank = 4;
  n.localRanks = node;
  n.nLocal = 3;
  n.timeoutMs = 2000;
  EXPECT_EQ(rt::describe(e, n, &m), ncclRemoteError);
  EXPECT_TRUE(has(m, "rank 4: AllReduce timed out")) << m;
  EXPECT_TRUE(has(m, "waiting for rank 5 to send its data")) << m;
  EXPECT_TRUE(has(m, "MKERNEL_TIMEOUT_MS=2000")) << m;

  e.op = rt::kOpRecv;
  e.wait = rt::kWaitSlot;
  EXPECT_EQ(rt::describe(e, n, &m), ncclRemoteError);
  EXPECT_TRUE(has(m, "Send/Recv")) << m;
  EXPECT_TRUE(has(m, "rank 5 to free a workspace slot")) << m;
}

TEST(RtErr, FusedRecordsNameTheOperator) {
  std::string m;
  rt::ErrRecord e{};
  e.valid = 1;
  e.kind = rt::kErrTimeout;
  e.op = rt::kOpExample;
  e.peer = 1;
  e.flags = rt::kErrPeerLocal;
  e.wait = rt::kWaitData;
  rt::ErrNames n;
  n.rank = 0;
  const int node[2] = {0, 1};
  n.localRanks = node;
  n.nLocal = 2;
  EXPECT_EQ(rt::describe(e, n, &m), ncclRemoteError);
  EXPECT_TRUE(has(m, "fused example")) << m;
  EXPECT_TRUE(has(m, "rank 1")) << m;
  for (int32_t op = rt::kOpFusedFirst; op < rt::kOpFusedEnd; ++op)
    EXPECT_STRNE(rt::opName(op), "device operation") << "fused op " << op << " has no name";

  e.kind = rt::kErrOverflow;
  e.op = rt::kOpMoe;
  e.seq = 4097;
  EXPECT_EQ(rt::describe(e, n, &m), ncclInvalidUsage);
  EXPECT_TRUE(has(m, "MoeDispatchGemm")) << m;
  EXPECT_TRUE(has(m, "4097")) << m;
  // A receiver's own bound (no peer): the rows needed and the bound.
  e.peer = -1;
  e.flags = 0;
  e.waitedNs = 4096;
  EXPECT_EQ(rt::describe(e, n, &m), ncclInvalidUsage);
  EXPECT_TRUE(has(m, "4097 rows")) << m;
  EXPECT_TRUE(has(m, "4096 rows")) << m;
  // The dispatch's bad expert id: the slot and the id.
  e.kind = rt::kErrArgs;
  e.seq = 17;
  e.waitedNs = (uint64_t)(uint32_t)-5;
  EXPECT_EQ(rt::describe(e, n, &m), ncclInvalidUsage);
  EXPECT_TRUE(has(m, "slot 17")) << m;
  EXPECT_TRUE(has(m, "-5")) << m;
  // The node dedup's gateway forwarded other rows than announced (an internal error).
  e.kind = rt::kErrProtocol;
  e.peer = 6;
  e.slot = -3;
  e.seq = 12;
  e.waitedNs = 13;
  EXPECT_EQ(rt::describe(e, n, &m), ncclInternalError);
  EXPECT_TRUE(has(m, "forwarded 12 token rows to rank 6")) << m;
  EXPECT_TRUE(has(m, "announced 13")) << m;
  EXPECT_TRUE(has(m, "MKERNEL_MOE_NODE_DEDUP")) << m;
  // The fused MoE layer's combine met a peer on the sequential path (the caller's mistake).
  e.op = rt::kOpMoeCombine;
  e.peer = 2;
  e.slot = -4;
  EXPECT_EQ(rt::describe(e, n, &m), ncclInvalidUsage);
  EXPECT_TRUE(has(m, "rank 2 ran this call on the sequential path")) << m;
  EXPECT_TRUE(has(m, "MoeDispatchFfnCombine")) << m;
}

// poll() reports a record once, and only after the device published it (valid).
TEST(RtErr, PollReportsOnce) {
  rt::ErrRecord e{};
  e.kind = rt::kErrAbort;
  e.op = rt::kOpBroadcast;
  e.peer = -1;
  std::atomic<bool> reported{false};
  rt::ErrNames n;
  n.rank = 3;
  ncclResult_t res = ncclSuccess;
  std::string m;
  EXPECT_FALSE(rt::poll(&e, &reported, n, &res, &m)) << "not valid yet";
  e.valid = 1;
  ASSERT_TRUE(rt::poll(&e, &reported, n, &res, &m));
  EXPECT_EQ(res, ncclSystemError);
  EXPECT_TRUE(has(m, "rank 3: Broadcast aborted")) << m;
  EXPECT_FALSE(rt::poll(&e, &reported, n, &res, &m)) << "reported twice";
}
