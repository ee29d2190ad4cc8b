// Host side of the GEMM engine: argument checks, tensor maps, variant dispatch.
#include "fused/gemm/gemm.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

#include "base/checks.h"
#include "base/can_implement.h"
#include "base/cudawrap.h"
#include "base/param.h"
#include "fused/gemm/primitives.cuh"

namespace mk {
namespace gemm {

template <DType kIn, DType kOut, BLayout kB>
ncclResult_t launchVariant(const GemmParams& p, int32_t grid, cudaStream_t stream);

const char* dtypeName(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "fp16";
    case DType::kF32:
      return "fp32";
  }
  return "?";
}

size_t dtypeSize(DType t) {
  return t == DType::kF32 ? 4 : 2;
}

size_t smemBytes() {
  return kSmemBytes;
}

namespace {

using mk::aligned16;
bool fail(std::string* why, const char* fmt, long long a = 0, long long b = 0) {
  return mk::refuse(why, fmt, a, b);
}

int64_t effLda(const GemmArgs& a) {
  return a.lda ? a.lda : a.K;
}
int64_t effLdb(const GemmArgs& a) {
  return a.ldb ? a.ldb : (a.bLayout == BLayout::kKN ? a.N : a.K);
}
int64_t effLdd(const GemmArgs& a) {
  return a.ldd ? a.ldd : outCols(a);
}
int64_t effLdc(const GemmArgs& a) {
  return a.ldc ? a.ldc : effLdd(a);
}

// Whether the epilogue can store D through TMA: 16-byte aligned rows, and N itself must end on
// a 16-byte boundary: on the H200 a box clipped at N in the middle of a 16-byte chunk wrote
// zeros to the rest of that chunk (columns N.. of padded rows; seen with N=1030, ldd=1032, see
// gemm-notes). Otherwise the bounds-checked direct epilogue stores it.
bool tmaStorable(const GemmArgs& a) {
  const size_t es = dtypeSize(a.dType);
  return aligned16(a.D) && (effLdd(a) * es) % 16 == 0 && (outCols(a) * es) % 16 == 0;
}

// Where GemmArgs::regStores can store D from the accumulators: 16-byte stores of 8 columns of
// a 16-bit D, which need what the TMA store needs (aligned D, whole 16-byte rows and width);
// nothing read from C, and not the tile-by-tile view.
bool regStorable(const GemmArgs& a) {
  return a.dType != DType::kF32 && a.beta == 0.0f && !a.dTiled && tmaStorable(a);
}

CUtensorMapDataType tmaType(DType t) {
  switch (t) {
    case DType::kBF16:
      return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case DType::kF16:
      return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    default:
      return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  }
}

// 2-D row-major tensor (inner = contiguous extent) with a 128-byte-swizzled box. Out-of-range
// boxes are zero-filled on load (FLOAT_OOB_FILL_NONE) and clipped on store: tails need no
// predicates in the kernel.
ncclResult_t encode2d(CUtensorMap* map, DType t, const void* base, uint64_t inner, uint64_t outer,
                      uint64_t pitchElems, uint32_t boxInner, uint32_t boxOuter) {
  cuuint64_t dims[2] = {inner, outer};
  cuuint64_t strides[1] = {pitchElems * dtypeSize(t)};
  cuuint32_t box[2] = {boxInner, boxOuter};
  cuuint32_t estr[2] = {1, 1};
  CUCHECK(cuTensorMapEncodeTiled(map, tmaType(t), 2, const_cast<void*>(base), dims, strides, box,
                                 estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return ncclSuccess;
}

// B of a grouped GEMM: [groups][outer][inner], each group pitched like a 2-D B and groups
// strideElems apart; the box is one group's 2-D box.
ncclResult_t encode3d(CUtensorMap* map, DType t, const void* base, uint64_t inner, uint64_t outer,
                      uint64_t groups, uint64_t pitchElems, uint64_t strideElems, uint32_t boxInner,
                      uint32_t boxOuter) {
  cuuint64_t dims[3] = {inner, outer, groups};
  cuuint64_t strides[2] = {pitchElems * dtypeSize(t), strideElems * dtypeSize(t)};
  cuuint32_t box[3] = {boxInner, boxOuter, 1};
  cuuint32_t estr[3] = {1, 1, 1};
  CUCHECK(cuTensorMapEncodeTiled(map, tmaType(t), 3, const_cast<void*>(base), dims, strides, box,
                                 estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return ncclSuccess;
}

// Elements between two groups' B (GemmGroups::strideB, 0 = packed).
int64_t effStrideB(const GemmArgs& a) {
  if (a.groups.strideB != 0) return a.groups.strideB;
  return (a.bLayout == BLayout::kKN ? (int64_t)a.K : (int64_t)a.N) * effLdb(a);
}

// The pipelines whose CTA pairs have a traced kernel (gemm_launch.cuh kTraceable): the deep
// ring and the ping-pong consumers (the traced wide pairs spilled).
bool tracedPairsBuilt(int32_t pipeline) {
  return pipeline == 1 || pipeline == 3;
}

// Whether a call may run as CTA pairs (GemmArgs::cluster): only the static tile walk of the
// stand-alone kernel pairs up, and only the 16-bit-output variants are built paired (traced:
// tracedPairsBuilt). Grouped GEMMs pair up on the cooperative pipelines (a pair's two row
// tiles then lie in one group and share its B: primitives.cuh groupPairTile), not on the
// ping-pong consumers.
bool pairsAllowed(const GemmArgs& a) {
  const GemmHooks& h = a.hooks;
  return a.dType != DType::kF32 && (a.groups.num == 0 || a.pipeline != 3) && !a.swiglu &&
         !a.dTiled && (a.trace == nullptr || tracedPairsBuilt(a.pipeline)) && a.pipeline != 4 &&
         a.pipeline != 5 && h.rowReady == nullptr && h.tileDone == nullptr &&
         h.tileOrder == nullptr && h.rowBlockOffset == 0 && a.tileClaim == nullptr &&
         (a.smBudget == 0 || a.smBudget >= 2) &&
         a.streamK != 1;  // an explicit stream-K request wins over MKERNEL_GEMM_CLUSTER
}

// GemmArgs::cluster resolved (1 or 2); 0 takes MKERNEL_GEMM_CLUSTER where pairs are allowed.
int32_t resolvedCluster(const GemmArgs& a) {
  if (a.cluster != 0) return a.cluster;
  return MK_PARAM_INT(GemmCluster) == 2 && pairsAllowed(a) ? 2 : 1;
}

// Whether any fused-operator hook is set (what the plain-GEMM-only variants refuse).
bool anyHook(const GemmHooks& h) {
  return h.rowReady != nullptr || h.tileDone != nullptr || h.tileOrder != nullptr ||
         h.rowBlockOffset != 0 || h.seqBase != nullptr;
}

// The rules of the pipelines that run plain GEMMs only (4: the ping-pong over 192-column units,
// 5: the deep ring lending its last stage to the epilogue, 6: the carried epilogue): 16-bit D;
// no groups, SwiGLU, tile-by-tile D, CTA pairs (but where `pairs`), stream-K or fused-operator
// hooks. False with the refusal, naming the pipeline `name`, in *why.
bool plainPipelineOk(const GemmArgs& a, const char* name, std::string* why, bool pairs = false) {
  const std::string n = name;
  if (a.dType == DType::kF32) return fail(why, (n + " needs a 16-bit output type").c_str());
  if (a.groups.num != 0 || a.swiglu || a.dTiled || (a.cluster == 2 && !pairs) || a.streamK == 1)
    return fail(why, (n + " runs plain GEMMs: no groups, SwiGLU, tile-by-tile D" +
                      (pairs ? "" : ", CTA pairs (cluster=2)") + " or stream-K")
                         .c_str());
  if (anyHook(a.hooks))
    return fail(why, (n + " takes no fused-operator hooks (rowReady, tileDone, tileOrder, "
                          "rowBlockOffset, seqBase)")
                         .c_str());
  return true;
}

// What the stream-K tail cannot be combined with (streamk.h: only the plain static walk of
// the stand-alone kernel has it); nullptr when the call allows it.
const char* streamKConflict(const GemmArgs& a) {
  if (a.groups.num != 0 || a.swiglu) return "streamK runs plain GEMMs (no groups, no SwiGLU)";
  if (a.dTiled) return "streamK takes no tile-by-tile D";
  if (anyHook(a.hooks))
    return "streamK takes no fused-operator hooks (rowReady, tileDone, tileOrder, rowBlockOffset, "
           "seqBase): a split tile has no single producer or publisher";
  if (a.pipeline >= 3)
    return "streamK does not run with the ping-pong consumers (pipeline 3 or 4), the lent "
           "stage (pipeline 5) or the carried epilogue (pipeline 6)";
  if (a.cluster == 2) return "streamK does not run with cluster=2 (CTA pairs)";
  if (a.tileClaim != nullptr) return "streamK walks the static schedule (no tileClaim)";
  if (a.trace != nullptr) return "streamK is not traced (GemmArgs::trace)";
  return nullptr;
}

// GemmArgs::streamK resolved: 1 on, -1 off, 0 MKERNEL_GEMM_STREAMK where the call allows it.
bool resolvedStreamK(const GemmArgs& a) {
  if (a.streamK != 0) return a.streamK == 1;
  return MK_PARAM_INT(GemmStreamK) == 1 && streamKConflict(a) == nullptr && resolvedCluster(a) == 1;
}

// The stream-K workspace of one (device, stream): a partial per CTA of the largest grid
// (GemmParams::skWork) and a flag per CTA and consumer WG, zeroed once in stream order, then
// never reset: each launch publishes a larger epoch. Keyed by stream so that GEMMs on
// concurrent streams never share one (launches on one stream run one after the other).
// Allocated at a stream's first stream-K launch and kept for the process (an application
// cycling through many streams is capped at kSkMaxWorkspaces per device: past that its GEMMs
// run data-parallel).
struct SkWorkspace {
  float4* work = nullptr;
  uint64_t* flags = nullptr;
  uint64_t epoch = 0;
};
constexpr int kSkMaxWorkspaces = 16;

// The workspace for (dev, stream) with the next epoch; false (data-parallel) when none may be
// allocated (cap reached); an error when CUDA fails.
ncclResult_t skWorkspace(int dev, int ctas, cudaStream_t stream, GemmParams* p, bool* ok) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, SkWorkspace> cache;
  static int count[64] = {};
  std::lock_guard<std::mutex> lock(mu);
  *ok = false;
  auto it = cache.find({dev, stream});
  if (it == cache.end()) {
    if (dev >= 64 || count[dev] >= kSkMaxWorkspaces) {
      static bool warned = false;
      if (!warned) {
        warned = true;
        MK_WARN(
            "GEMM stream-K: %d workspaces on device %d already; later streams' GEMMs run "
            "data-parallel",
            kSkMaxWorkspaces, dev);
      }
      return ncclSuccess;
    }
    SkWorkspace w;
    const size_t workBytes = (size_t)ctas * kConsumerWGs * 32 * 128 * sizeof(float4);
    const size_t flagBytes = (size_t)ctas * kConsumerWGs * sizeof(uint64_t);
    CUDACHECK(cudaMalloc(&w.work, workBytes));
    if (cudaMalloc(&w.flags, flagBytes) != cudaSuccess) {
      cudaFree(w.work);
      MK_WARN("GEMM stream-K: cudaMalloc of %zu bytes of flags failed", flagBytes);
      return ncclUnhandledCudaError;
    }
    // In stream order before the first launch that reads them (the stream may not synchronise
    // with the legacy default stream).
    CUDACHECK(cudaMemsetAsync(w.flags, 0, flagBytes, stream));
    ++count[dev];
    MK_INFO(kFused, "GEMM stream-K: workspace of %zu bytes for device %d, stream %p", workBytes,
            dev, (void*)stream);
    it = cache.emplace(std::make_pair(dev, stream), w).first;
  }
  p->skWork = it->second.work;
  p->skFlags = it->second.flags;
  p->skEpoch = ++it->second.epoch;
  *ok = true;
  return ncclSuccess;
}

// The counter of pipeline 0's carried epilogue or lent stage for one (device, stream), with which
// its CTAs claim tiles (GemmParams::claimReset): zeroed once in stream order at its stream's first
// such launch; each launch's last claim sets it back to 0, so the next launch on the stream, which
// starts after it, finds 0. Keyed by the stream's id (cudaStreamGetId), not its handle: the
// handle cudaStreamPerThread names a different stream in each host thread, and a destroyed
// stream's handle may come back for a new one; ids are never reused, so GEMMs on two streams
// never share a counter. Capped per device (later streams walk the static schedule, as does a
// stream whose allocation failed, which is not retried: *out stays nullptr). The allocation runs in
// relaxed capture mode, so that it cannot invalidate another thread's global-mode capture.
ncclResult_t claimCounter(int dev, cudaStream_t stream, int32_t** out) {
  constexpr int kMaxCounters = 64;
  static std::mutex mu;
  static std::map<std::pair<int, unsigned long long>, int32_t*> cache;
  static int count[64] = {};
  *out = nullptr;
  unsigned long long id = 0;
  if (cudaStreamGetId(stream, &id) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky
    return ncclSuccess;
  }
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({dev, id});
  if (it == cache.end()) {
    if (dev >= 64 || count[dev] >= kMaxCounters) return ncclSuccess;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    int32_t* c = nullptr;
    cudaError_t e = cudaMalloc(&c, sizeof(int32_t));
    if (e == cudaSuccess) {
      e = cudaMemsetAsync(c, 0, sizeof(int32_t), stream);
      if (e != cudaSuccess) cudaFree(c);
    }
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // allocation errors are not sticky
      MK_WARN("GEMM: no tile counter for stream %p (%s): its GEMMs walk the static schedule",
              (void*)stream, cudaGetErrorString(e));
      c = nullptr;
    } else {
      ++count[dev];
    }
    it = cache.emplace(std::make_pair(dev, id), c).first;
  }
  *out = it->second;
  return ncclSuccess;
}

// Whether `stream` is capturing; a query that fails (the legacy stream while another thread
// captures in global mode) counts as a capture (the error is not sticky; cleared).
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return cap != cudaStreamCaptureStatusNone;
}

}  // namespace

ncclResult_t deviceLimits(DeviceLimits* out) {
  static std::mutex mu;
  static DeviceLimits cache[64];
  static bool have[64] = {};
  int dev;
  CUDACHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (dev < 64 && have[dev]) {
    *out = cache[dev];
    return ncclSuccess;
  }
  DeviceLimits l;
  CUDACHECK(cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, dev));
  CUDACHECK(cudaDeviceGetAttribute(&l.major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDACHECK(cudaDeviceGetAttribute(&l.minor, cudaDevAttrComputeCapabilityMinor, dev));
  CUDACHECK(cudaDeviceGetAttribute(&l.smemOptin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  int l2 = 0;
  CUDACHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  l.l2Bytes = l2;
  if (dev < 64) {
    cache[dev] = l;
    have[dev] = true;
  }
  *out = l;
  return ncclSuccess;
}

ncclResult_t encodeRows(CUtensorMap* map, DType t, void* base, uint64_t cols, uint64_t rows,
                        uint64_t pitchElems, uint32_t boxCols, uint32_t boxRows) {
  cuuint64_t dims[2] = {cols, rows};
  cuuint64_t strides[1] = {pitchElems * dtypeSize(t)};
  cuuint32_t box[2] = {boxCols, boxRows};
  cuuint32_t estr[2] = {1, 1};
  CUCHECK(cuTensorMapEncodeTiled(map, tmaType(t), 2, base, dims, strides, box, estr,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return ncclSuccess;
}

namespace {

// D as [tilesM][tilesN][kTileM][kTileN] (GemmArgs::dTiled), stored with the epilogue's box.
ncclResult_t encodeTiled(CUtensorMap* map, DType t, void* base, uint64_t tilesM, uint64_t tilesN) {
  const uint64_t es = dtypeSize(t);
  cuuint64_t dims[4] = {(cuuint64_t)kTileN, (cuuint64_t)kTileM, tilesN, tilesM};
  cuuint64_t strides[3] = {kTileN * es, (cuuint64_t)kTileM * kTileN * es,
                           tilesN * kTileM * kTileN * es};
  cuuint32_t box[4] = {(cuuint32_t)(128 / es), 64, 1, 1};
  cuuint32_t estr[4] = {1, 1, 1, 1};
  CUCHECK(cuTensorMapEncodeTiled(map, tmaType(t), 4, base, dims, strides, box, estr,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return ncclSuccess;
}

template <DType kIn, DType kOut>
ncclResult_t dispatchB(const GemmArgs& a, const GemmParams& p, int32_t grid, cudaStream_t s) {
  return a.bLayout == BLayout::kKN ? launchVariant<kIn, kOut, BLayout::kKN>(p, grid, s)
                                   : launchVariant<kIn, kOut, BLayout::kNK>(p, grid, s);
}

template <DType kIn>
ncclResult_t dispatchOut(const GemmArgs& a, const GemmParams& p, int32_t grid, cudaStream_t s) {
  switch (a.dType) {
    case DType::kBF16:
      return dispatchB<kIn, DType::kBF16>(a, p, grid, s);
    case DType::kF16:
      return dispatchB<kIn, DType::kF16>(a, p, grid, s);
    default:
      return dispatchB<kIn, DType::kF32>(a, p, grid, s);
  }
}

}  // namespace

bool canImplement(const GemmArgs& a, std::string* why) {
  if (a.M <= 0 || a.N <= 0 || a.K <= 0)
    return fail(why, "M, N and K must be positive (got M=%lld, N=%lld, ...)", a.M, a.N);
  if (a.K % 8 != 0)
    return fail(why, "K=%lld is not a multiple of 8: TMA needs 16-byte rows for A and B", a.K);
  if (a.abType != DType::kBF16 && a.abType != DType::kF16)
    return fail(why, "A/B type %lld unsupported: inputs must be bf16 or fp16", (int)a.abType);
  if (a.dType != DType::kBF16 && a.dType != DType::kF16 && a.dType != DType::kF32)
    return fail(why, "output type %lld unsupported: bf16, fp16 or fp32", (int)a.dType);
  if (a.bLayout != BLayout::kKN && a.bLayout != BLayout::kNK)
    return fail(why, "B layout %lld unknown", (int)a.bLayout);
  if (a.A == nullptr || a.B == nullptr || a.D == nullptr)
    return fail(why, "A, B and D must not be null");
  if (!aligned16(a.A) || !aligned16(a.B)) return fail(why, "A and B must be 16-byte aligned (TMA)");
  const int64_t lda = effLda(a), ldb = effLdb(a), ldd = effLdd(a);
  if (lda < a.K || lda % 8 != 0)
    return fail(why, "lda=%lld must be >= K=%lld and a multiple of 8 (16-byte rows)", lda, a.K);
  if (a.bLayout == BLayout::kKN && (ldb < a.N || ldb % 8 != 0))
    return fail(why, "B[K,N]: ldb=%lld must be >= N=%lld and a multiple of 8 (16-byte rows)", ldb,
                a.N);
  if (a.bLayout == BLayout::kNK && (ldb < a.K || ldb % 8 != 0))
    return fail(why, "B[N,K]: ldb=%lld must be >= K=%lld and a multiple of 8 (16-byte rows)", ldb,
                a.K);
  if (ldd < outCols(a)) return fail(why, "ldd=%lld must be >= D's width %lld", ldd, outCols(a));
  if (a.beta != 0.0f) {
    if (effLdc(a) < outCols(a))
      return fail(why, "ldc=%lld must be >= D's width %lld", effLdc(a), outCols(a));
  }
  if (a.dTiled && (a.beta != 0.0f || !aligned16(a.D)))
    return fail(why, "a tile-by-tile D needs beta == 0 and a 16-byte aligned D");
  if (a.smBudget < 0) return fail(why, "smBudget=%lld must be >= 0 (0 = all SMs)", a.smBudget);
  if (a.groupM < 0) return fail(why, "groupM=%lld must be >= 0 (0 = automatic)", a.groupM);
  if (a.pipeline < 0 || a.pipeline > 6)
    return fail(why,
                "pipeline=%lld must be 0 (automatic), 1 (deep), 2 (wide), 3 (ping-pong), 4 "
                "(ping-pong, 192-column units), 5 (deep ring, lent stage) or 6 (deep ring, "
                "carried epilogue)",
                a.pipeline);
  if (a.pipeline >= 5) {
    // LendPipe and CarryPipe: plain GEMMs with B [N,K] (the variants built; unpaired but for the
    // carried epilogue); only the store threads hand the lent stage back (5), or take a carried
    // half's stores inside the next tile's main loop (6), so the consumers may not issue the
    // stores themselves.
    const char* name = a.pipeline == 5 ? "pipeline 5 (deep ring, lent stage)"
                                       : "pipeline 6 (deep ring, carried epilogue)";
    // The carried epilogue runs as CTA pairs too (cluster=2; the static walk, untraced).
    if (!plainPipelineOk(a, name, why, a.pipeline == 6)) return false;
    const std::string n = name;
    if (a.bLayout != BLayout::kNK) return fail(why, (n + " takes B as [N,K] only").c_str());
    if (a.storeWarps == 0 || a.regStores == 1)
      return fail(why, (n + " stores through its store threads: storeWarps 0 and regStores 1 "
                            "do not apply")
                           .c_str());
  }
  if (a.pipeline == 4) {
    // gemm_pingunit.cuh: the plain static walk of 128x192 units, D stored from registers.
    if (!plainPipelineOk(a, "pipeline 4 (ping-pong, 192-column units)", why)) return false;
    if (a.tileClaim != nullptr)
      return fail(why,
                  "pipeline 4 (ping-pong, 192-column units) walks the static schedule (no "
                  "tileClaim)");
    if (!tmaStorable(a))
      return fail(why,
                  "pipeline 4 (ping-pong, 192-column units) stores D from registers, 8 columns "
                  "a 16-byte store: D 16-byte aligned, ldd and D's width multiples of 16 bytes");
  }
  if (a.pipeline == 3) {
    // What gemm_pingpong.cuh implements; everything else is refused rather than run wrong.
    if (a.dType == DType::kF32)
      return fail(why, "pipeline 3 (ping-pong consumers) needs a 16-bit output type");
    if (a.swiglu) return fail(why, "pipeline 3 (ping-pong consumers) takes no SwiGLU epilogue");
    if (a.dTiled) return fail(why, "pipeline 3 (ping-pong consumers) takes no tile-by-tile D");
    if (a.hooks.tileDone != nullptr)
      return fail(why,
                  "pipeline 3 (ping-pong consumers) takes no tileDone hook (a tile's two halves "
                  "finish in different warpgroups); of the hooks only rowReady, tileOrder, "
                  "rowBlockOffset and seqBase");
    if (a.tileClaim != nullptr)
      return fail(why, "pipeline 3 (ping-pong consumers) walks the static schedule (no tileClaim)");
  }
  if (a.trace != nullptr &&
      (a.groups.num != 0 || a.swiglu || (a.cluster == 2 && !tracedPairsBuilt(a.pipeline))))
    return fail(why,
                "grouped and SwiGLU GEMMs, and CTA pairs other than pipeline 1 (the deep ring) or "
                "3 (ping-pong), are not traced (GemmArgs::trace)");
  if (a.storeWarps < -1 || a.storeWarps > 1)
    return fail(why, "storeWarps=%lld must be -1 (by K), 0 (consumers issue the stores) or 1",
                a.storeWarps);
  if (a.regStores < 0 || a.regStores > 1)
    return fail(why, "regStores=%lld must be 0 (TMA stores) or 1 (stores from registers)",
                a.regStores);
  if (a.skipStores < 0 || a.skipStores > 1)
    return fail(why, "skipStores=%lld must be 0 (D stored) or 1 (a benchmark's diagnostic)",
                a.skipStores);
  if (a.storeHint < 0 || a.storeHint > 2)
    return fail(why,
                "storeHint=%lld must be 0 (automatic), 1 (D's stores L2 evict-first) or 2 (no L2 "
                "policy)",
                a.storeHint);
  if (a.trace != nullptr && (a.traceTiles <= 0 || a.traceCtas <= 0))
    return fail(why, "traceTiles=%lld and traceCtas=%lld must be positive with a trace buffer",
                a.traceTiles, a.traceCtas);
  if (a.streamK < -1 || a.streamK > 1)
    return fail(why, "streamK=%lld must be -1 (off), 0 (MKERNEL_GEMM_STREAMK) or 1 (on)",
                a.streamK);
  if (a.streamK == 1) {
    if (const char* c = streamKConflict(a)) return fail(why, c);
  }
  if (a.cluster < 0 || a.cluster > 2)
    return fail(why, "cluster=%lld must be 0 (MKERNEL_GEMM_CLUSTER), 1 or 2 (CTA pairs)",
                a.cluster);
  if (a.cluster == 2 && a.tileClaim != nullptr)
    return fail(why, "cluster=2 (CTA pairs) walks the static schedule: no tileClaim");
  if (a.cluster == 2 && !pairsAllowed(a))
    return fail(why,
                "cluster=2 (CTA pairs) needs a 16-bit D, no SwiGLU, no tile-by-tile D, no "
                "fused-operator hooks, smBudget 0 or >= 2, and grouped GEMMs not on pipeline 3");
  if (a.pipeline == 2 && a.dType == DType::kF32)
    return fail(why, "pipeline 2 (wide epilogue staging) needs a 16-bit output type");
  if (a.hooks.tileDoneRows && (a.hooks.tileDone == nullptr || a.hooks.seqBase != nullptr))
    return fail(why,
                "hooks.tileDoneRows counts finished tiles per row block from zero: it needs "
                "hooks.tileDone and no hooks.seqBase");
  if (a.hooks.rowReady != nullptr && a.hooks.rowsPerFlag <= 0)
    return fail(why, "hooks.rowsPerFlag=%lld must be positive", a.hooks.rowsPerFlag);
  if (a.swiglu) {
    if (a.groups.num == 0) return fail(why, "the SwiGLU epilogue runs in grouped GEMMs only");
    if (a.bLayout != BLayout::kNK)
      return fail(why, "the SwiGLU epilogue needs B in the [N,K] layout (gate rows, then up)");
    if (a.N % 16 != 0)
      return fail(why, "the SwiGLU epilogue needs N=%lld (2 x the output width) %% 16 == 0", a.N);
    if (a.dType == DType::kF32) return fail(why, "the SwiGLU epilogue stores a 16-bit D");
    if (a.beta != 0.0f) return fail(why, "the SwiGLU epilogue takes no C (beta must be 0)");
  }
  if (a.groups.num != 0) {
    const GemmGroups& g = a.groups;
    if (g.num < 0 || g.num > kMaxGroups)
      return fail(why, "groups.num=%lld must be in 1..%lld", g.num, kMaxGroups);
    if (g.rowStart == nullptr || g.rowCount == nullptr)
      return fail(why, "a grouped GEMM needs groups.rowStart and groups.rowCount (device arrays)");
    if ((a.hooks.tileDone != nullptr && !a.hooks.tileDoneRows) || a.hooks.tileOrder != nullptr ||
        a.hooks.rowBlockOffset != 0 || a.dTiled)
      return fail(why,
                  "a grouped GEMM takes no per-tile hooks (tileDone without tileDoneRows, "
                  "tileOrder, rowBlockOffset) and no tile-by-tile D; of the fused-operator hooks "
                  "rowReady and tileDone in row-count mode");
    const int64_t rows = a.bLayout == BLayout::kKN ? a.K : a.N;
    const int64_t stride = effStrideB(a);
    if (stride < rows * effLdb(a) || stride % 8 != 0)
      return fail(why,
                  "groups.strideB=%lld must be >= one group's B (%lld elements) and a multiple of "
                  "8 (16-byte aligned groups)",
                  stride, rows * effLdb(a));
  }
  return true;
}

// Whether 128 x kPingUnitN units load the persistent grid at least as evenly as 128 x kTileN
// tiles (the busiest CTA's columns of D, per 128 rows, under each walk), with work for both
// consumer warpgroups. 8192 x 8192 on 132 CTAs: 21 units (4032 columns) against 16 tiles (4096);
// 4096 x 4096: 6 units (1152) against 4 tiles (1024).
bool unitsFill(const GemmArgs& a, int32_t sms) {
  const int64_t tm = tilesM(a), cols = outCols(a);
  const int64_t units = tm * ((cols + kPingUnitN - 1) / kPingUnitN);
  const int64_t tiles = tm * ((cols + kTileN - 1) / kTileN);
  // Two units a CTA at least: with one, a warpgroup idles and no epilogue hides under a main loop.
  return units >= 2 * (int64_t)sms &&
         (units + sms - 1) / sms * kPingUnitN <= (tiles + sms - 1) / sms * kTileN;
}

// Pipeline 0's choice on plain unpaired GEMMs with B [N,K] and a 16-bit D, which pipelines 4, 5
// and 6's rules (canImplement) allow: first the unit walk (below); else MKERNEL_GEMM_AUTO_LEND 2
// (default): the carried epilogue at every K (1.01-1.03x the deep ring at K = 8192 and 28672 on
// claimed tiles, session 49), but the lent stage for beta != 0 (whose epilogue reads C: the carried
// kernel would run the deep ring's two-post epilogue, which waits for its first boxes to be read;
// the lent stage stages the half-tile whole); 1: the lent stage. The lent stage only where the wide
// split ran before (K <= kWideMaxK): past it, never measured.
int autoPipeline(const GemmArgs& a, int32_t sms) {
  if (a.pipeline != 0 || a.dType == DType::kF32 || a.bLayout != BLayout::kNK || a.groups.num != 0 ||
      a.swiglu || a.dTiled || anyHook(a.hooks) || a.storeWarps == 0 || a.regStores != 0 ||
      resolvedCluster(a) != 1 || resolvedStreamK(a))
    return 0;
  // Why the unit walk at small K (session 56, H100, calls K and L): at 8192 x 8192 x 1024 it ran
  // 0.968 of cuBLAS-best against the carried epilogue's 0.937, at 16384 x 8192 x 1024 0.955
  // against 0.918, at K = 2048 / 4096 0.989 / 0.989 against 0.972 / 0.969; where its units load
  // the grid less evenly (4096 x 4096, 2048 x 8192 at K = 1024) it lost (0.899, 0.927 against
  // 0.928, 0.965), and at K = 8192 it lost at 8192 x 28672 (0.962 against 1.009). Its epilogue
  // reads C element by element, so beta 0 only; a caller's tileClaim is the cooperative walk's.
  // A D-store diagnostic or an explicit L2 policy asks for the TMA-store epilogue's kernels.
  if (sms > 0 && a.beta == 0.0f && a.tileClaim == nullptr && tmaStorable(a) && a.skipStores != 1 &&
      a.storeHint != 1 && a.K <= MK_PARAM_INT(GemmUnitsMaxK) && unitsFill(a, sms))
    return 4;
  int kind = (int)MK_PARAM_INT(GemmAutoLend);
  if (kind == 2 && a.beta != 0.0f) kind = 1;
  if (kind == 1 && a.K > kWideMaxK) kind = 0;
  return kind == 2 ? 6 : (kind == 1 ? 5 : 0);
}

bool autoClaims(const GemmArgs& a, int32_t sms) {
  if (a.pipeline != 0 || a.tileClaim != nullptr || a.trace != nullptr) return false;
  const int resolved = autoPipeline(a, sms);
  if (resolved == 5 || resolved == 6) return true;
  return a.groups.num != 0 && !anyHook(a.hooks) && MK_PARAM_INT(GemmGroupClaim) != 0 &&
         resolvedCluster(a) == 1;  // CTA pairs walk the static schedule
}

// The L2 choices below leave calls with hooks alone: a fused operator's hooks publish tiles in
// raster order (its communication follows it). Grouped GEMMs take their own settings: their bands
// are cut per group (raster.h) and each group's B is new bytes.

// Why 32 row blocks at K ~ 1024..2048 (session 51, H100): at 8192 x 8192 x 1024 bands of 8 re-read
// all of B (16 MB) eight times while D (128 MB) streams through L2; bands of 32 read it twice
// (1.023-1.028x). At K = 512 no gain, at K >= 4096 the k-loop hides the reloads.
int32_t autoGroupM(const GemmArgs& a) {
  if (anyHook(a.hooks)) return 8;
  if (a.groups.num != 0) return (int32_t)MK_PARAM_INT(GemmGroupBand);
  return a.K >= MK_PARAM_INT(GemmBandMinK) && a.K <= MK_PARAM_INT(GemmBandMaxK) ? 32 : 8;
}

// Why only a D larger than the L2 (session 51, H100): there the policy gained 1.013-1.026x at
// 8192 x 8192 x 512 (D 128 MB); with D at 32 MB (4096 x 4096, 2048 x 8192 at K = 1024) the bands
// alone did as well, and a D that fits is worth keeping for its next reader.
int32_t autoStoreHint(const GemmArgs& a, int64_t l2Bytes) {
  const int64_t dBytes = (int64_t)a.M * outCols(a) * (int64_t)dtypeSize(a.dType);
  if (anyHook(a.hooks) || dBytes <= l2Bytes) return 0;
  if (a.groups.num != 0) return MK_PARAM_INT(GemmGroupHint) != 0 ? 1 : 0;
  return a.K <= MK_PARAM_INT(GemmHintMaxK) ? 1 : 0;
}

// The persistent CTAs a call may use: GemmArgs::smBudget, or all `sms` of the device.
int32_t budgetOf(const GemmArgs& a, int32_t sms) {
  return a.smBudget > 0 && a.smBudget < sms ? a.smBudget : sms;
}

ncclResult_t buildParams(const GemmArgs& args, GemmParams* out, int32_t* gridOut) {
  std::string why;
  if (!canImplement(args, &why)) {
    MK_WARN("GEMM M=%d N=%d K=%d: %s", args.M, args.N, args.K, why.c_str());
    return ncclInvalidArgument;
  }
  NCCLCHECK(cudaLibInit());
  DeviceLimits lim;
  NCCLCHECK(deviceLimits(&lim));
  // Pipeline 0's unit walk changes the walk's columns and B's box: resolved once, here, and the
  // rest reads it as if named (autoPipeline returns 4 only where pipeline 4's rules hold).
  GemmArgs a = args;
  if (a.pipeline == 0 && autoPipeline(a, budgetOf(a, lim.sms)) == 4) a.pipeline = 4;
  MK_ARGCHECK(lim.major == 9 && lim.minor == 0,
              "GEMM engine needs an sm_90 (Hopper) device; this one is sm_%d%d", lim.major,
              lim.minor);
  MK_ARGCHECK(lim.smemOptin >= kSmemBytes,
              "GEMM engine needs %d bytes of shared memory per block; the device allows %d",
              kSmemBytes, lim.smemOptin);

  GemmParams& p = *out;
  memset(&p, 0, sizeof(p));
  NCCLCHECK(encode2d(&p.tmA, a.abType, a.A, a.K, a.M, effLda(a), kTileK, kTileM));
  const uint64_t ng = (uint64_t)a.groups.num;
  if (ng > 0 && a.bLayout == BLayout::kKN) {
    NCCLCHECK(encode3d(&p.tmB, a.abType, a.B, a.N, a.K, ng, effLdb(a), effStrideB(a), 64, kTileK));
  } else if (ng > 0) {
    // The SwiGLU epilogue loads gate and up rows as two boxes of half a tile each, a
    // ping-pong consumer's unit is half a tile (gemm_pingpong.cuh), and so is a CTA pair's
    // share of the tile's B (gemm_kernel.cuh loadB).
    const uint32_t boxN =
        a.swiglu || a.pipeline == 3 || resolvedCluster(a) == 2 ? kTileN / 2 : kTileN;
    NCCLCHECK(
        encode3d(&p.tmB, a.abType, a.B, a.K, a.N, ng, effLdb(a), effStrideB(a), kTileK, boxN));
  } else if (a.bLayout == BLayout::kKN) {
    NCCLCHECK(encode2d(&p.tmB, a.abType, a.B, a.N, a.K, effLdb(a), 64, kTileK));
  } else {
    // A CTA of a pair loads half of the tile's B rows (gemm_kernel.cuh loadB), and so does
    // a ping-pong consumer's unit (gemm_pingpong.cuh); a CTA of a ping-pong pair half of that;
    // a 192-column unit (pipeline 4, gemm_pingunit.cuh) 192 rows.
    const bool pair = resolvedCluster(a) == 2, ping = a.pipeline == 3;
    const uint32_t boxN = a.pipeline == 4 ? kPingUnitN
                          : pair && ping  ? kTileN / 4
                                          : (pair || ping ? kTileN / 2 : kTileN);
    NCCLCHECK(encode2d(&p.tmB, a.abType, a.B, a.K, a.N, effLdb(a), kTileK, boxN));
  }
  const size_t es = dtypeSize(a.dType);
  p.useTmaStore = tmaStorable(a);
  if (a.dTiled) {
    p.useTmaStore = 1;
    p.dTiled = 1;
    NCCLCHECK(encodeTiled(&p.tmD, a.dType, a.D, tilesM(a), tilesN(a)));
  } else if (p.useTmaStore) {
    NCCLCHECK(encode2d(&p.tmD, a.dType, a.D, outCols(a), a.M, effLdd(a), 128 / es, 64));
  }
  p.M = a.M;
  p.N = outCols(a);  // with swiglu also the up rows' offset in B
  p.swiglu = a.swiglu ? 1 : 0;
  p.K = a.K;
  p.tilesM = tilesM(a);
  p.tilesN = tilesN(a);
  p.kTiles = (a.K + kTileK - 1) / kTileK;
  p.groupM = a.groupM > 0 ? a.groupM : autoGroupM(a);
  p.grpRaster = (int32_t)MK_PARAM_INT(GemmGroupRaster);
  p.grpNum = a.groups.num;
  p.grpStart = a.groups.rowStart;
  p.grpCount = a.groups.rowCount;
  // Grouped GEMMs too: on the H200 (session 13) the wide staging ran 1.015-1.018x the deep
  // ring at issue 13's K=2048 shapes and 1.003x at K=7168.
  const int resolved = a.pipeline != 0 ? a.pipeline : autoPipeline(a);
  const int32_t carry = resolved == 6 ? 1 : 0;
  const bool lend = resolved == 5;
  p.wide = resolved == 2 || (resolved == 0 && a.dType != DType::kF32 && a.K <= kWideMaxK);
  // Pipeline 3 is opt-in only (no gain measured, plain or grouped: gemm-notes); 4 also pipeline
  // 0's unit walk (resolved above).
  p.pingpong = a.pipeline == 3 ? 1 : (a.pipeline == 4 ? 2 : 0);
  p.lend = lend ? 1 : 0;
  p.carry = carry;
  p.D = a.D;
  p.ldd = effLdd(a);
  p.C = a.C != nullptr ? a.C : a.D;
  p.ldc = effLdc(a);
  p.alpha = a.alpha;
  p.beta = a.beta;
  p.cluster = resolvedCluster(a);
  p.hooks = a.hooks;
  p.hooks.rowBlockOffset = ((a.hooks.rowBlockOffset % p.tilesM) + p.tilesM) % p.tilesM;

  // Grouped: the tile count is known only on the device; every group adds at most one
  // partial row block to the tilesM that M holds.
  const int64_t tiles = (int64_t)(p.tilesM + p.grpNum) * p.tilesN;
  const int32_t budget = budgetOf(a, lim.sms);
  *gridOut = (int32_t)(tiles < budget ? tiles : budget);
  // Dynamic schedule: every CTA of the budget (CTAs past the tile count find none and leave).
  p.tileClaim = a.tileClaim;
  if (a.tileClaim != nullptr) *gridOut = budget;
  p.trace = a.trace;
  p.traceTiles = a.traceTiles;
  p.traceCtas = a.traceCtas;
  // The lent stage and the carried epilogue at every K: only the store threads say when the
  // staging is read (canImplement).
  const bool storeWarps =
      a.storeWarps == 1 || lend || carry != 0 || (a.storeWarps == -1 && a.K <= kStoreWarpsMaxK);
  // Not the ping-pong consumers (their own epilogue), nor the traced wide split (whose kernel
  // leaves the register stores out: gemm_epilogue.cuh tileEpilogue).
  p.regStores = a.regStores == 1 && regStorable(a) && a.pipeline != 3 && a.pipeline != 4 &&
                        !(a.trace != nullptr && p.wide)
                    ? 1
                    : 0;
  // (The unit walk, pipeline 4, has no store threads.)
  p.storeWarps =
      storeWarps && p.useTmaStore && !p.regStores && a.hooks.tileDone == nullptr && resolved != 4
          ? 1
          : 0;
  p.skipStores = a.skipStores == 1 && p.storeWarps ? 1 : 0;
  // Only the cooperative kernels' 2-D stores carry the policy (issueBoxStores).
  const bool hint = a.storeHint == 1 || (a.storeHint == 0 && autoStoreHint(a, lim.l2Bytes) == 1);
  p.storeHint = hint && p.useTmaStore && !p.regStores && !a.dTiled && p.pingpong == 0 ? 1 : 0;
  if (p.cluster == 2) {  // whole pairs (the launch may cut to the pairs that fit at once)
    // Grouped: each group's row tiles pair up on their own, so a group adds at most one
    // partial row tile and one half-empty pair.
    const int64_t pairs = (int64_t)(p.tilesM + 2 * p.grpNum + 1) / 2 * p.tilesN;
    *gridOut = 2 * (int32_t)(pairs < budget / 2 ? pairs : budget / 2);
  }
  // Stream-K tail (streamk.h): the plan only; launch() adds the workspace (fused operators,
  // which call buildParams for their own kernels, never run the stream-K variant).
  const bool sk = p.cluster == 1 && p.grpNum == 0 && resolvedStreamK(a);
  p.sk = skMakePlan(p.tilesM * p.tilesN, p.kTiles, *gridOut, sk);
  return ncclSuccess;
}

ncclResult_t preload(const GemmArgs& a) {
  // Only the variant (types, B layout) matters: grid 0 loads the kernel and launches nothing,
  // so no tensor maps are built for it.
  GemmParams p;
  memset(&p, 0, sizeof(p));
  p.grpNum = a.groups.num;
  p.swiglu = a.swiglu ? 1 : 0;
  p.cluster = resolvedCluster(a);
  if (a.abType == DType::kBF16) return dispatchOut<DType::kBF16>(a, p, 0, nullptr);
  return dispatchOut<DType::kF16>(a, p, 0, nullptr);
}

ncclResult_t launch(const GemmArgs& a, cudaStream_t stream) {
  GemmParams p;
  int32_t grid = 0;
  NCCLCHECK(buildParams(a, &p, &grid));
  if (p.sk.units > 0) {
    // The epoch is a host counter: a captured launch would replay with the same one and find
    // its flags already set by the previous replay, so captured GEMMs run data-parallel.
    bool ok = false;
    if (!capturing(stream)) {
      int dev = 0;
      DeviceLimits lim;
      CUDACHECK(cudaGetDevice(&dev));
      NCCLCHECK(deviceLimits(&lim));
      NCCLCHECK(skWorkspace(dev, lim.sms, stream, &p, &ok));
    }
    if (!ok) p.sk = skMakePlan(p.sk.tiles, p.sk.kIt, p.sk.grid, false);
  }
  // Pipeline 0's carried epilogue or lent stage (and grouped GEMMs under MKERNEL_GEMM_GROUP_CLAIM)
  // claims its tiles where there is more than one wave of them: CTAs that run faster take the
  // slower ones' share (the static walk's latest CTA ended ~0.5 tile after the median one at 8192 x
  // 8192 x 1024, session 47). Not under capture (a graph could be replayed on another stream,
  // concurrently with this stream's launches on the same counter), nor traced (a CTA's records are
  // sized for the static walk).
  DeviceLimits lim;
  NCCLCHECK(deviceLimits(&lim));
  const int32_t budget = budgetOf(a, lim.sms);
  if (autoClaims(a, budget)) {
    if ((int64_t)p.tilesM * p.tilesN > budget && !capturing(stream)) {
      int dev = 0;
      CUDACHECK(cudaGetDevice(&dev));
      NCCLCHECK(claimCounter(dev, stream, &p.tileClaim));
      if (p.tileClaim != nullptr) {
        p.claimReset = 1;
        grid = budget;  // every CTA of the budget claims (the dynamic schedule's grid)
      }
    }
  }
  if (a.abType == DType::kBF16) return dispatchOut<DType::kBF16>(a, p, grid, stream);
  return dispatchOut<DType::kF16>(a, p, grid, stream);
}

}  // namespace gemm
}  // namespace mk
