// Helpers of the device communication API tests (test_devcomm*.cc): ranks sharing GPU 0
// in virtual nodes, per-rank plans of sends and receives run by the generic kernel of
// src/device/net/devcomm_kernels.cu, and the checks.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include <memory>
#include <nccl.h>
#include <string>
#include <vector>

#include "device/net/devcomm_kernels.h"

namespace dctest {

// Sets an environment variable for the scope (and re-reads mkernel's parameters).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// The environment every test of the suite runs with: virtual nodes, socket backend on
// loopback, small windows. windowBytes also sizes the collectives' workspace.
struct TestEnv {
  TestEnv(int nodes, size_t windowBytes = 4 << 20, int ringSlots = 0, int timeoutMs = 60000);
  std::vector<ScopedEnv*> vars;
  ~TestEnv();
  TestEnv(const TestEnv&) = delete;
  TestEnv& operator=(const TestEnv&) = delete;
};

// The collectives' view of virtual nodes: n ranks on GPU 0 in `nodes` virtual nodes (one
// thread drives them all through groups), 1 MiB windows so large counts take several
// chunks, a non-blocking stream per rank. sync() waits for every stream and reports the
// first stream or asynchronous error.
struct VnodeComms {
  int n = 0;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  std::unique_ptr<TestEnv> env;
  ncclResult_t init(int nodes, int nRanks);
  std::string sync();
  VnodeComms() = default;
  VnodeComms(const VnodeComms&) = delete;
  VnodeComms& operator=(const VnodeComms&) = delete;
  ~VnodeComms();
};

// n ranks on GPU 0 (ncclCommInitAll with a repeated device). When api/init.cc does not
// call netInit yet, makeRanks calls it on one thread per rank and the destructor calls
// netFini before destroying the comms (`wired` says which).
struct Ranks {
  int n = 0;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  bool wired = false;
  bool broken = false;  // tear down with aborts
  Ranks() = default;
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;
  ~Ranks();
};
std::string makeRanks(int n, Ranks* out);
// Stops one rank for good ("kills" it): abort flag, netAbort, (netFini when not wired),
// ncclCommAbort. Its stream must not have a kernel of ours still running unless the abort
// is what should end it: the call waits (bounded) for the stream before freeing.
void killRank(Ranks& r, int rank, double waitS = 10);

struct Plan {
  std::vector<mk::NetTestOp> sends, recvs;
  std::vector<uint8_t> src;
  size_t outBytes = 0;
  int grid = 1, threads = 256;
  bool warpScope = false;
  bool quietAtEnd = true;
};
// One launched plan: device buffers (freed by the destructor, after the stream is idle).
struct Launch {
  int rank = -1;
  cudaStream_t stream = nullptr;
  void *src = nullptr, *sends = nullptr, *recvs = nullptr, *out = nullptr, *status = nullptr;
  int grid = 0;
  size_t outBytes = 0;
  Launch() = default;
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;
  ~Launch();
};
std::string startPlan(Ranks& r, int rank, const Plan& p, Launch* l);
// Polls until the stream is idle (true) or timeoutS passes (false).
bool streamDone(cudaStream_t s, double timeoutS);
// Downloads the output and the per-CTA status (after the stream is idle).
std::string finishPlan(Launch& l, std::vector<uint8_t>* out, std::vector<int>* status);
// Runs one plan per rank at once; on timeout or a reported error it aborts the kernels
// (abort flags) and describes what happened, per rank, with every async error message.
std::string runPlans(Ranks& r, const std::vector<Plan>& plans, double timeoutS,
                     std::vector<std::vector<uint8_t>>* outs);
// netPollAsyncError + ncclCommGetAsyncError of one rank: the result and its message.
ncclResult_t asyncError(ncclComm_t c, std::string* msg);

// Random exchange between every pair of ranks (also a rank with itself): sender s puts
// size(s, d) bytes into region s of d's window and sets slot s to iter + 1 (put_signal;
// some pairs zero-copy, some put + signal), and adds 1 to slot kAddSlot of d; receiver d
// waits for every slot and copies what landed to region s of its output.
constexpr uint32_t kAddSlot = mk::kNetSignals - 1;
struct Exchange {
  int n = 0;
  size_t region = 0;
  std::vector<Plan> plans;
  std::vector<std::vector<size_t>> size;  // [src][dst]
  std::vector<std::vector<size_t>> mis;   // [src][dst] dst misalignment (bytes)
};
Exchange makeExchange(int n, size_t windowBytes, uint64_t seed, int iter, bool warpScope);
// "" when every byte of every rank's output is right (and the bytes after each landed
// range are still the poison).
// Ranks whose output is empty are skipped when onlyPresent (multi-process children check
// their own ranks).
std::string checkExchange(const Exchange& x, const std::vector<std::vector<uint8_t>>& outs,
                          bool onlyPresent = false);
// Bytes of the exchange that cross (virtual) nodes, per rank: sent and received.
void remoteBytes(const Exchange& x, int nodes, std::vector<uint64_t>* sent,
                 std::vector<uint64_t>* recv);

// The fused operators' tests' view: n ranks on GPU 0 over `nodes` virtual nodes
// (ncclCommInitAll under a TestEnv), one stream each, built in the constructor; `why` says what
// failed. abortAll() after a failure, before the call's buffers are freed: kernels may still wait
// for peers.
struct FusedVnodes {
  int n = 0;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  std::unique_ptr<TestEnv> env;
  std::string why;
  // 1 MiB windows by default (several chunks per call); a hang ends after timeoutMs on the
  // device.
  FusedVnodes(int nodes, int nRanks, size_t window = 1 << 20, int timeoutMs = 20000)
      : n(nRanks), comms(nRanks, nullptr), streams(nRanks, nullptr) {
    env.reset(new TestEnv(nodes, window, 0, timeoutMs));
    std::vector<int> devs(n, 0);
    const ncclResult_t r = ncclCommInitAll(comms.data(), n, devs.data());
    if (r != ncclSuccess) {
      why = std::string("ncclCommInitAll: ") + ncclGetErrorString(r) + ": " +
            ncclGetLastError(nullptr);
      comms.assign(n, nullptr);
      return;
    }
    cudaSetDevice(0);
    for (auto& s : streams)
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
        why = "cudaStreamCreate failed";
  }
  FusedVnodes(const FusedVnodes&) = delete;
  FusedVnodes& operator=(const FusedVnodes&) = delete;
  bool ok() const { return why.empty(); }
  void abortAll() {
    for (auto& c : comms)
      if (c) ncclCommAbort(c);
    comms.assign(n, nullptr);
  }
  ~FusedVnodes() {
    for (auto c : comms)
      if (c) ncclCommDestroy(c);
    for (auto s : streams)
      if (s) cudaStreamDestroy(s);
  }
};

}  // namespace dctest
