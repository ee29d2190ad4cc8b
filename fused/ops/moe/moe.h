// MoE operators (include/mkernel/fused.h): ncclMoeDispatchGemm and ncclMoeDispatchFfnCombine.
// One call = one MoeCall, checked on the host (moeCheck: every rule before any CUDA call),
// then run on the caller's stream: the dispatch kernel (routing counts exchanged on the
// device, token rows pushed into the owners' packed layouts), mkernel's grouped GEMM, and for
// the whole layer SwiGLU, the second grouped GEMM and the combine kernel (ffn.cu).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>
#include <nccl.h>

#include "fused/gemm/gemm.h"
#include "mkernel/fused.h"

struct ncclComm;

namespace mk {
namespace fused {

struct FusedComm;

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
  // ncclMoeDispatchFfnCombine: recv is derived from buf (xRecv, y = buf.h, counts, offsets)
  // and N = 2 * I.
  bool ffn = false;
  const void* w2 = nullptr;  // [E/n][H][I] (NK) or [E/n][I][H] (KN)
  void* yOut = nullptr;      // [T, H] cfg.outType
  size_t I = 0;
  ncclMoeFfnBuffers_t buf{};
};

// Offsets of consecutive 256-byte aligned regions of one buffer (the processes layout's
// windows of the fused kernels): take(bytes) gives the next region's offset; `at` ends as the
// buffer's size.
struct MoeCarve {
  size_t at = 0;
  size_t take(size_t bytes) {
    const size_t o = at;
    at += (bytes + 255) / 256 * 256;
    return o;
  }
};

inline const char* moeApi(const MoeCall& c) {
  return c.ffn ? "ncclMoeDispatchFfnCombine" : "ncclMoeDispatchGemm";
}

// Copies `config` (nullptr = defaults) into call->cfg after checking it, then checks shapes,
// types, pointers and alignment. Needs no CUDA call. ncclInvalidArgument with a message.
ncclResult_t moeCheck(MoeCall* call, const ncclMoeConfig_t* config, int nRanks);

// Runs a checked call on call->comm (stream-ordered; no host synchronisation): the clique
// kernels when every rank lives in this process on one GPU, the AllToAll path otherwise.
ncclResult_t moeRun(const MoeCall& call);

// Pieces of a run, shared by both operators (dispatch.cu). moeDispatch launches the dispatch
// kernel through fusedEnqueue; *slotRow (stream-ordered scratch, [T * k], freed by the caller
// with fusedFreeScratch on call.stream) keeps each routed slot's row at its destination.
ncclResult_t moeDispatch(const MoeCall& call, int32_t** slotRow);
// CTAs of a MoE kernel that waits for its peers (dispatch, combine): config->commSms or the
// rank's SM budget, no more than `units` of work need (unitsPerCta each), at least 1, and
// never above the budget, so that every rank's grid is resident beside its peers'.
int moeCommGrid(const MoeCall& call, int smBudget, int64_t units, int unitsPerCta);
// The experts' grouped GEMM over the packed rows: a [maxRows, K] (inType) times w [E/n] ->
// d [maxRows, N] (dType), groups from the call's counts and offsets; with swiglu, d is
// [maxRows, N / 2]: silu(gate) * up from the epilogue (gemm::GemmArgs::swiglu). Checked
// (canImplement) and its kernel preloaded.
ncclResult_t moeGemm(const MoeCall& call, const void* a, const void* w, size_t N, size_t K, void* d,
                     ncclDataType_t dType, gemm::GemmArgs* out, bool swiglu = false);
// The row hooks of a fused kernel's grouped GEMM (both fused layer GEMMs, the xnode kernel's):
// a tile of 128 rows is loaded once its flag reaches `expected`, and each stored tile adds 1 to
// its row block's counter (hooks.tileDone, set by the caller with the flags). readySys /
// doneSys: the flag is written, or the counter read, by peers that may be on another GPU of
// the node; else GPU scope. The deep grouped ring (GroupPipe), which the fused kernels run.
void moeRowHooks(gemm::GemmArgs* g, const FusedComm& f, uint64_t expected, bool readySys,
                 bool doneSys);
// Whether the layer's GEMM1 applies SwiGLU in its epilogue (w1 in the [N,K] layout and
// MKERNEL_MOE_SWIGLU_EPILOGUE=1): then buf.h is not written and no SwiGLU kernel runs.
bool moeSwigluInGemm(const MoeCall& call);
// ncclMoeDispatchFfnCombine after the checks (ffn.cu).
ncclResult_t moeFfnRun(const MoeCall& call);
// The SwiGLU pass over the rows the call's layout spans (buf.h -> buf.act), and its preload.
ncclResult_t moeSwiglu(const MoeCall& call, int smBudget);
ncclResult_t moeSwigluPreload(const MoeCall& call);
// ncclMoeDispatchGemm as one fused kernel per rank (fused_moe.cu; the clique layout, or the
// processes layout where the caller checked procWindowsEligible: rows then land in every
// rank's window and are copied to its xRecv after the kernel): dispatch CTAs feed the grouped
// GEMM's CTAs tile by tile. *ran false (and ncclSuccess) where it does not apply: then the
// caller runs the sequential path of the layout.
ncclResult_t moeFusedRun(const MoeCall& call, bool* ran);
// Fused kernels launched (or captured) in this process, for the tests.
uint64_t moeFusedLaunches();
// ncclMoeDispatchFfnCombine as one fused kernel per rank (fused_ffn.cu; clique layout only, w
// in the [N,K] layout with the SwiGLU epilogue): dispatch, GEMM1, GEMM2 and combine, each
// phase waiting for rows, not for the grid. *ran false (and ncclSuccess, the reason logged
// once) where it does not apply: then the caller runs the sequential path.
ncclResult_t moeFfnFusedRun(const MoeCall& call, bool* ran);
uint64_t moeFfnFusedLaunches();
// CTAs of a fused MoE kernel of this rank (both fused kernels, fused_moe.cu): its share of the
// GPU, at most smBudget; 0, with the reason in *why, where no fused kernel can run (fewer than
// 2 CTAs, or a dispatch state of E experts beyond the shared memory).
int moeFusedBudget(const MoeCall& call, int smBudget, const char** why);
// The fused kernel's dispatch CTAs for a rank's budget of CTAs (>= 2): config commSms when
// >= 1, else the copy/GEMM balance; always in [1, budget - 1] (the GEMM keeps one at least).
int moeFusedDispatchCtas(const MoeCall& call, int budget);
// Both calls as one fused kernel per rank on a comm spanning (virtual) nodes (xnode.cu, the
// xnode layout, moe_xnode.h): after the AllToAll path's pack, rows and counts' AllToAll, send
// and receive CTAs move the token rows (and the layer's expert outputs back) through the device
// communication API while the grouped GEMM's CTAs take tiles as their rows land. *ran false
// (ncclSuccess, the reason logged once) where it does not apply (the same verdict on every
// rank): then the caller runs the AllToAll path.
ncclResult_t moeXnodeRun(const MoeCall& call, bool* ran);
uint64_t moeXnodeLaunches();
// Both calls on every layout other than the clique (a2a.cu): counts, rows and the experts'
// outputs travel with mkernel's AllToAll in per-pair buffers of maxRows rows.
ncclResult_t moeA2aRun(const MoeCall& call);

}  // namespace fused
}  // namespace mk
