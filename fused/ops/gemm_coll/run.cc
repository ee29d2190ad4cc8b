// Entry of the GEMM + collective operators after the checks: picks the fused kernel or the
// sequential path and runs it on the comm's device.
#include <atomic>
#include <cuda_runtime.h>

#include "base/checks.h"
#include "base/cudawrap.h"
#include "base/debug.h"
#include "base/param.h"
#include "comm/comm.h"
#include "fused/core/clique_block.h"
#include "fused/core/fused_comm.h"
#include "fused/ops/gemm_coll/clique.h"
#include "fused/ops/gemm_coll/gemm_coll.h"
#include "fused/ops/gemm_coll/gemm_coll_util.h"

namespace mk {
namespace fused {

namespace {
int32_t errOp(GemmColl op) {
  switch (op) {
    case GemmColl::kAllReduce:
      return rt::kOpGemmAllReduce;
    case GemmColl::kAllGather:
      return rt::kOpAllGatherGemm;
    default:
      return rt::kOpGemmReduceScatter;
  }
}

}  // namespace

ncclResult_t gemmCollRun(const GemmCollCall& c) {
  DeviceGuard guard;
  NCCLCHECK(guard.set(c.comm->cudaDev));
  // The view carries the comm's failure domain and its per-rank SM budget, both paths use it.
  FusedComm f;
  NCCLCHECK(fusedCommView(c.comm, errOp(c.op), &f));
  // ncclFusedAuto looks for a fused kernel where the model may pick one (MKERNEL_FUSED_AUTO=1),
  // across nodes and in one node where the call's arguments pass the in-node rule:
  // gemmCollFused applies the rules themselves (xnode.h gxAutoFuses, clique.h gcAutoFuses,
  // the latter only in the layout of ranks as threads sharing a GPU, checked here too so that
  // other in-node layouts go straight to the sequential path, without a preload and an
  // enqueue that launches nothing).
  const bool autoTries =
      c.cfg.algo == ncclFusedAuto &&
      (MK_PARAM_INT(FusedAuto) != 0 || (c.comm->topo.nNodes > 1 && MK_PARAM_INT(FusedXnode) != 0) ||
       (c.comm->topo.nNodes == 1 && cliqueEligible(c.comm, kGcMaxLocal) &&
        gcCliqueAutoFuses(c, MK_PARAM_INT(FusedHelpers) != 0)));
  if (c.cfg.algo == ncclFusedFused || autoTries) {
    // The fused kernel runs as one operation of the comm (stream order with its other
    // operations, graph capture, finalize, the comm's abort flag and error record).
    bool ran = false;
    NCCLCHECK(gemmCollPreload(c));
    NCCLCHECK(fusedEnqueue(c.comm, c.stream, gemmCollName(c.op), [&](cudaStream_t s) {
      GemmCollCall on = c;
      on.stream = s;
      return gemmCollFused(on, f, &ran);
    }));
    if (ran) return ncclSuccess;
    static std::atomic<bool> said{false};
    if (c.cfg.algo == ncclFusedFused && !said.exchange(true)) {
      MK_INFO(kFused,
              "%s: no fused kernel for this layout (several ranks per process on one node; "
              "across nodes: MKERNEL_FUSED_XNODE=1, a chunk of rows (AG) or a tile and a row of C "
              "(RS/AR, M %% nranks == 0 for AR) fitting half a window area; N %% 4 != 0 or more "
              "than %d tiles in one node); running GEMM "
              "then collective",
              gemmCollName(c.op), kGcMaxTiles);
    }
  }
  return gemmCollSequential(c, seqGemmBudget(f));
}

}  // namespace fused
}  // namespace mk
