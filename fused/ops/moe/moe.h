// MoE operators (include/mkernel/fused.h): ncclMoeDispatchGemm. One call = one MoeCall,
// checked on the host (moeCheck: every rule before any CUDA call), then run as the dispatch
// kernel (routing counts exchanged on the device, token rows pushed into the owners' packed
// layouts) followed by mkernel's grouped GEMM, both on the caller's stream.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>
#include <nccl.h>

#include "mkernel/fused.h"

struct ncclComm;

namespace mk {
namespace fused {

struct MoeCall {
  const void* x = nullptr;             // [T, H] inType
  const int32_t* topkIdx = nullptr;    // [T, k]
  const float* topkWeights = nullptr;  // [T, k]
  const void* w1 = nullptr;            // [E/n][N][H] (NK) or [E/n][H][N] (KN)
  ncclMoeRecv_t recv{};
  size_t T = 0, H = 0, N = 0;
  int E = 0, k = 0;
  ncclDataType_t inType = ncclBfloat16;
  ncclMoeConfig_t cfg{};  // defaults filled in, outType resolved
  ncclComm* comm = nullptr;
  cudaStream_t stream = nullptr;
};

// Copies `config` (nullptr = defaults) into call->cfg after checking it, then checks shapes,
// types, pointers and alignment. Needs no CUDA call. ncclInvalidArgument with a message.
ncclResult_t moeCheck(MoeCall* call, const ncclMoeConfig_t* config, int nRanks);

// Runs a checked call on call->comm (stream-ordered; no host synchronisation). Layouts other
// than "every rank in this process on one GPU" return ncclInvalidUsage with a message.
ncclResult_t moeRun(const MoeCall& call);

}  // namespace fused
}  // namespace mk
