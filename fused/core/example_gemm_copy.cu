#include "fused/core/example_gemm_copy.h"

#include <cstdint>
#include <string>
#include <algorithm>

#include "base/param.h"

#include "fused/core/cost_model.h"
#include "device/rt/wait.cuh"
#include "fused/gemm/gemm_kernel.cuh"

namespace mk {
namespace fused {

namespace {

struct GemmCopyParams {
  gemm::GemmParams g;  // first: holds the 64-byte aligned tensor maps
  SmSplit split;
  __nv_bfloat16* dst;
  int64_t ldDst;
  uint64_t* copyFlags;
  uint64_t seq;
};

static_assert(GemmCopyConfig::kThreads == gemm::kThreads, "compute role needs the GEMM CTA shape");
static_assert(gemm::kSmemBytes <= gemm::kMaxSmemPerBlock, "shared-memory budget");

// Role: intra-node communication. Walks the tiles in the order the compute CTAs publish
// them (schedule position t), waits for each flag with the bounded wait, copies the tile.
__device__ void copyRole(const GemmCopyParams& p, int32_t idx, int32_t nIdx) {
  const gemm::GemmParams& g = p.g;
  const int32_t numTiles = g.tilesM * g.tilesN;
  __shared__ int32_t okShared;
  const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(g.D);
  for (int32_t t = idx; t < numTiles; t += nIdx) {
    int32_t mBlk, nBlk;
    gemm::tileCoords(g, t, &mBlk, &nBlk);
    const int32_t slot = mBlk * g.tilesN + nBlk;
    if (threadIdx.x == 0) {
      okShared =
          rt::waitFlag(g.hooks.wait, g.hooks.tileDone + slot, g.hooks.tileDoneValue, slot, false);
    }
    __syncthreads();
    if (!okShared) return;  // error recorded; the host sees it via rt::domainCheck
    const int32_t m0 = mBlk * gemm::kTileM, n0 = nBlk * gemm::kTileN;
    const int32_t rows = min(gemm::kTileM, g.M - m0), cols = min(gemm::kTileN, g.N - n0);
    // Each thread moves bf16 pairs along a row (coalesced); tiles are small enough that
    // this role is never the bottleneck of the demo.
    for (int32_t e = threadIdx.x; e < rows * cols; e += blockDim.x) {
      const int32_t r = e / cols, c = e - r * cols;
      p.dst[(int64_t)(m0 + r) * p.ldDst + n0 + c] = src[(int64_t)(m0 + r) * g.ldd + n0 + c];
    }
    if (p.copyFlags != nullptr) {
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) rt::releaseFlag(p.copyFlags + slot, p.seq, false);
    }
    __syncthreads();  // okShared is rewritten next iteration
  }
}

// 5. Kernel with role dispatch. Compute CTAs need the GEMM register split (setmaxnreg),
// hence __launch_bounds__(384, 1) for the whole kernel.
template <gemm::BLayout kB>
__global__ void __launch_bounds__(GemmCopyConfig::kThreads, 1)
    gemmCopyKernel(const __grid_constant__ GemmCopyParams p) {
  extern __shared__ uint8_t smem[];
  int32_t idx;
  switch (p.split.roleOf(blockIdx.x, &idx)) {
    case Role::kCompute:
      gemm::gemmCta<gemm::Traits<gemm::DType::kBF16, gemm::DType::kBF16, kB>>(
          p.g, smem, idx, p.split.of(Role::kCompute));
      break;
    case Role::kIntraComm:
      copyRole(p, idx, p.split.of(Role::kIntraComm));
      break;
    default:
      break;  // no inter-node roles in this operator
  }
}

}  // namespace

bool canImplement(const GemmCopyArgs& a, std::string* why) {
  if (!gemm::canImplement(a.gemm, why)) return false;
  auto fail = [&](const char* m) {
    if (why) *why = m;
    return false;
  };
  if (a.gemm.abType != gemm::DType::kBF16 || a.gemm.dType != gemm::DType::kBF16)
    return fail("example GEMM+copy supports bf16 inputs and output only");
  if (a.gemm.hooks.tileDone != nullptr || a.gemm.hooks.rowReady != nullptr)
    return fail("example GEMM+copy sets the GEMM hooks itself");
  if (a.copyDst == nullptr || a.tileFlags == nullptr || a.domain == nullptr)
    return fail("copyDst, tileFlags and domain must not be null");
  if (a.ldCopy != 0 && a.ldCopy < a.gemm.N) return fail("ldCopy must be >= N");
  if (a.seq == 0) return fail("seq must be > 0 (flags start at 0)");
  return true;
}

ncclResult_t launch(const GemmCopyArgs& a, cudaStream_t stream, SmSplit* splitOut) {
  std::string why;
  if (!canImplement(a, &why)) {
    MK_WARN("GEMM+copy: %s", why.c_str());
    return ncclInvalidArgument;
  }
  DeviceInfo info;
  NCCLCHECK(getDeviceInfo(a.domain->device, &info));
  const int budget = a.gemm.smBudget > 0 ? std::min(a.gemm.smBudget, info.sms) : info.sms;

  SplitQuery q;
  q.M = a.gemm.M;
  q.N = a.gemm.N;
  q.K = a.gemm.K;
  q.intraBytes = 2.0 * a.gemm.M * a.gemm.N * 2;  // read + write of D
  DeviceRates rates;
  // The model needs rates only when no override decides the split.
  if (a.commSms < 0 && MK_PARAM_INT(FusedCommSms) < 0)
    NCCLCHECK(getDeviceRates(info.device, &rates));
  SplitChoice choice = resolveSplit(q, rates, budget, a.commSms);
  SmSplit split = choice.split;
  if (split.of(Role::kIntraComm) <= 0) {  // this operator needs at least one copy CTA
    split.count[(int)Role::kIntraComm] = 1;
    split.count[(int)Role::kCompute] = budget - 1;
  }
  MK_ARGCHECK(split.of(Role::kCompute) > 0, "GEMM+copy: no SMs left for compute (budget %d)",
              budget);
  if (splitOut != nullptr) *splitOut = split;

  GemmCopyParams p;
  gemm::GemmArgs g = a.gemm;
  g.hooks.tileDone = a.tileFlags;
  g.hooks.tileDoneValue = a.seq;
  g.hooks.wait = rt::domainCtx(a.domain, rt::kOpExample, a.timeoutMs);
  int32_t gridUnused;
  NCCLCHECK(gemm::buildParams(g, &p.g, &gridUnused));
  p.split = split;
  p.dst = static_cast<__nv_bfloat16*>(a.copyDst);
  p.ldDst = a.ldCopy ? a.ldCopy : a.gemm.N;
  p.copyFlags = a.copyFlags;
  p.seq = a.seq;
  MK_INFO(kFused, "GEMM+copy M=%d N=%d K=%d split compute=%d comm=%d (%s)", g.M, g.N, g.K,
          split.of(Role::kCompute), split.of(Role::kIntraComm), choice.source);
  if (g.bLayout == gemm::BLayout::kKN)
    return launchRoles(gemmCopyKernel<gemm::BLayout::kKN>, split, GemmCopyConfig::kThreads,
                       gemm::kSmemBytes, stream, p);
  return launchRoles(gemmCopyKernel<gemm::BLayout::kNK>, split, GemmCopyConfig::kThreads,
                     gemm::kSmemBytes, stream, p);
}

}  // namespace fused
}  // namespace mk
