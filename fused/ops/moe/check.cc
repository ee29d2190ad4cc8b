// Host-only argument checks of ncclMoeDispatchGemm and ncclMoeDispatchFfnCombine: every rule of
// include/mkernel/fused.h, before any CUDA call, so a refused call changes nothing and the message
// names the rule.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "base/checks.h"
#include "base/can_implement.h"
#include "fused/core/config_check.h"
#include "fused/gemm/gemm.h"
#include "fused/ops/gemm_coll/gemm_coll.h"
#include "fused/ops/moe/moe.h"

namespace mk {
namespace fused {

namespace {

// Version 1 ends after `algo`; fields a later header adds keep their defaults here.
constexpr size_t kMoeConfigV1Size = offsetof(ncclMoeConfig_t, algo) + sizeof(int);

ncclResult_t checkConfig(const ncclMoeConfig_t* in, ncclDataType_t inType, const char* kApi,
                         ncclMoeConfig_t* out) {
  ncclMoeConfig_t d = NCCL_MOE_CONFIG_INITIALIZER;
  if (in != nullptr) {
    NCCLCHECK(checkConfigHeaderOf(in,
                                  {kMoeConfigV1Size, NCCL_MOE_CONFIG_MAGIC, NCCL_MOE_CONFIG_VERSION,
                                   "ncclMoeConfig_t", "NCCL_MOE_CONFIG_INITIALIZER"},
                                  kApi));
    memcpy(&d, in, kMoeConfigV1Size);
    d.size = sizeof(d);
  }
  MK_ARGCHECK(d.wLayout == ncclFusedLayoutNK || d.wLayout == ncclFusedLayoutKN,
              "%s: config->wLayout=%d must be ncclFusedLayoutNK (0) or ncclFusedLayoutKN (1)", kApi,
              d.wLayout);
  MK_ARGCHECK(d.algo == ncclFusedAuto || d.algo == ncclFusedFused || d.algo == ncclFusedSequential,
              "%s: config->algo=%d must be ncclFusedAuto, ncclFusedFused or ncclFusedSequential",
              kApi, d.algo);
  MK_ARGCHECK(d.commSms == -1 || d.commSms >= 1,
              "%s: config->commSms=%d must be -1 (automatic) or >= 1", kApi, d.commSms);
  if (d.outType == NCCL_FUSED_OUT_TYPE_DEFAULT) d.outType = inType;
  MK_ARGCHECK(fusedTypeSize(d.outType) != 0,
              "%s: config->outType=%d unsupported: ncclBfloat16, ncclFloat16 or ncclFloat32", kApi,
              (int)d.outType);
  *out = d;
  return ncclSuccess;
}

}  // namespace

ncclResult_t moeCheck(MoeCall* c, const ncclMoeConfig_t* config, int nRanks) {
  const char* kApi = moeApi(*c);
  // The whole layer's packed rows are its buffers (GEMM1 writes h).
  const char* rx = c->ffn ? "buf->xRecv" : "recv->xRecv";
  const char* ry = c->ffn ? "buf->h" : "recv->y";
  const char* rb = c->ffn ? "buf" : "recv";
  MK_ARGCHECK(c->inType == ncclBfloat16 || c->inType == ncclFloat16,
              "%s: inType=%d unsupported: tokens and weights must be ncclBfloat16 or ncclFloat16",
              kApi, (int)c->inType);
  NCCLCHECK(checkConfig(config, c->inType, kApi, &c->cfg));
  MK_ARGCHECK(nRanks > 0, "%s: communicator has no ranks", kApi);
  MK_ARGCHECK(c->E >= 1 && c->E <= NCCL_MOE_MAX_EXPERTS,
              "%s: experts=%d must be in 1..%d (NCCL_MOE_MAX_EXPERTS)", kApi, c->E,
              NCCL_MOE_MAX_EXPERTS);
  MK_ARGCHECK(c->E % nRanks == 0, "%s: experts=%d must be a multiple of nranks=%d", kApi, c->E,
              nRanks);
  static_assert(NCCL_MOE_MAX_LOCAL_EXPERTS == gemm::kMaxGroups,
                "the header's local-expert bound is the grouped GEMM's group count");
  MK_ARGCHECK(c->E / nRanks <= NCCL_MOE_MAX_LOCAL_EXPERTS,
              "%s: experts/nranks=%d local experts exceed NCCL_MOE_MAX_LOCAL_EXPERTS=%d (the "
              "grouped GEMM's groups)",
              kApi, c->E / nRanks, NCCL_MOE_MAX_LOCAL_EXPERTS);
  MK_ARGCHECK(c->k >= 1 && c->k <= NCCL_MOE_MAX_TOPK, "%s: topk=%d must be in 1..%d", kApi, c->k,
              NCCL_MOE_MAX_TOPK);
  const size_t kMaxDim = size_t(1) << 31;
  // The layer's inter size first: n = 2 * inter would be blamed for it below.
  if (c->ffn) {
    MK_ARGCHECK(c->I >= 1 && c->I < kMaxDim / 2 && c->I % 8 == 0,
                "%s: inter=%zu must be a positive multiple of 8 (16-byte rows of buf->act and of "
                "w2) below 2^30",
                kApi, c->I);
  }
  MK_ARGCHECK(c->H > 0 && c->N > 0 && c->H < kMaxDim && c->N < kMaxDim,
              "%s: hidden=%zu and n=%zu must be positive and below 2^31", kApi, c->H, c->N);
  MK_ARGCHECK(c->T < kMaxDim / (size_t)c->k, "%s: tokens*topk=%zu*%d must be below 2^31", kApi,
              c->T, c->k);
  MK_ARGCHECK(c->H % 8 == 0, "%s: hidden=%zu must be a multiple of 8 (16-byte token rows)", kApi,
              c->H);
  MK_ARGCHECK(c->cfg.wLayout != ncclFusedLayoutKN || c->N % 8 == 0,
              "%s: n=%zu must be a multiple of 8 with w1 as [E/n][H][N] (16-byte rows)", kApi,
              c->N);
  const ncclMoeRecv_t& r = c->recv;
  MK_ARGCHECK(r.maxRows > 0 && r.maxRows < kMaxDim, "%s: %s->maxRows=%zu must be in 1..2^31-1",
              kApi, rb, r.maxRows);
  MK_ARGCHECK(c->T == 0 || (c->x != nullptr && c->topkIdx != nullptr),
              "%s: x and topkIdx must not be NULL", kApi);
  MK_ARGCHECK(c->w1 != nullptr && r.xRecv != nullptr && r.y != nullptr &&
                  r.expertCount != nullptr && r.expertOffset != nullptr,
              "%s: w1, %s, %s, %s->expertCount and %s->expertOffset must not be NULL", kApi, rx, ry,
              rb, rb);
  MK_ARGCHECK(r.rowWeight == nullptr || c->T == 0 || c->topkWeights != nullptr,
              "%s: recv->rowWeight needs topkWeights", kApi);
  MK_ARGCHECK(aligned16(c->x) && aligned16(c->w1) && aligned16(r.xRecv) && aligned16(r.y),
              "%s: x, w1, %s and %s must be 16-byte aligned", kApi, rx, ry);
  MK_ARGCHECK((reinterpret_cast<uintptr_t>(c->topkIdx) & 3u) == 0 &&
                  (reinterpret_cast<uintptr_t>(c->topkWeights) & 3u) == 0 &&
                  (reinterpret_cast<uintptr_t>(r.expertCount) & 3u) == 0 &&
                  (reinterpret_cast<uintptr_t>(r.expertOffset) & 3u) == 0 &&
                  (reinterpret_cast<uintptr_t>(r.rowSource) & 3u) == 0 &&
                  (reinterpret_cast<uintptr_t>(r.rowWeight) & 3u) == 0,
              "%s: topkIdx, topkWeights and the %s arrays must be 4-byte aligned", kApi, rb);
  if (!c->ffn) return ncclSuccess;
  const ncclMoeFfnBuffers_t& b = c->buf;
  MK_ARGCHECK(
      c->w2 != nullptr && (c->yOut != nullptr || c->T == 0) && b.act != nullptr && b.out != nullptr,
      "%s: w2, y (unless tokens is 0), buf->act and buf->out must not be NULL", kApi);
  MK_ARGCHECK(c->T == 0 || c->topkWeights != nullptr,
              "%s: topkWeights must not be NULL (the combine weighs every slot)", kApi);
  MK_ARGCHECK(aligned16(c->w2) && aligned16(c->yOut) && aligned16(b.act) && aligned16(b.out),
              "%s: w2, y, buf->act and buf->out must be 16-byte aligned", kApi);
  return ncclSuccess;
}

}  // namespace fused
}  // namespace mk
