// The reference fused operator (the anatomy every operator in fused/ops/ follows, see
// fused/README.md): D = A·B on the compute CTAs, each finished tile published through a
// per-tile flag, and communication CTAs that pass every tile of D to the next rank of the
// node (a ring over its local ranks) through the comm's channels as soon as its flag is
// released, while receiving the previous rank's tiles into `recv`. Real work on a real
// comm, checked element-wise by tests/gpu/test_fused_example.cc; the shape of
// GEMM + AllGather/ReduceScatter without the reduction.
#pragma once
#include <cstdint>
#include <string>
#include <cuda_runtime.h>
#include <nccl.h>

#include "fused/core/types.h"
#include "fused/gemm/gemm.h"

struct ncclComm;

namespace mk {
namespace fused {
namespace example {

// 1. Args. Every rank of the node passes the same M, N (K may differ).
struct Args {
  gemm::GemmArgs gemm;            // bf16 in, bf16 out; hooks are set by launch()
  void* recv = nullptr;           // [M, N] bf16: gets D of the previous local rank
  int64_t ldRecv = 0;             // 0 = N
  uint64_t* tileFlags = nullptr;  // tilesM * tilesN flags in device memory, zeroed once per
                                  // comm; they hold the number of the last call
  uint64_t* recvFlags = nullptr;  // optional, tilesM * tilesN: the call number (1, 2, ...)
                                  // once that tile of recv is written
  int commSms = -1;               // -1: MKERNEL_FUSED_COMM_SMS or the cost model
};

// 2. Config: compile-time shape and budgets (the run-time SmSplit comes from resolveSplit()).
struct Config {
  static constexpr int kThreads = 384;    // = gemm::kThreads: compute CTAs run the GEMM CTA
  static constexpr int kMaxLanes = 4;     // channel lanes per direction (<= ws.lanes)
  static constexpr int kMinCommCtas = 2;  // one sending and one receiving CTA at least
};

// 3. Host-only checks of the arguments (no CUDA call, no comm needed).
bool canImplement(const Args& args, std::string* why);

// 4. Launch: one persistent cooperative kernel on `comm`, enqueued like a collective.
// `splitOut` (optional) reports the SM split chosen.
ncclResult_t launch(const Args& args, ncclComm* comm, cudaStream_t stream,
                    SmSplit* splitOut = nullptr);

}  // namespace example
}  // namespace fused
}  // namespace mk
