// What the sequential and the fused paths of ncclRingAttention share (run.cc).
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include "fused/attention/attn.h"
#include "fused/ops/ring_attn/ring_attn.h"

namespace mk {
namespace fused {

// Most ranks of the clique the fused kernel serves (its handshake slots).
constexpr int kRingMaxLocal = 32;

// The engine's arguments for call c on rank `rank` of n: q, out, lse, shapes, type, scale,
// causal, the sequence layout; one source (the rank's own k and v).
attn::AttnArgs ringAttnArgs(const RingAttnCall& c, int nRanks, int rank);

// The fused path (fused.cu): 2..kMaxSrc ranks of one node, all in this process on one GPU or
// each in its own process. *ran false (nothing done): run the sequential path (the
// processes layout's state could not be created: capture, a rank that could not map).
// Across (virtual) nodes (comm->topo.nNodes > 1): the xnode layout (xnode.h), the slices
// moving through the device communication API; *ran false when its plan does not fit the
// comm's window (the same verdict on every rank).
bool ringAttnFusedEligible(const RingAttnCall& c);
// staged: the sequential path's variant on ranks that are processes all on this GPU (at most
// kRingDirectMax; MKERNEL_RING_SEQ_DIRECT, which every rank sets alike): the same kernel
// reading every rank's slices in place, but with a one-thread kernel before it that waits for
// every peer's slices (no gather copies), and the sequential path's grid (the whole GPU by
// default). *ran false where it does not apply (ringAttnStagedEligible) or the windows cannot
// be made (the same verdict on every rank).
bool ringAttnStagedEligible(const RingAttnCall& c);
ncclResult_t ringAttnFused(const RingAttnCall& c, bool* ran, bool staged = false);

}  // namespace fused
}  // namespace mk
