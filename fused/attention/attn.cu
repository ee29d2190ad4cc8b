// Host side of the attention engine: argument checks, tensor maps, variant dispatch.
#include "fused/attention/attn.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "base/checks.h"
#include "base/can_implement.h"
#include "base/cudawrap.h"
#include "base/param.h"
#include "fused/attention/attn_kernel.cuh"

namespace mk {
namespace attn {

template <int kD, bool kF16>
ncclResult_t launchVariant(const AttnParams& p, bool overlap, int32_t grid, cudaStream_t stream);

namespace {

using mk::aligned16;
bool fail(std::string* why, const char* fmt, long long a = 0, long long b = 0) {
  return mk::refuse(why, fmt, a, b);
}

int64_t srcStrideOf(const AttnArgs& a) {
  return a.srcStride != 0 ? a.srcStride : (int64_t)a.B * a.S * a.Hkv * a.D;
}

// A [dims[n-1]]...[dims[0]] row-major tensor of 16-bit elements (dims[0] contiguous) with a
// {64, 1, rows, 1, ...} box: one 128-byte swizzled row per position. Out-of-range rows are
// zero-filled, so slices whose length is not a tile multiple need no predicates on loads.
ncclResult_t encodeRows(CUtensorMap* map, DType t, const void* base, int rank, const uint64_t* dims,
                        const uint64_t* strideBytes, uint32_t rows) {
  cuuint64_t d[5];
  cuuint64_t s[4];
  cuuint32_t box[5], estr[5];
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    box[i] = i == 0 ? 64 : (i == 2 ? rows : 1);
    estr[i] = 1;
    if (i > 0) s[i - 1] = strideBytes[i - 1];
  }
  CUCHECK(cuTensorMapEncodeTiled(
      map, t == DType::kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
      rank, const_cast<void*>(base), d, s, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return ncclSuccess;
}

// K and V as [nSrc][B][S][Hkv][D]; the box is the launched kernel's key block (the variant's
// kBN).
ncclResult_t encodeKv(const AttnArgs& a, int variant, int32_t nSrc, const void* k, const void* v,
                      CUtensorMap* tmK, CUtensorMap* tmV) {
  const uint64_t es = 2;
  const uint64_t kDims[5] = {(uint64_t)a.D, (uint64_t)a.Hkv, (uint64_t)a.S, (uint64_t)a.B,
                             (uint64_t)nSrc};
  const uint64_t kStr[4] = {a.D * es, (uint64_t)a.Hkv * a.D * es, (uint64_t)a.S * a.Hkv * a.D * es,
                            (uint64_t)srcStrideOf(a) * es};
  NCCLCHECK(encodeRows(tmK, a.in, k, 5, kDims, kStr, kvRows(a.D, variant)));
  NCCLCHECK(encodeRows(tmV, a.in, v, 5, kDims, kStr, kvRows(a.D, variant)));
  return ncclSuccess;
}

template <bool kF16>
ncclResult_t dispatchD(int D, const AttnParams& p, bool ov, int32_t grid, cudaStream_t s) {
  switch (D) {
    case 64:
      return launchVariant<64, kF16>(p, ov, grid, s);
    case 128:
      return launchVariant<128, kF16>(p, ov, grid, s);
    default:
      return launchVariant<256, kF16>(p, ov, grid, s);
  }
}

ncclResult_t dispatch(const AttnArgs& a, const AttnParams& p, int32_t grid, cudaStream_t s) {
  if (a.in == DType::kF16) return dispatchD<true>(a.D, p, overlapOf(a), grid, s);
  return dispatchD<false>(a.D, p, overlapOf(a), grid, s);
}

// A Cfg's figures for head dim D and a resolved variant (the schedule does not change them).
template <class F>
int64_t cfgFigure(int D, int variant, F&& f) {
  switch (D) {
    case 64:
      return withCfg<64, false>(true, variant, f);
    case 128:
      return withCfg<128, false>(true, variant, f);
    default:
      return withCfg<256, false>(true, 0, f);
  }
}

}  // namespace

bool overlapOf(const AttnArgs& a) {
  const int64_t s = a.schedule >= 0 ? a.schedule : MK_PARAM_INT(AttnSchedule);
  return s != 0;
}

int variantOf(const AttnArgs& a) {
  if ((a.D != 64 && a.D != 128) || !overlapOf(a)) return 0;
  const bool ring = a.hooks.ready != nullptr;
  if (a.D == 128) {
    const int v = (int)(a.d128Variant >= 0 ? a.d128Variant : MK_PARAM_INT(AttnD128Variant));
    return ring && v > kMaxRingD128Variant ? 0 : v;
  }
  const int v = (int)(a.d64Variant >= 0 ? a.d64Variant : MK_PARAM_INT(AttnD64Variant));
  return ring && v > kMaxRingD64Variant ? 0 : v;
}

int kvRows(int D, int variant) {
  return (int)cfgFigure(D, variant, [](auto c) { return (int64_t) decltype(c)::kBN; });
}

int qRows(int D, int variant) {
  return (int)cfgFigure(D, variant, [](auto c) { return (int64_t) decltype(c)::kBM; });
}

size_t smemBytes(int D, int variant) {
  return (size_t)cfgFigure(D, variant, [](auto c) { return (int64_t) decltype(c)::kSmemBytes; });
}

bool canImplement(const AttnArgs& a, std::string* why) {
  if (a.in != DType::kBF16 && a.in != DType::kF16)
    return fail(why, "input type %lld unsupported: bf16 or fp16", (int)a.in);
  if (a.D != 64 && a.D != 128 && a.D != 256)
    return fail(why, "head dim %lld unsupported: 64, 128 or 256", a.D);
  if (a.B < 1 || a.S < 1) return fail(why, "batch=%lld and seq=%lld must be >= 1", a.B, a.S);
  // The softmax folds the scale into its max: a positive finite scale keeps that exact.
  if (!std::isfinite(a.scale)) return fail(why, "scale must be finite (<= 0 selects 1/sqrt(D))");
  if (a.Hq < 1 || a.Hkv < 1 || a.Hq % a.Hkv != 0)
    return fail(why, "heads: hq=%lld must be a positive multiple of hkv=%lld", a.Hq, a.Hkv);
  if (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.out == nullptr)
    return fail(why, "q, k, v and out must not be null");
  if (!aligned16(a.q) || !aligned16(a.k) || !aligned16(a.v))
    return fail(why, "q, k and v must be 16-byte aligned (TMA)");
  if ((reinterpret_cast<uintptr_t>(a.out) & 3) != 0)
    return fail(why, "out must be 4-byte aligned (pairs of elements are stored at once)");
  if (a.nSrc < 1 || a.nSrc > kMaxSrc)
    return fail(why, "nSrc=%lld must be in 1..%lld", a.nSrc, kMaxSrc);
  if (a.seq.S != a.S) return fail(why, "seq.S=%lld must equal S=%lld", a.seq.S, a.S);
  if (a.seq.chunks != 1 && a.seq.chunks != 2)
    return fail(why, "seq.chunks=%lld must be 1 (contiguous) or 2 (zigzag)", a.seq.chunks);
  if (a.seq.chunks == 2 && a.S % 2 != 0)
    return fail(why, "zigzag slices need an even length (S=%lld)", a.S);
  if (a.seq.nRanks < 1 || a.qRank < 0 || a.qRank >= a.seq.nRanks)
    return fail(why, "qRank=%lld must be a rank of seq.nRanks=%lld", a.qRank, a.seq.nRanks);
  for (int j = 0; j < a.nSrc; ++j) {
    if (a.srcRank[j] < 0 || a.srcRank[j] >= a.seq.nRanks)
      return fail(why, "srcRank[%lld]=%lld is not a rank of the sequence", j, a.srcRank[j]);
  }
  if ((int64_t)a.seq.nRanks * a.S >= (int64_t(1) << 31))
    return fail(why, "the sequence (%lld ranks x S) must hold fewer than 2^31 positions",
                a.seq.nRanks);
  const int64_t stride = srcStrideOf(a);
  if (stride < (int64_t)a.B * a.S * a.Hkv * a.D || stride % 8 != 0)
    return fail(why, "srcStride=%lld must cover a slice and be a multiple of 8", stride);
  if (a.smBudget < 0) return fail(why, "smBudget=%lld must be >= 0 (0 = all SMs)", a.smBudget);
  if (a.schedule < -1 || a.schedule > 1)
    return fail(why, "schedule=%lld must be -1 (parameter), 0 (plain) or 1 (overlapped)",
                a.schedule);
  if (a.d64Variant < -1 || a.d64Variant > kMaxD64Variant)
    return fail(why, "d64Variant=%lld must be -1 (parameter) or 0..%lld", a.d64Variant,
                kMaxD64Variant);
  if (a.d128Variant < -1 || a.d128Variant > kMaxD128Variant)
    return fail(why, "d128Variant=%lld must be -1 (parameter) or 0..%lld", a.d128Variant,
                kMaxD128Variant);
  return true;
}

ncclResult_t buildParams(const AttnArgs& a, AttnParams* p, int32_t* grid) {
  std::string why;
  if (!canImplement(a, &why)) {
    MK_WARN("attention B=%d S=%d Hq=%d Hkv=%d D=%d: %s", a.B, a.S, a.Hq, a.Hkv, a.D, why.c_str());
    return ncclInvalidArgument;
  }
  NCCLCHECK(cudaLibInit());
  gemm::DeviceLimits lim;
  NCCLCHECK(gemm::deviceLimits(&lim));
  MK_ARGCHECK(lim.major == 9 && lim.minor == 0,
              "attention engine needs an sm_90 (Hopper) device; this one is sm_%d%d", lim.major,
              lim.minor);
  const int variant = variantOf(a);
  const size_t smem = smemBytes(a.D, variant);
  MK_ARGCHECK((size_t)lim.smemOptin >= smem,
              "attention engine needs %zu bytes of shared memory per block; the device allows %d",
              smem, lim.smemOptin);

  memset(p, 0, sizeof(*p));
  const uint64_t es = 2;
  const uint64_t qDims[4] = {(uint64_t)a.D, (uint64_t)a.Hq, (uint64_t)a.S, (uint64_t)a.B};
  const uint64_t qStr[3] = {a.D * es, (uint64_t)a.Hq * a.D * es, (uint64_t)a.S * a.Hq * a.D * es};
  const int bm = qRows(a.D, variant);  // the launched kernel's tile rows (its Q box)
  NCCLCHECK(encodeRows(&p->tmQ, a.in, a.q, 4, qDims, qStr, (uint32_t)bm));
  NCCLCHECK(encodeKv(a, variant, a.nSrc, a.k, a.v, &p->tmK, &p->tmV));
  p->out = a.out;
  p->lse = a.lse;
  p->B = a.B;
  p->S = a.S;
  p->Hq = a.Hq;
  p->Hkv = a.Hkv;
  p->group = a.Hq / a.Hkv;
  p->mBlocks = (a.S + bm - 1) / bm;
  const int64_t tiles = (int64_t)p->mBlocks * a.B * a.Hq;
  // Room above the last tile for the CTAs' last stride (tileOfRound stays within int32).
  MK_ARGCHECK(tiles < (int64_t(1) << 31) - (int64_t(1) << 16),
              "attention: %lld tiles exceed the schedule's range", (long long)tiles);
  p->numTiles = (int32_t)tiles;
  const float scale = a.scale > 0.0f ? a.scale : 1.0f / std::sqrt((float)a.D);
  p->scaleLog2 = scale * 1.4426950408889634f;
  p->causal = a.causal ? 1 : 0;
  p->tileOrder = (int32_t)MK_PARAM_INT(AttnTileOrder);
  p->variant = variant;
  p->seq = a.seq;
  p->qRank = a.qRank;
  p->nSrc = a.nSrc;
  for (int j = 0; j < a.nSrc; ++j) p->srcRank[j] = a.srcRank[j];
  p->hooks = a.hooks;
  p->claim = a.tileClaim;
  const int32_t budget = a.smBudget > 0 && a.smBudget < lim.sms ? a.smBudget : lim.sms;
  *grid = (int32_t)(tiles < budget ? tiles : budget);
  return ncclSuccess;
}

ncclResult_t encodeKvSource(const AttnArgs& a, int variant, const void* k, const void* v,
                            CUtensorMap* tmK, CUtensorMap* tmV) {
  MK_ARGCHECK(aligned16(k) && aligned16(v),
              "attention: a source's k and v must be 16-byte aligned");
  return encodeKv(a, variant, 1, k, v, tmK, tmV);
}

ncclResult_t preload(const AttnArgs& a) {
  AttnParams p;
  memset(&p, 0, sizeof(p));
  p.variant = variantOf(a);  // selects the kernel to load
  return dispatch(a, p, 0, nullptr);
}

ncclResult_t launch(const AttnArgs& a, cudaStream_t stream) {
  MK_ARGCHECK(a.tileClaim == nullptr,
              "attention: the stand-alone kernel walks the static schedule (tileClaim is for "
              "the fused ring kernel)");
  AttnParams p;
  int32_t grid = 0;
  NCCLCHECK(buildParams(a, &p, &grid));
  return dispatch(a, p, grid, stream);
}

}  // namespace attn
}  // namespace mk
