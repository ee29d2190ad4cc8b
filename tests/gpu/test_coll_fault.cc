// Faults: a collective waiting for a peer that never comes is ended by ncclCommAbort from
// another thread (promptly, without poisoning the GPU: a new comm works afterwards), and
// by MKERNEL_TIMEOUT_MS, which surfaces as ncclRemoteError naming the peer.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gpu/test_proc_util.h"
#include "common/test_util.h"
#include "base/param.h"
#include "gpu/test_coll_util.h"

using namespace colltest;

namespace {

using gputest::Clock;
using gputest::since;
using gputest::streamCompleted;

struct Pair {
  ncclComm_t comms[2] = {nullptr, nullptr};
  cudaStream_t streams[2] = {nullptr, nullptr};
  bool ok = false;
  Pair() {
    int devs[2] = {0, 0};
    ok = ncclCommInitAll(comms, 2, devs) == ncclSuccess;
    cudaSetDevice(0);
    for (auto& s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  }
  ~Pair() {
    for (auto c : comms)
      if (c) ncclCommAbort(c);
    for (auto s : streams)
      if (s) cudaStreamDestroy(s);
  }
};

// Sets an environment parameter for the scope (and re-reads parameters).
struct EnvScope {
  std::string name, old;
  bool had;
  EnvScope(const char* n, const char* v) : name(n) {
    const char* o = getenv(n);
    had = o != nullptr;
    if (o) old = o;
    setenv(n, v, 1);
    mk::paramReset();
  }
  ~EnvScope() {
    if (had)
      setenv(name.c_str(), old.c_str(), 1);
    else
      unsetenv(name.c_str());
    mk::paramReset();
  }
};

void allReduceWorks() {
  Pair p;
  ASSERT_TRUE(p.ok) << ncclGetLastError(nullptr);
  const size_t count = 1 << 20;
  DevBuf b0(count * 4), b1(count * 4);
  std::vector<float> h(count, 1.5f);
  mktest::syncMemcpy(b0.base, h.data(), count * 4, cudaMemcpyHostToDevice);
  mktest::syncMemcpy(b1.base, h.data(), count * 4, cudaMemcpyHostToDevice);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(b0.base, b0.base, count, ncclFloat32, ncclSum, p.comms[0], p.streams[0]),
            ncclSuccess);
  ASSERT_EQ(ncclAllReduce(b1.base, b1.base, count, ncclFloat32, ncclSum, p.comms[1], p.streams[1]),
            ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  ASSERT_TRUE(streamCompleted(p.streams[0], 30) && streamCompleted(p.streams[1], 30));
  mktest::syncMemcpy(h.data(), b1.base, count * 4, cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < count; i++) ASSERT_EQ(h[i], 3.0f) << i;
}

TEST(CollFault, AbortWhileWaitingForAbsentPeer) {
  MKTEST_REQUIRE_GPU();
  {
    Pair p;
    ASSERT_TRUE(p.ok) << ncclGetLastError(nullptr);
    const size_t count = 1 << 20;
    DevBuf buf(count * 4);
    // Rank 0 joins, rank 1 never does.
    ASSERT_EQ(
        ncclAllReduce(buf.base, buf.base, count, ncclFloat32, ncclSum, p.comms[0], p.streams[0]),
        ncclSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(cudaStreamQuery(p.streams[0]), cudaErrorNotReady)
        << "the AllReduce should still be waiting for rank 1";
    double took = -1;
    ncclResult_t res = ncclInternalError;
    std::thread aborter([&] {
      auto t0 = Clock::now();
      res = ncclCommAbort(p.comms[0]);
      took = since(t0);
    });
    aborter.join();
    p.comms[0] = nullptr;
    EXPECT_EQ(res, ncclSuccess);
    EXPECT_LT(took, 5.0) << "ncclCommAbort must return promptly";
    EXPECT_TRUE(streamCompleted(p.streams[0], 5)) << "the kernel must leave after the abort";
    EXPECT_EQ(ncclCommAbort(p.comms[1]), ncclSuccess);
    p.comms[1] = nullptr;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the CUDA context must stay usable";
  allReduceWorks();
}

TEST(CollFault, TimeoutNamesThePeer) {
  MKTEST_REQUIRE_GPU();
  EnvScope timeout("MKERNEL_TIMEOUT_MS", "1000");
  struct Case {
    const char* what;
    const char* opName;
  };
  for (Case k : {Case{"AllReduce", "AllReduce"}, Case{"Recv", "Send/Recv"},
                 Case{"Broadcast", "Broadcast"}}) {
    SCOPED_TRACE(k.what);
    Pair p;
    ASSERT_TRUE(p.ok) << ncclGetLastError(nullptr);
    const size_t count = 1 << 16;
    DevBuf buf(count * 4);
    ncclResult_t r = ncclInternalError;
    if (std::string(k.what) == "AllReduce")
      r = ncclAllReduce(buf.base, buf.base, count, ncclFloat32, ncclSum, p.comms[0], p.streams[0]);
    else if (std::string(k.what) == "Recv")
      r = ncclRecv(buf.base, count, ncclFloat32, 1, p.comms[0], p.streams[0]);
    else
      r = ncclBroadcast(buf.base, buf.base, count, ncclFloat32, 1, p.comms[0], p.streams[0]);
    ASSERT_EQ(r, ncclSuccess);
    auto t0 = Clock::now();
    ncclResult_t async = ncclSuccess;
    while (async == ncclSuccess && since(t0) < 30) {
      ASSERT_EQ(ncclCommGetAsyncError(p.comms[0], &async), ncclSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(async, ncclRemoteError);
    std::string msg = ncclGetLastError(p.comms[0]);
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find(k.opName), std::string::npos) << msg;
    EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
    EXPECT_TRUE(streamCompleted(p.streams[0], 5)) << "the kernel must leave after the timeout";
    // The comm is unusable now: later calls report the error instead of hanging.
    EXPECT_NE(
        ncclAllReduce(buf.base, buf.base, count, ncclFloat32, ncclSum, p.comms[0], p.streams[0]),
        ncclSuccess);
  }
  allReduceWorks();
}

}  // namespace
