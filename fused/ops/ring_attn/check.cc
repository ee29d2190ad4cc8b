// Host-only argument checks of ncclRingAttention: every rule of include/mkernel/fused.h, before
// any CUDA call, so a refused call changes nothing and the message names the rule.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "base/can_implement.h"
#include "base/checks.h"
#include "fused/core/config_check.h"
#include "fused/ops/ring_attn/ring_attn.h"

namespace mk {
namespace fused {

namespace {

constexpr const char* kApi = "ncclRingAttention";

// Version 1 ends after `algo`; fields a later header adds keep their defaults here.
constexpr size_t kRingAttnConfigV1Size = offsetof(ncclRingAttnConfig_t, algo) + sizeof(int);

// The kernels index elements with 32-bit integers.
constexpr size_t kMaxElems = size_t(1) << 31;

bool aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// The product of factors (each >= 1) is below kMaxElems. Checked one factor at a time, since the
// partial products only grow, so a size_t that wraps can never pass.
bool productBelow2p31(std::initializer_list<size_t> factors) {
  size_t x = 1;
  for (size_t f : factors) {
    if (f == 0) return true;
    if (x > (kMaxElems - 1) / f) return false;
    x *= f;
  }
  return true;
}

ncclResult_t checkConfig(const ncclRingAttnConfig_t* in, ncclRingAttnConfig_t* out) {
  ncclRingAttnConfig_t d = NCCL_RING_ATTN_CONFIG_INITIALIZER;
  if (in != nullptr) {
    NCCLCHECK(checkConfigHeaderOf(
        in,
        {kRingAttnConfigV1Size, NCCL_RING_ATTN_CONFIG_MAGIC, NCCL_RING_ATTN_CONFIG_VERSION,
         "ncclRingAttnConfig_t", "NCCL_RING_ATTN_CONFIG_INITIALIZER"},
        kApi));
    memcpy(&d, in, kRingAttnConfigV1Size);
    d.size = sizeof(d);
  }
  MK_ARGCHECK(d.causal == 0 || d.causal == 1, "%s: config->causal=%d must be 0 or 1", kApi,
              d.causal);
  MK_ARGCHECK(std::isfinite(d.scale),
              "%s: config->scale=%f must be finite (<= 0 selects 1/sqrt(headDim))", kApi,
              (double)d.scale);
  MK_ARGCHECK(d.seqLayout == ncclRingAttnContiguous || d.seqLayout == ncclRingAttnZigzag,
              "%s: config->seqLayout=%d must be ncclRingAttnContiguous (0) or ncclRingAttnZigzag "
              "(1)",
              kApi, d.seqLayout);
  MK_ARGCHECK(d.algo == ncclFusedAuto || d.algo == ncclFusedFused || d.algo == ncclFusedSequential,
              "%s: config->algo=%d must be ncclFusedAuto, ncclFusedFused or ncclFusedSequential",
              kApi, d.algo);
  MK_ARGCHECK(d.commSms == -1 || d.commSms >= 1,
              "%s: config->commSms=%d must be -1 (automatic) or >= 1", kApi, d.commSms);
  *out = d;
  return ncclSuccess;
}

}  // namespace

ncclResult_t ringAttnCheck(RingAttnCall* c, const ncclRingAttnConfig_t* config, int nRanks) {
  MK_ARGCHECK(c->inType == ncclBfloat16 || c->inType == ncclFloat16,
              "%s: inType=%d unsupported: q, k, v and out must be ncclBfloat16 or ncclFloat16",
              kApi, (int)c->inType);
  NCCLCHECK(checkConfig(config, &c->cfg));
  MK_ARGCHECK(nRanks > 0, "%s: communicator has no ranks (nranks=%d)", kApi, nRanks);
  MK_ARGCHECK(c->D == 64 || c->D == 128 || c->D == 256, "%s: headDim=%d must be 64, 128 or 256",
              kApi, c->D);
  MK_ARGCHECK(c->Hq >= 1 && c->Hkv >= 1, "%s: hq=%d and hkv=%d must be >= 1", kApi, c->Hq, c->Hkv);
  MK_ARGCHECK(c->Hq % c->Hkv == 0,
              "%s: hq=%d must be a multiple of hkv=%d (grouped-query attention)", kApi, c->Hq,
              c->Hkv);
  MK_ARGCHECK(c->B >= 1 && c->S >= 1, "%s: batch=%zu and seqLocal=%zu must be >= 1", kApi, c->B,
              c->S);
  MK_ARGCHECK(c->cfg.seqLayout != ncclRingAttnZigzag || c->S % 2 == 0,
              "%s: seqLocal=%zu must be even with ncclRingAttnZigzag (two chunks per rank)", kApi,
              c->S);
  MK_ARGCHECK(c->q != nullptr && c->k != nullptr && c->v != nullptr && c->out != nullptr,
              "%s: q, k, v and out must not be NULL", kApi);
  MK_ARGCHECK(aligned(c->q, 16) && aligned(c->k, 16) && aligned(c->v, 16) && aligned(c->out, 16),
              "%s: q, k, v and out must be 16-byte aligned", kApi);
  MK_ARGCHECK(aligned(c->lse, 4), "%s: lse must be 4-byte aligned", kApi);

  const size_t hq = (size_t)c->Hq, hkv = (size_t)c->Hkv, d = (size_t)c->D;
  const size_t n = (size_t)nRanks;
  // hkv divides hq, so the k/v count is never the larger; both are named for the message.
  MK_ARGCHECK(productBelow2p31({c->B, c->S, hq, d}) && productBelow2p31({c->B, c->S, hkv, d}),
              "%s: batch*seqLocal*hq*headDim=%zu*%zu*%d*%d (q, out) and batch*seqLocal*hkv*headDim "
              "(k, v) must be below 2^31 elements",
              kApi, c->B, c->S, c->Hq, c->D);
  MK_ARGCHECK(productBelow2p31({n, c->S}),
              "%s: nranks*seqLocal=%d*%zu (the whole sequence) must be below 2^31", kApi, nRanks,
              c->S);
  MK_ARGCHECK(productBelow2p31({n, c->B, c->S, hkv, d}),
              "%s: nranks*batch*seqLocal*hkv*headDim=%d*%zu*%zu*%d*%d (the gathered k and v) must "
              "be below 2^31 elements",
              kApi, nRanks, c->B, c->S, c->Hkv, c->D);

  // Below 2^31 elements each, so none of these byte counts wraps.
  const size_t es = 2;
  const size_t bytesQ = c->B * c->S * hq * d * es;
  const size_t bytesKv = c->B * c->S * hkv * d * es;
  const size_t bytesLse = c->B * hq * c->S * sizeof(float);
  MK_ARGCHECK(!overlaps(c->out, bytesQ, c->q, bytesQ) && !overlaps(c->out, bytesQ, c->k, bytesKv) &&
                  !overlaps(c->out, bytesQ, c->v, bytesKv),
              "%s: out must not overlap q, k or v", kApi);
  MK_ARGCHECK(
      !overlaps(c->lse, bytesLse, c->q, bytesQ) && !overlaps(c->lse, bytesLse, c->k, bytesKv) &&
          !overlaps(c->lse, bytesLse, c->v, bytesKv) && !overlaps(c->lse, bytesLse, c->out, bytesQ),
      "%s: lse must not overlap q, k, v or out", kApi);

  if (c->cfg.scale <= 0.0f) c->cfg.scale = 1.0f / std::sqrt((float)c->D);
  return ncclSuccess;
}

}  // namespace fused
}  // namespace mk
