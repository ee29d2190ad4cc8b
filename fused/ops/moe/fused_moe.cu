// Host side of the fused ncclMoeDispatchGemm kernel (fused_moe.cuh): eligibility, the SM
// split, parameters and the launch through the comm's enqueue path.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cuda_runtime.h>

#include "base/checks.h"
#include "base/debug.h"
#include "base/scratch.h"
#include "comm/comm.h"
#include "fused/core/clique_block.h"
#include "fused/core/fused_comm.h"
#include "fused/gemm/gemm.h"
#include "fused/ops/gemm_coll/gemm_coll_util.h"
#include "fused/ops/moe/fused_moe_launch.cuh"
#include "fused/ops/moe/moe.h"

namespace mk {
namespace fused {

namespace {

std::atomic<uint64_t> gLaunches{0};

}  // namespace

// Dispatch CTAs of a fused call on `budget` CTAs: the config's commSms when set, else a
// balance of the copy against the GEMM (x = budget * r / (1 + r), r = t_copy(1 CTA) /
// t_gemm(1 SM)) with the rates gemm_coll's split uses (a CTA moves ~15 GB/s of rows read +
// written, an SM does ~6 TFLOP/s), for the average rank (T * k rows out and in): unmeasured
// for MoE, a starting point for bench/moe_bench.py's --comm-sms sweep. At least one CTA of
// each role; no more dispatch CTAs than warps' worth of slots. Since session 19 the dispatch
// CTAs join the GEMM after their copies (dynamic tile claim), so a dispatch CTA costs the GEMM
// only its copy time: the balance above is conservative; re-tune from the --comm-sms sweep.
int moeFusedDispatchCtas(const MoeCall& c, int budget) {
  const int64_t slots = (int64_t)c.T * c.k;
  const int warps = gemm::kThreads / 32;
  const int64_t work = std::max<int64_t>(1, (slots + warps - 1) / warps);
  int64_t want;
  if (c.cfg.commSms > 0) {
    want = c.cfg.commSms;
  } else {
    const double rows = (double)std::max<int64_t>(1, slots);
    const double tCopy = 2.0 * rows * c.H * fusedTypeSize(c.inType) / 15e9;
    const double tGemm = 2.0 * rows * c.N * c.H / 6e12;
    const double r = tGemm > 0 ? tCopy / tGemm : 1.0;
    want = std::min<int64_t>(budget / 2, (int64_t)(budget * r / (1.0 + r) + 0.5));
    want = std::min(want, work);
  }
  return (int)std::max<int64_t>(1, std::min<int64_t>(want, budget - 1));
}

int moeFusedBudget(const MoeCall& c, int smBudget, const char** why) {
  // Every rank's kernel on this GPU must be resident at once (its CTAs wait for rows the
  // dispatch CTAs of every rank bring): never more than the GPU's share of this rank.
  const int onDevice = std::max(1, c.comm->topo.ranksOnMyDevice);
  const int budget = std::min(smBudget, c.comm->smCount / onDevice);
  if (budget < 2) {
    *why = "fewer than 2 SMs for this rank (one CTA of each role)";
    return 0;
  }
  if (moeFusedDispatchSmem(c.E) > (size_t)gemm::GroupPipe::kSmemBytes) {
    *why = "the dispatch state of this many experts exceeds the shared memory";
    return 0;
  }
  return budget;
}

uint64_t moeFusedLaunches() {
  return gLaunches.load();
}

ncclResult_t moeFusedRun(const MoeCall& c, bool* ran) {
  *ran = false;
  ncclComm* comm = c.comm;
  FusedComm f;
  NCCLCHECK(fusedCommView(comm, rt::kOpMoe, &f));
  const char* why = nullptr;
  const int budget = moeFusedBudget(c, f.smBudget, &why);
  if (budget == 0) return ncclSuccess;  // the sequential path
  const int nDisp = moeFusedDispatchCtas(c, budget);

  // The experts' GEMM as the sequential path builds it (canImplement, and the sequential
  // kernel preloaded), on the GEMM CTAs, waiting per 128-row tile for its rows.
  gemm::GemmArgs g;
  NCCLCHECK(moeGemm(c, c.recv.xRecv, c.w1, c.N, c.H, c.recv.y, c.cfg.outType, &g));
  const int64_t tiles = ((int64_t)c.recv.maxRows + gemm::kTileM - 1) / gemm::kTileM;
  const int64_t slots = (int64_t)c.T * c.k;
  const size_t slotBytes =
      ((size_t)std::max<int64_t>(slots, 1) * sizeof(int32_t) + 255) / 256 * 256;
  // The tile counters, then the GEMM's tile claim counter (one more 8-byte word), zeroed together.
  const size_t tileBytes = ((size_t)std::max<int64_t>(tiles, 1) + 1) * sizeof(uint64_t);
  g.smBudget = budget - nDisp;
  g.pipeline = 1;  // the deep grouped ring (GroupPipe), which the kernel runs
  g.cluster = 1;
  g.hooks.rowReady = nullptr;  // set below, once the scratch exists
  g.hooks.rowsPerFlag = gemm::kTileM;
  g.hooks.rowReadyExpected = gemm::kTileM;  // every row of the tile landed or padding
  g.hooks.rowReadySys = false;              // same GPU: the counters are added at GPU scope
  g.hooks.wait = f.c.w;

  void* block = nullptr;
  NCCLCHECK(
      cliqueBlockForCall(comm, kCliqueMoe, sizeof(moedev::MoeClique), c.stream, moeApi(c), &block));
  MoeFusedParams p{};
  p.d = moedev::moeDispatchParamsOf(c, f, block);
  p.nDisp = nDisp;
  const bool kn = c.cfg.wLayout == ncclFusedLayoutKN;
  const gemm::DType in = gemmType(c.inType), out = gemmType(c.cfg.outType);
  // Loaded before the first launch (see moeGemm).
  NCCLCHECK(in == gemm::DType::kF16 ? moeFusedLaunchIn<gemm::DType::kF16>(p, out, kn, 0, nullptr)
                                    : moeFusedLaunchIn<gemm::DType::kBF16>(p, out, kn, 0, nullptr));
  ncclResult_t res = fusedEnqueue(comm, c.stream, moeApi(c), [&](cudaStream_t s) -> ncclResult_t {
    // The slot rows, the copy order and this rank's tile counters: stream-ordered scratch on the
    // stream the kernel runs on, the counters zeroed before the kernel (a memset node under
    // capture, so every replay starts from zero). A peer adds to them only after reading this
    // call's slot, which this kernel publishes.
    void* tmp = nullptr;
    NCCLCHECK(scratchAlloc(&tmp, 2 * slotBytes + tileBytes, comm->cudaDev, s));
    uint8_t* base = static_cast<uint8_t*>(tmp);
    ncclResult_t r = ncclSuccess;
    CUDACHECKGOTO(cudaMemsetAsync(base + 2 * slotBytes, 0, tileBytes, s), r, done);
    {
      p.d.slotRow = slots > 0 ? reinterpret_cast<int32_t*>(base) : nullptr;
      p.d.order = slots > 0 ? reinterpret_cast<int32_t*>(base + slotBytes) : nullptr;
      p.d.tileReady = reinterpret_cast<uint64_t*>(base + 2 * slotBytes);
      gemm::GemmArgs ga = g;
      ga.hooks.rowReady = p.d.tileReady;
      // Dispatch CTAs join the GEMM once their copies are done: the dynamic schedule.
      ga.tileClaim = reinterpret_cast<int32_t*>(p.d.tileReady + std::max<int64_t>(tiles, 1));
      int32_t gridUnused = 0;
      NCCLCHECKGOTO(gemm::buildParams(ga, &p.g, &gridUnused), r, done);
      MK_INFO(kFused, "%s rank %d T=%zu k=%d E=%d H=%zu N=%zu fused: dispatch=%d gemm=%d",
              moeApi(c), f.rank, c.T, c.k, c.E, c.H, c.N, nDisp, budget - nDisp);
      r = in == gemm::DType::kF16 ? moeFusedLaunchIn<gemm::DType::kF16>(p, out, kn, budget, s)
                                  : moeFusedLaunchIn<gemm::DType::kBF16>(p, out, kn, budget, s);
      if (r == ncclSuccess) *ran = true;
    }
  done:
    return fusedFreeScratch(tmp, s, r, moeApi(c));
  });
  if (res == ncclSuccess && *ran) gLaunches.fetch_add(1);
  return res;
}

}  // namespace fused
}  // namespace mk
