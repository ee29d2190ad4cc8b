// The reference fused operator of the role framework: D = A·B on the compute CTAs, each
// finished tile published through a per-tile flag, and "communication" CTAs that copy every
// tile to a second buffer as soon as its flag is released (the shape of GEMM+AllReduce with
// the remote push replaced by a local copy). Real work, checked element-wise by
// tests/gpu/test_gemm_fused.cu.
#pragma once
#include <cstdint>
#include <string>

#include "device/rt/err_host.h"
#include "fused/core/framework.h"
#include "fused/gemm/gemm.h"

namespace mk {
namespace fused {

// 1. Args
struct GemmCopyArgs {
  gemm::GemmArgs gemm;                 // bf16 in, bf16 out; its hooks.tileDone* are set by launch()
  void* copyDst = nullptr;             // [M, N] bf16, receives every tile of D
  int64_t ldCopy = 0;                  // 0 = N
  uint64_t* tileFlags = nullptr;       // tilesM*tilesN flags, device memory, never reset
  uint64_t* copyFlags = nullptr;       // optional: set to seq once a tile is copied
  uint64_t seq = 0;                    // this call's sequence number (> every earlier call's)
  int commSms = -1;                    // -1: MKERNEL_FUSED_COMM_SMS or the cost model
  const rt::Domain* domain = nullptr;  // abort flag + error record
  int64_t timeoutMs = 0;               // 0: MKERNEL_TIMEOUT_MS
};

// 2. Config: compile-time part (the run-time part is the SmSplit from resolveSplit()).
struct GemmCopyConfig {
  static constexpr int kThreads = 384;
  static constexpr int kCopyThreads = 384;
};

// 3. Host-only checks.
bool canImplement(const GemmCopyArgs& args, std::string* why);

// 4. Launch (one persistent cooperative kernel). `splitOut` (optional) reports the split.
ncclResult_t launch(const GemmCopyArgs& args, cudaStream_t stream, SmSplit* splitOut = nullptr);

}  // namespace fused
}  // namespace mk
