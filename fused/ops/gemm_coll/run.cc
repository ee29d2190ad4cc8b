// Entry of the GEMM + collective operators after the checks: picks the fused kernel or the
// sequential path and runs it on the comm's device.
#include <cuda_runtime.h>

#include "base/checks.h"
#include "base/debug.h"
#include "coll/coll_state.h"
#include "comm/comm.h"
#include "fused/ops/gemm_coll/gemm_coll.h"
#include "fused/ops/gemm_coll/gemm_coll_util.h"

namespace mk {
namespace fused {

namespace {
struct DeviceGuard {
  int saved = -1;
  explicit DeviceGuard(int dev) {
    if (cudaGetDevice(&saved) != cudaSuccess) saved = -1;
    if (dev >= 0 && dev != saved) cudaSetDevice(dev);
  }
  ~DeviceGuard() {
    if (saved >= 0) cudaSetDevice(saved);
  }
};

int32_t errOp(GemmColl op) {
  switch (op) {
    case GemmColl::kAllReduce: return rt::kOpGemmAllReduce;
    case GemmColl::kAllGather: return rt::kOpAllGatherGemm;
    default: return rt::kOpGemmReduceScatter;
  }
}

// ncclFusedAuto: fuse where the measured crossover says the overlap pays (bench/
// fused_bench); below it the fused kernel's extra partial traffic costs more than it hides.
bool autoFuses(const GemmCollCall& c) {
  const double flops = 2.0 * c.M * c.N * c.K;
  return flops >= 2.0 * 2048.0 * 2048.0 * 2048.0;
}
}  // namespace

// The comm's wait context: its abort flag, failure word, error record (the one
// ncclCommGetAsyncError reads) and deadline.
ncclResult_t gemmCollWaitCtx(ncclComm* comm, int32_t op, rt::WaitCtx* out) {
  *out = collCommDev(comm).w;
  out->op = op;
  return ncclSuccess;
}

ncclResult_t gemmCollRun(const GemmCollCall& c) {
  DeviceGuard guard(c.comm->cudaDev);
  const bool wantFused =
      c.cfg.algo == ncclFusedFused || (c.cfg.algo == ncclFusedAuto && autoFuses(c));
  if (wantFused) {
    rt::WaitCtx w;
    NCCLCHECK(gemmCollWaitCtx(c.comm, errOp(c.op), &w));
    bool ran = false;
    NCCLCHECK(gemmCollFused(c, w, &ran));
    if (ran) return ncclSuccess;
    if (c.cfg.algo == ncclFusedFused) {
      static bool said = false;
      if (!said) {
        said = true;
        MK_INFO(kFused,
                "%s: no fused kernel for this layout (ranks in several processes or nodes, "
                "or more than %d tiles); running GEMM then collective",
                gemmCollName(c.op), 16384);
      }
    }
  }
  return gemmCollSequential(c);
}

}  // namespace fused
}  // namespace mk
