// Generic kernels over the device communication API (devcomm.cuh), for the GPU tests and
// the benchmarks: a list of sends (put / put_signal / signal) and a list of receives
// (wait_signal, then copy what landed to an output buffer), spread over the CTAs.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "transport/net_state.h"

namespace mk {

enum NetTestFlags : uint32_t {
  kNetTestSignal = 1,    // put_signal (bytes may be 0: a plain signal)
  kNetTestAdd = 2,       // signal with kSignalAdd instead of kSignalSet
  kNetTestZeroCopy = 4,  // copy src to send_ptr(srcOff) first, then put from there
  kNetTestSplit = 8,     // put, then a separate signal() call
  kNetTestQuiet = 16,    // quiet() after this send
};

struct NetTestOp {
  int32_t peer;     // send: destination rank; receive: the rank that sends it
  uint32_t flags;   // NetTestFlags (sends)
  uint64_t srcOff;  // send: offset in src (and in the zero-copy area with kNetTestZeroCopy)
  uint64_t dstOff;  // offset in the destination window
  uint64_t bytes;
  uint64_t outOff;  // receive: where the landed bytes go in out
  uint32_t slot;
  uint32_t pad;
  uint64_t value;  // send: signal value; receive: wait until the slot reaches it
};

struct NetTestArgs {
  NetDev d;
  const NetTestOp* sends;  // device memory
  int nSends;
  const NetTestOp* recvs;  // device memory
  int nRecvs;
  const char* src;
  char* out;
  int* status;  // [grid]: 0 ok, s + 1 = send s failed, 1000000 + r + 1 = receive r failed
  int quietAtEnd;
  int warpScope;  // 1: each warp runs its own ops with the Warp group (blockDim % 32 == 0)
};

// Op i goes to CTA (i % grid) (or to warp i % (grid * warps) with warpScope).
cudaError_t launchNetTest(const NetTestArgs& a, int grid, int threads, cudaStream_t s);

}  // namespace mk
