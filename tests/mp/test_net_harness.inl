// Declarations of the multi-process harness (test_net_harness.cc), included by the net
// and proxy tests. (.inl: the test globs compile *.cc only.)
#pragma once
#include <nccl.h>

#include <functional>
#include <vector>

namespace mknet {

struct Ctx {
  int rank;
  int nranks;
  int hubFd;
};

// Forks nranks processes running body(ctx); the calling process serves hub requests until
// all exit (killing them after timeoutSec). Returns each rank's exit code (128+signal when
// killed by a signal). body returns 0 on success; gtest failures in a rank also count.
std::vector<int> runRanks(int nranks, const std::function<int(const Ctx&)>& body, int timeoutSec);
// send: nranks blocks of `bytes`, block p for rank p; recv: block p from rank p.
ncclResult_t hubAllToAll(const Ctx& ctx, const void* send, void* recv, size_t bytes);
ncclResult_t hubBarrier(const Ctx& ctx);

}  // namespace mknet
