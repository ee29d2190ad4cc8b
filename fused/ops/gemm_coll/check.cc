// Host-only argument checks of the GEMM + collective operators. Every rule of
// include/mkernel/fused.h is checked here, before any CUDA call, so a refused call changes
// nothing and the message names the rule.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "base/checks.h"
#include "base/can_implement.h"
#include "fused/core/config_check.h"
#include "fused/ops/gemm_coll/gemm_coll.h"

namespace mk {
namespace fused {

const char* gemmCollName(GemmColl op) {
  switch (op) {
    case GemmColl::kAllReduce:
      return "ncclGemmAllReduce";
    case GemmColl::kAllGather:
      return "ncclAllGatherGemm";
    case GemmColl::kReduceScatter:
      return "ncclGemmReduceScatter";
  }
  return "ncclGemm?";
}

size_t fusedTypeSize(ncclDataType_t t) {
  switch (t) {
    case ncclBfloat16:
    case ncclFloat16:
      return 2;
    case ncclFloat32:
      return 4;
    default:
      return 0;
  }
}

namespace {

// The first version of the struct ends after `algo`; a caller built against a later header
// passes a larger size, and the fields it adds keep their defaults here.
constexpr size_t kConfigV1Size = offsetof(ncclFusedConfig_t, algo) + sizeof(int);

ncclResult_t checkConfig(const ncclFusedConfig_t* in, ncclDataType_t inType, const char* api,
                         ncclFusedConfig_t* out) {
  ncclFusedConfig_t d = NCCL_FUSED_CONFIG_INITIALIZER;
  if (in != nullptr) {
    NCCLCHECK(
        checkConfigHeaderOf(in,
                            {kConfigV1Size, NCCL_FUSED_CONFIG_MAGIC, NCCL_FUSED_CONFIG_VERSION,
                             "ncclFusedConfig_t", "NCCL_FUSED_CONFIG_INITIALIZER"},
                            api));
    memcpy(&d, in, kConfigV1Size);
    d.size = sizeof(d);
  }
  MK_ARGCHECK(d.bLayout == ncclFusedLayoutNK || d.bLayout == ncclFusedLayoutKN,
              "%s: config->bLayout=%d must be ncclFusedLayoutNK (0) or ncclFusedLayoutKN (1)", api,
              d.bLayout);
  MK_ARGCHECK(d.algo == ncclFusedAuto || d.algo == ncclFusedFused || d.algo == ncclFusedSequential,
              "%s: config->algo=%d must be ncclFusedAuto, ncclFusedFused or ncclFusedSequential",
              api, d.algo);
  MK_ARGCHECK(d.commSms >= -1, "%s: config->commSms=%d must be -1 (cost model) or >= 0", api,
              d.commSms);
  if (d.outType == NCCL_FUSED_OUT_TYPE_DEFAULT) d.outType = inType;
  MK_ARGCHECK(fusedTypeSize(d.outType) != 0,
              "%s: config->outType=%d unsupported: ncclBfloat16, ncclFloat16 or ncclFloat32", api,
              (int)d.outType);
  MK_ARGCHECK(
      d.bias == nullptr || (reinterpret_cast<uintptr_t>(d.bias) % fusedTypeSize(d.outType)) == 0,
      "%s: config->bias must be aligned to its element size (%zu bytes)", api,
      fusedTypeSize(d.outType));
  *out = d;
  return ncclSuccess;
}

}  // namespace

ncclResult_t gemmCollCheck(GemmCollCall* c, const ncclFusedConfig_t* config, int nRanks, int rank) {
  const char* api = gemmCollName(c->op);
  MK_ARGCHECK(c->inType == ncclBfloat16 || c->inType == ncclFloat16,
              "%s: inType=%d unsupported: inputs must be ncclBfloat16 or ncclFloat16", api,
              (int)c->inType);
  NCCLCHECK(checkConfig(config, c->inType, api, &c->cfg));
  MK_ARGCHECK(nRanks > 0, "%s: communicator has no ranks", api);
  const size_t kMaxDim = size_t(1) << 31;
  MK_ARGCHECK(c->M > 0 && c->N > 0 && c->K > 0,
              "%s: M, N and K must be positive (got M=%zu N=%zu K=%zu)", api, c->M, c->N, c->K);
  MK_ARGCHECK(c->M < kMaxDim && c->N < kMaxDim && c->K < kMaxDim,
              "%s: M, N and K must each be below 2^31 (got M=%zu N=%zu K=%zu)", api, c->M, c->N,
              c->K);
  MK_ARGCHECK(c->K % 8 == 0,
              "%s: K=%zu must be a multiple of 8 (16-byte rows of A and B for the tensor copies)",
              api, c->K);
  MK_ARGCHECK(c->cfg.bLayout != ncclFusedLayoutKN || c->N % 8 == 0,
              "%s: N=%zu must be a multiple of 8 with B as [K,N] (16-byte rows of B)", api, c->N);
  if (c->op != GemmColl::kAllReduce) {
    MK_ARGCHECK(c->M % (size_t)nRanks == 0, "%s: M=%zu must be a multiple of nranks=%d", api, c->M,
                nRanks);
  }
  MK_ARGCHECK(c->A != nullptr && c->B != nullptr && c->C != nullptr,
              "%s: A, B and C must not be NULL", api);
  MK_ARGCHECK(aligned16(c->A) && aligned16(c->B) && aligned16(c->C) && aligned16(c->Agathered),
              "%s: A, B, C%s must be 16-byte aligned", api,
              c->op == GemmColl::kAllGather ? " and Agathered" : "");
  MK_ARGCHECK(c->op == GemmColl::kAllGather || c->Agathered == nullptr,
              "%s: Agathered is only used by ncclAllGatherGemm", api);

  const size_t in = fusedTypeSize(c->inType), out = fusedTypeSize(c->cfg.outType);
  const size_t rowsA = c->op == GemmColl::kAllGather ? c->M / nRanks : c->M;
  const size_t rowsC = c->op == GemmColl::kReduceScatter ? c->M / nRanks : c->M;
  const size_t bytesA = rowsA * c->K * in, bytesB = c->N * c->K * in;
  const size_t bytesC = rowsC * c->N * out, bytesG = c->M * c->K * in;
  MK_ARGCHECK(!overlaps(c->C, bytesC, c->A, bytesA) && !overlaps(c->C, bytesC, c->B, bytesB),
              "%s: C must not overlap A or B", api);
  MK_ARGCHECK(c->cfg.bias == nullptr || !overlaps(c->C, bytesC, c->cfg.bias, c->N * out),
              "%s: C must not overlap the bias", api);
  if (c->Agathered != nullptr) {
    MK_ARGCHECK(!overlaps(c->Agathered, bytesG, c->C, bytesC) &&
                    !overlaps(c->Agathered, bytesG, c->B, bytesB),
                "%s: Agathered must not overlap B or C", api);
    // In place as in ncclAllGather: the shard may be this rank's block of Agathered.
    const char* own = static_cast<const char*>(c->Agathered) + (size_t)rank * bytesA;
    MK_ARGCHECK(!overlaps(c->Agathered, bytesG, c->A, bytesA) || c->A == own,
                "%s: Ashard may overlap Agathered only in place (Ashard == Agathered + "
                "rank * M/nranks * K elements)",
                api);
  }
  return ncclSuccess;
}

}  // namespace fused
}  // namespace mk
