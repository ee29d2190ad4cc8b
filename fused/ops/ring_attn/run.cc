// ncclRingAttention's run path. Sequential algorithm: k and v of every rank gathered with
// mkernel's AllGather into stream-ordered scratch (capturable: a graph memory node), then one
// attention kernel over the whole sequence; the causal mask follows the positions of the
// slices (SeqMap), so contiguous and zigzag layouts need no reordering of the gathered data.
// Works for every layout of the ranks the collectives serve (threads, processes, nodes).
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "base/checks.h"
#include "base/cudawrap.h"
#include "base/scratch.h"
#include "coll/coll.h"
#include "comm/comm.h"
#include "fused/attention/attn.h"
#include "fused/core/fused_comm.h"
#include "fused/ops/ring_attn/ring_attn.h"
#include "fused/ops/ring_attn/ring_attn_util.h"

namespace mk {
namespace fused {

namespace {
constexpr const char* kApi = "ncclRingAttention";
}  // namespace

attn::AttnArgs ringAttnArgs(const RingAttnCall& c, int nRanks, int rank) {
  attn::AttnArgs a;
  a.q = c.q;
  a.k = c.k;
  a.v = c.v;
  a.out = c.out;
  a.lse = c.lse;
  a.B = (int32_t)c.B;
  a.S = (int32_t)c.S;
  a.Hq = c.Hq;
  a.Hkv = c.Hkv;
  a.D = c.D;
  a.in = c.inType == ncclFloat16 ? attn::DType::kF16 : attn::DType::kBF16;
  a.scale = c.cfg.scale;
  a.causal = c.cfg.causal != 0;
  a.seq.S = (int32_t)c.S;
  a.seq.chunks = c.cfg.seqLayout == ncclRingAttnZigzag ? 2 : 1;
  a.seq.nRanks = nRanks;
  a.qRank = rank;
  a.nSrc = 1;
  a.srcRank[0] = rank;
  return a;
}

static ncclResult_t gather(const RingAttnCall& c, const void* send, void* recv, size_t count) {
  return fusedCollective(c.comm, c.stream, (int)CollType::kAllGather, send, recv, count, c.inType,
                         kApi);
}

ncclResult_t ringAttnRun(const RingAttnCall& c) {
  ncclComm* comm = c.comm;
  // Kernels and scratch on the comm's GPU whatever device the calling thread has current.
  DeviceGuard guard;
  NCCLCHECK(guard.set(comm->cudaDev));
  const int n = comm->nRanks;
  attn::AttnArgs a = ringAttnArgs(c, n, comm->rank);
  if (n == 1) return attn::launch(a, c.stream);
  // ncclFusedAuto runs the sequential path until the fused kernel is measured faster.
  if (c.cfg.algo == ncclFusedFused) {
    bool ran = false;
    if (ringAttnFusedEligible(c)) NCCLCHECK(ringAttnFused(c, &ran));
    if (ran) return ncclSuccess;
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      MK_INFO(kFused,
              "%s: the fused ring kernel runs when the ranks (at most %d) live on one node, all "
              "in this process or each in its own, and its per-rank state exists (the first "
              "call must not be captured), or across nodes when MKERNEL_FUSED_XNODE is 1, every "
              "rank has 3 SMs of its GPU and a row of k fits half of a peer's share of the net "
              "window; running the sequential path",
              kApi, kRingMaxLocal);
  }
  if (n > attn::kMaxSrc) {
    MK_WARN("%s: %d ranks exceed the attention kernel's %d sources", kApi, n, attn::kMaxSrc);
    return ncclInvalidUsage;
  }
  // Ranks that are processes all on this GPU: the peers' slices read in place instead of
  // gathered (MKERNEL_RING_SEQ_DIRECT; every rank takes the same verdict).
  if (ringAttnStagedEligible(c)) {
    bool ran = false;
    NCCLCHECK(ringAttnFused(c, &ran, /*staged=*/true));
    if (ran) return ncclSuccess;
  }
  // Loaded before the gathers are enqueued: a lazy load at the kernel's first launch can wait
  // behind peers' collectives that themselves wait for this rank.
  NCCLCHECK(attn::preload(a));
  const size_t slice = c.B * c.S * (size_t)c.Hkv * c.D;
  const size_t bytes = slice * 2;  // bf16/fp16
  void* scratch = nullptr;
  NCCLCHECK(scratchAlloc(&scratch, 2 * n * bytes, comm->cudaDev, c.stream));
  ncclResult_t res = ncclSuccess;
  char* kAll = static_cast<char*>(scratch);
  char* vAll = kAll + n * bytes;
  NCCLCHECKGOTO(gather(c, c.k, kAll, slice), res, done);
  NCCLCHECKGOTO(gather(c, c.v, vAll, slice), res, done);
  a.k = kAll;
  a.v = vAll;
  a.smBudget = seqGemmBudget(comm);  // MKERNEL_SEQ_GEMM_SMS: the whole GPU by default
  a.nSrc = n;
  a.srcStride = (int64_t)slice;
  for (int j = 0; j < n; ++j) a.srcRank[j] = j;
  NCCLCHECKGOTO(attn::launch(a, c.stream), res, done);
done:
  return fusedFreeScratch(scratch, c.stream, res, kApi);
}

}  // namespace fused
}  // namespace mk
