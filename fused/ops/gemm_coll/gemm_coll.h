// GEMM + collective operators (include/mkernel/fused.h): ncclGemmAllReduce,
// ncclAllGatherGemm, ncclGemmReduceScatter. One call = one GemmCollCall, checked on the host
// (gemmCollCheck: every rule before any CUDA call), then run either as one persistent fused
// kernel per rank or as the sequential path (mkernel's GEMM engine, then mkernel's
// collective on the same stream); gemmCollRun picks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <cuda_runtime.h>
#include <nccl.h>

#include "mkernel/fused.h"

struct ncclComm;

namespace mk {
namespace fused {

enum class GemmColl : int { kAllReduce = 0, kAllGather = 1, kReduceScatter = 2 };
const char* gemmCollName(GemmColl op);  // the API name, e.g. "ncclGemmAllReduce"

// One call, as the API received it, plus the resolved config.
struct GemmCollCall {
  GemmColl op = GemmColl::kAllReduce;
  const void* A = nullptr;    // GemmAllReduce/ReduceScatter: [M,K]; AllGatherGemm: [M/n,K] shard
  const void* B = nullptr;    // [N,K] (NK) or [K,N] (KN)
  void* C = nullptr;          // [M,N]; GemmReduceScatter: the shard [M/n,N]
  void* Agathered = nullptr;  // AllGatherGemm only: optional [M,K]
  size_t M = 0, N = 0, K = 0;
  ncclDataType_t inType = ncclBfloat16;
  ncclFusedConfig_t cfg{};  // defaults filled in, outType resolved
  ncclComm* comm = nullptr;
  cudaStream_t stream = nullptr;
};

// Copies `config` (nullptr = defaults) into call->cfg after checking size/magic/version and
// every field, then checks shapes, types, alignment and overlap for `call->op`. Needs no CUDA
// call and no GPU. ncclInvalidArgument with a message naming the rule.
ncclResult_t gemmCollCheck(GemmCollCall* call, const ncclFusedConfig_t* config, int nRanks,
                           int rank);

// Element size of a fused in/out type (0 for types the operators do not take).
size_t fusedTypeSize(ncclDataType_t t);

// Runs a checked call on call->comm (stream-ordered; no host synchronisation).
ncclResult_t gemmCollRun(const GemmCollCall& call);

// The sequential path: GEMM, then the collective, then the bias (exposed for the tests and
// benchmarks that compare both paths). The GEMM runs on at most smBudget SMs (0: all;
// gemmCollRun passes seqGemmBudget).
ncclResult_t gemmCollSequential(const GemmCollCall& call, int smBudget);

// Fused kernels this process launched (or captured), per layout: 0 clique, 1 processes,
// 2 xnode (a comm spanning nodes). Tests read it to tell the fused kernel from the
// sequential fallback.
enum GcLayoutId : int { kGcLayoutClique = 0, kGcLayoutProcs = 1, kGcLayoutXnode = 2 };
uint64_t gemmCollFusedLaunches(int layout);
// The SM budget the latest call of this process that reached the fused path's split sized it
// from (tests; the call may still have run the sequential path).
int gemmCollLastBudget();

}  // namespace fused
}  // namespace mk
