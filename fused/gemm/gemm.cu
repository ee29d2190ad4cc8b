// Host side of the GEMM engine: tensor maps, parameters, workspaces, variant dispatch (the
// argument rules and automatic choices are gemm_rules.cc).
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
#include "fused/gemm/dtype_built.h"
#include "fused/gemm/gemm_rules.h"
#include "fused/gemm/primitives.cuh"

namespace mk {
namespace gemm {

// Instantiated in gemm_inst_<in>_<out>_<layout>_{plain,grouped}.cu (gemm_launch.cuh).
template <DType kIn, DType kOut, BLayout kB>
ncclResult_t launchPlain(const GemmParams& p, int32_t grid, cudaStream_t stream);
template <DType kIn, DType kOut, BLayout kB>
ncclResult_t launchGrouped(const GemmParams& p, int32_t grid, cudaStream_t stream);

// preload (grid 0) loads the kernels of the call's kind only.
template <DType kIn, DType kOut, BLayout kB>
ncclResult_t launchVariant(const GemmParams& p, int32_t grid, cudaStream_t stream) {
  return p.grpNum > 0 ? launchGrouped<kIn, kOut, kB>(p, grid, stream)
                      : launchPlain<kIn, kOut, kB>(p, grid, stream);
}

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

ncclResult_t dtypeNotBuilt(const char* op) {
  MK_WARN("%s: fp16 kernels are not in this build (configured with -DMK_BUILD_F16=OFF)", op);
  return ncclInvalidArgument;
}

size_t smemBytes() {
  return kSmemBytes;
}

namespace {

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

// The variant for a's types and B layout (byInType / byOutType: only what this build holds).
ncclResult_t dispatch(const GemmArgs& a, const GemmParams& p, int32_t grid, cudaStream_t s) {
  return byInType(a.abType, "GEMM", [&](auto in) {
    return byOutType(a.dType, "GEMM", [&](auto out) {
      constexpr DType kIn = decltype(in)::value, kOut = decltype(out)::value;
      return a.bLayout == BLayout::kKN ? launchVariant<kIn, kOut, BLayout::kKN>(p, grid, s)
                                       : launchVariant<kIn, kOut, BLayout::kNK>(p, grid, s);
    });
  });
}

}  // namespace

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
  const int autoPl = a.pipeline == 0 ? autoPipeline(a, budgetOf(a, lim.sms)) : 0;
  if (autoPl == 4) a.pipeline = 4;
  // Pipeline 4's unit width, read once: B's box rows and the kernel (GemmParams::unitN).
  const int32_t unitN = a.pipeline == 4 ? unitWidth(a) : 0;
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
    const uint32_t boxN = a.pipeline == 4                                          ? unitN
                          : a.swiglu || a.pipeline == 3 || resolvedCluster(a) == 2 ? kTileN / 2
                                                                                   : kTileN;
    NCCLCHECK(
        encode3d(&p.tmB, a.abType, a.B, a.K, a.N, ng, effLdb(a), effStrideB(a), kTileK, boxN));
  } else if (a.bLayout == BLayout::kKN) {
    NCCLCHECK(encode2d(&p.tmB, a.abType, a.B, a.N, a.K, effLdb(a), 64, kTileK));
  } else {
    // A CTA of a pair loads half of the tile's B rows (gemm_kernel.cuh loadB), and so does
    // a ping-pong consumer's unit (gemm_pingpong.cuh); a CTA of a ping-pong pair half of that;
    // a unit of pipeline 4 (gemm_pingunit.cuh) its width in rows (192, or 176: unitWidth).
    const bool pair = resolvedCluster(a) == 2, ping = a.pipeline == 3;
    const uint32_t boxN = a.pipeline == 4 ? unitN
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
  const int resolved = a.pipeline != 0 ? a.pipeline : autoPl;
  const int32_t carry = resolved == 6 ? 1 : 0;
  const bool lend = resolved == 5;
  p.wide = resolved == 2 || (resolved == 0 && a.dType != DType::kF32 && a.K <= kWideMaxK);
  // Pipeline 3 is opt-in only (no gain measured, plain or grouped: gemm-notes); 4 also pipeline
  // 0's unit walk (resolved above).
  p.pingpong = a.pipeline == 3 ? 1 : (a.pipeline == 4 ? 2 : 0);
  p.unitN = unitN;
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
  // leaves the register stores out: gemm_epilogue.cuh tileEpilogue). The unit walk (pipeline 4)
  // takes them instead of its staged epilogue.
  p.regStores =
      a.regStores == 1 && regStorable(a) && a.pipeline != 3 && !(a.trace != nullptr && p.wide) ? 1
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
  return dispatch(a, p, 0, nullptr);
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
  return dispatch(a, p, grid, stream);
}

}  // namespace gemm
}  // namespace mk
