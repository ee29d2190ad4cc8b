// ncclRingAttention (include/mkernel/fused.h): one call = one RingAttnCall, checked on the
// host (ringAttnCheck: every rule before any CUDA call), then run on the caller's stream.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>
#include <nccl.h>

#include "mkernel/fused.h"

struct ncclComm;

namespace mk {
namespace fused {

struct RingAttnCall {
  const void* q = nullptr;  // [B, S, Hq, D] inType
  const void* k = nullptr;  // [B, S, Hkv, D]
  const void* v = nullptr;  // [B, S, Hkv, D]
  void* out = nullptr;      // [B, S, Hq, D] inType
  float* lse = nullptr;     // [B, Hq, S] or nullptr
  size_t B = 0, S = 0;
  int Hq = 0, Hkv = 0, D = 0;
  ncclDataType_t inType = ncclBfloat16;
  ncclRingAttnConfig_t cfg{};  // defaults filled in; cfg.scale resolved (> 0)
  ncclComm* comm = nullptr;
  cudaStream_t stream = nullptr;
};

// Copies `config` (nullptr = NCCL_RING_ATTN_CONFIG_INITIALIZER) into call->cfg after checking
// it (size, magic, version, causal 0/1, seqLayout, algo, commSms -1 or >= 1, finite scale),
// resolves the scale, then checks every rule of fused.h (types, head dim, heads, sizes, zigzag
// parity, alignment, overlap, 2^31 bounds with nRanks). Needs no CUDA call; ncclInvalidArgument
// with a message naming the rule (ncclGetLastError).
ncclResult_t ringAttnCheck(RingAttnCall* call, const ncclRingAttnConfig_t* config, int nRanks);

// Runs a checked call on call->comm (stream-ordered, no host synchronisation).
ncclResult_t ringAttnRun(const RingAttnCall& call);

// Fused ring kernels launched (or captured) so far in this process, per layout: ranks of one
// process on one GPU, one rank per process, or a comm spanning (virtual) nodes. Tests use it
// to tell the fused kernel from the sequential fallback.
// kRingLayoutProcs counts the processes layout's launches of either mode, kRingLayoutDirect
// those of them that read the peers' regions in place (RingParams::direct); kRingLayoutStaged
// the sequential path's staged direct reads (MKERNEL_RING_SEQ_DIRECT), counted there only;
// kRingLayoutClaim the launches of any layout whose attention CTAs claim their tiles
// (MKERNEL_RING_TILE_CLAIM).
enum RingLayoutId : int {
  kRingLayoutClique = 0,
  kRingLayoutProcs = 1,
  kRingLayoutXnode = 2,
  kRingLayoutDirect = 3,
  kRingLayoutStaged = 4,
  kRingLayoutClaim = 5,
  kRingLayouts = 6
};
uint64_t ringAttnFusedLaunches(int layout);
// The grid (CTAs) of the last staged launch in this process (0: none), and the budget it was
// sized from (the grid is at most the attention's work units): tests check that the budget is
// the sequential path's, not a rank's share.
int32_t ringAttnLastStagedGrid();
int32_t ringAttnLastStagedBudget();

}  // namespace fused
}  // namespace mk
