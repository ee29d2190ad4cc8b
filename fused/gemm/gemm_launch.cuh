// The stand-alone GEMM kernel and its launchers, instantiated per (input, output, B layout, plain
// or grouped) in gemm_inst_*.cu so that the 24 units compile in parallel.
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>
#include "base/checks.h"
#include "fused/gemm/gemm_kernel.cuh"
#include "fused/gemm/gemm_pingunit.cuh"

namespace mk {
namespace gemm {

// kTraced: the instantiation with the timeline stamps (GemmParams::trace), launched only for a
// traced call, so the code every other launch runs is the untraced kernel's, unchanged.
template <class Tr, bool kTraced = false>
__global__ void __launch_bounds__(kThreads, 1) gemmKernel(const __grid_constant__ GemmParams p) {
  extern __shared__ uint8_t smem[];
  // Store threads (GemmArgs::storeWarps) but for stream-K, whose consumer state left no room
  // for the handshake's counter (spills in the wide stream-K instances).
  gemmCta<Tr, NoSide, kTraced, !Tr::kStreamK>(p, smem, blockIdx.x, gridDim.x);
}

// The traced kernels exist for the plain walks only (canImplement refuses the others); CTA
// pairs with the deep ring only (the traced wide pairs spilled 12 bytes, sessions 43 and 45;
// gemm.cu tracedPairsBuilt says which pipelines these are).
template <class Tr>
constexpr bool kTraceable = !Tr::kStreamK && !Tr::kGrouped && !Tr::kGated &&
                            (Tr::kCluster == 1 || std::is_same<typename Tr::Pipe, DeepPipe>::value);

// CTA pairs: a cluster launch of `kernel` (the cooperative or the ping-pong kernel of Tr).
// `grid` (even, from buildParams) is cut to the pairs that can be resident at once (pairs
// beyond would only start once others finished, each then walking its share of the positions
// late). The count is queried once per device and variant (a traced kernel has the same
// shared memory and threads): the query costs host time at every launch otherwise.
template <class Tr, class Kernel>
ncclResult_t launchPairs(Kernel kernel, const GemmParams& p, int32_t grid, cudaStream_t stream) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];  // co-resident pairs + 1; 0: not yet queried
  int dev = 0;
  CUDACHECK(cudaGetDevice(&dev));
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = Tr::Pipe::kSmemBytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = dev < kMaxDevices ? cached[dev].load(std::memory_order_relaxed) - 1 : -1;
  if (clusters < 0) {
    CUDACHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
    if (dev < kMaxDevices) cached[dev].store(clusters + 1, std::memory_order_relaxed);
    MK_INFO(kFused, "GEMM CTA pairs: %d pairs of %d-byte CTAs resident at once on device %d",
            clusters, Tr::Pipe::kSmemBytes, dev);
  }
  if (clusters <= 0) {
    MK_WARN("GEMM: no CTA pair of %d bytes of shared memory each fits on this device",
            Tr::Pipe::kSmemBytes);
    return ncclInvalidArgument;
  }
  cfg.gridDim = dim3(grid < 2 * clusters ? grid : 2 * clusters);
  CUDACHECK(cudaLaunchKernelEx(&cfg, kernel, p));
  return ncclSuccess;
}

// `kernel` (one of Tr's: the cooperative or the ping-pong kernel, traced or not) with Tr's
// shared memory, as CTA pairs where Tr says so. grid <= 0 (preload) only sets the attribute,
// which loads the module.
template <class Tr, class Kernel>
ncclResult_t launchKernel(Kernel kernel, const GemmParams& p, int32_t grid, cudaStream_t stream) {
  // Per-function attribute; cheap to set again, and no static state across devices.
  CUDACHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 Tr::Pipe::kSmemBytes));
  if (grid <= 0) return ncclSuccess;
  if constexpr (Tr::kCluster == 2) return launchPairs<Tr>(kernel, p, grid, stream);
  kernel<<<grid, kThreads, Tr::Pipe::kSmemBytes, stream>>>(p);
  CUDACHECK(cudaGetLastError());
  return ncclSuccess;
}

// The ping-pong kernel (gemm_pingpong.cuh), unpaired or as CTA pairs; the traced
// instantiation for plain GEMMs only (canImplement refuses grouped traces).
template <class Tr>
ncclResult_t launchPing(const GemmParams& p, int32_t grid, cudaStream_t stream) {
  auto kernel = gemmPingKernel<Tr>;
  if constexpr (!Tr::kGrouped) {
    if (p.trace != nullptr) kernel = gemmPingKernel<Tr, true>;
  }
  return launchKernel<Tr>(kernel, p, grid, stream);
}

// The ping-pong over whole units (gemm_pingunit.cuh; pipeline 4).
template <class Tr>
ncclResult_t launchUnit(const GemmParams& p, int32_t grid, cudaStream_t stream) {
  auto kernel = gemmUnitKernel<Tr>;
  if constexpr (!Tr::kGrouped) {  // grouped calls are not traced (canImplement)
    if (p.trace != nullptr) kernel = gemmUnitKernel<Tr, true>;
  }
  return launchKernel<Tr>(kernel, p, grid, stream);
}

// Pipeline 4 at the width buildParams chose (GemmParams::unitN: 176 with B [N,K] only); preload
// (grid 0) loads both widths where both exist.
template <DType kIn, DType kOut, BLayout kB, bool Grouped>
ncclResult_t launchUnits(const GemmParams& p, int32_t grid, cudaStream_t stream) {
  if constexpr (kB == BLayout::kNK) {
    using Narrow = UnitTraits<kIn, kOut, kB, Grouped, kPingUnitNarrowN>;
    if (p.unitN == kPingUnitNarrowN || grid <= 0) NCCLCHECK(launchUnit<Narrow>(p, grid, stream));
    if (p.unitN == kPingUnitNarrowN) return ncclSuccess;
  }
  return launchUnit<UnitTraits<kIn, kOut, kB, Grouped>>(p, grid, stream);
}

template <class Tr>
ncclResult_t launchPipe(const GemmParams& p, int32_t grid, cudaStream_t stream) {
  auto kernel = gemmKernel<Tr>;
  if constexpr (kTraceable<Tr>) {
    if (p.trace != nullptr) kernel = gemmKernel<Tr, true>;
  }
  return launchKernel<Tr>(kernel, p, grid, stream);
}

// Grouped GEMMs (GemmParams::grpNum > 0) of one type and layout; preload (grid 0) loads every
// grouped kernel the call could resolve to.
template <DType kIn, DType kOut, BLayout kB>
ncclResult_t launchGrouped(const GemmParams& p, int32_t grid, cudaStream_t stream) {
  // The wide staging only when asked for (GemmArgs::pipeline 2); preload (grid 0) loads
  // both pipelines.
  if (p.swiglu) {
    if constexpr (kB == BLayout::kNK && kOut != DType::kF32) {
      if (p.wide || grid <= 0)
        NCCLCHECK((launchPipe<Traits<kIn, kOut, kB, GroupWidePipe, true>>(p, grid, stream)));
      if (p.wide) return ncclSuccess;
      return launchPipe<Traits<kIn, kOut, kB, GroupPipe, true>>(p, grid, stream);
    } else {
      // canImplement refuses these (preload does not call it); nothing was instantiated.
      MK_WARN("GEMM: the SwiGLU epilogue needs B [N,K] and a 16-bit D");
      return ncclInvalidArgument;
    }
  }
  if constexpr (kOut != DType::kF32) {
    // The carried epilogue (pipeline 6: B [N,K], unpaired, no SwiGLU; canImplement).
    if constexpr (kB == BLayout::kNK) {
      if (p.carry || grid <= 0)
        NCCLCHECK((launchPipe<Traits<kIn, kOut, kB, GroupCarryPipe>>(p, grid, stream)));
      if (p.carry) return ncclSuccess;
    }
    // Whole units (pipeline 4; no SwiGLU, checked by canImplement).
    if (p.pingpong == 2 || grid <= 0)
      NCCLCHECK((launchUnits<kIn, kOut, kB, true>(p, grid, stream)));
    if (p.pingpong == 2) return ncclSuccess;
    // Ping-pong consumers (pipeline 3; no SwiGLU, checked by canImplement).
    if (p.pingpong || grid <= 0)
      NCCLCHECK((launchPing<PingTraits<kIn, kOut, kB, true>>(p, grid, stream)));
    if (p.pingpong) return ncclSuccess;
    // CTA pairs (GemmArgs::cluster = 2: no SwiGLU, no hooks; buildParams resolves it).
    if (p.cluster == 2) {
      if (p.wide || grid <= 0)
        NCCLCHECK((launchPipe<Traits<kIn, kOut, kB, GroupWidePipe, false, 2>>(p, grid, stream)));
      if (p.wide) return ncclSuccess;
      return launchPipe<Traits<kIn, kOut, kB, GroupPipe, false, 2>>(p, grid, stream);
    }
    if (p.wide || grid <= 0)
      NCCLCHECK((launchPipe<Traits<kIn, kOut, kB, GroupWidePipe>>(p, grid, stream)));
    if (p.wide) return ncclSuccess;
  }
  return launchPipe<Traits<kIn, kOut, kB, GroupPipe>>(p, grid, stream);
}

// Plain GEMMs of one type and layout; preload (grid 0) loads every plain kernel the call could
// resolve to.
template <DType kIn, DType kOut, BLayout kB>
ncclResult_t launchPlain(const GemmParams& p, int32_t grid, cudaStream_t stream) {
  // The deep ring lending its last stage to the epilogue (pipeline 5: plain unpaired GEMMs, B
  // [N,K], 16-bit D); preload (grid 0) loads it too.
  if constexpr (kOut != DType::kF32 && kB == BLayout::kNK) {
    if (p.lend || grid <= 0)
      NCCLCHECK((launchPipe<Traits<kIn, kOut, kB, LendPipe>>(p, grid, stream)));
    if (p.lend) return ncclSuccess;
    // The carried epilogue (pipeline 6, the same GEMMs), unpaired or as CTA pairs.
    if (p.carry && p.cluster == 2)
      return launchPipe<Traits<kIn, kOut, kB, CarryPipe, false, 2>>(p, grid, stream);
    if (grid <= 0 && p.cluster == 2)
      NCCLCHECK((launchPipe<Traits<kIn, kOut, kB, CarryPipe, false, 2>>(p, grid, stream)));
    if (p.carry || grid <= 0)
      NCCLCHECK((launchPipe<Traits<kIn, kOut, kB, CarryPipe>>(p, grid, stream)));
    if (p.carry) return ncclSuccess;
  }
  // The stream-K tail (GemmParams::sk, buildParams and launch resolve it: plain GEMMs, no
  // pairs or ping-pong); preload (grid 0) loads its variants too.
  if (p.sk.units > 0 || grid <= 0) {
    if constexpr (kOut != DType::kF32) {
      if (p.wide || grid <= 0)
        NCCLCHECK((launchPipe<Traits<kIn, kOut, kB, WidePipe, false, 1, true>>(p, grid, stream)));
    }
    if (grid <= 0 || !p.wide || kOut == DType::kF32)
      NCCLCHECK((launchPipe<Traits<kIn, kOut, kB, DeepPipe, false, 1, true>>(p, grid, stream)));
    if (grid > 0) return ncclSuccess;
  }
  if constexpr (kOut != DType::kF32) {
    // Ping-pong consumers (GemmArgs::pipeline 3: 16-bit D, checked by canImplement), unpaired
    // or as CTA pairs; preload (grid 0) loads them with the other pipelines (the pairs where
    // the call resolves to pairs).
    if (p.pingpong && p.cluster == 2)
      return launchPing<PingTraits<kIn, kOut, kB, false, 2>>(p, grid, stream);
    // Whole units (pipeline 4: unpaired, plain GEMMs; buildParams counts the units).
    if (p.pingpong == 2 || grid <= 0)
      NCCLCHECK((launchUnits<kIn, kOut, kB, false>(p, grid, stream)));
    if (p.pingpong == 2) return ncclSuccess;
    if (grid <= 0 && p.cluster == 2)
      NCCLCHECK((launchPing<PingTraits<kIn, kOut, kB, false, 2>>(p, grid, stream)));
    if (p.pingpong || grid <= 0)
      NCCLCHECK((launchPing<PingTraits<kIn, kOut, kB>>(p, grid, stream)));
    if (p.pingpong) return ncclSuccess;
    // CTA pairs (16-bit outputs only: buildParams resolves GemmParams::cluster).
    if (p.cluster == 2) {
      if (p.wide || grid <= 0)
        NCCLCHECK((launchPipe<Traits<kIn, kOut, kB, WidePipe, false, 2>>(p, grid, stream)));
      if (p.wide) return ncclSuccess;
      return launchPipe<Traits<kIn, kOut, kB, DeepPipe, false, 2>>(p, grid, stream);
    }
    // preload() (grid 0) loads both pipelines: either may run later.
    if (p.wide || grid <= 0)
      NCCLCHECK((launchPipe<Traits<kIn, kOut, kB, WidePipe>>(p, grid, stream)));
    if (p.wide) return ncclSuccess;
  }
  return launchPipe<Traits<kIn, kOut, kB, DeepPipe>>(p, grid, stream);
}

// One input type, output type, B layout and kind (plain or grouped) a translation unit
// (gemm_inst_*.cu): each instantiates every pipeline of its kind, and the largest units bound the
// build's wall time on a many-core machine.
#define MK_GEMM_INSTANTIATE(KIND, IN, OUT, B)                                               \
  template ncclResult_t KIND<DType::IN, DType::OUT, BLayout::B>(const GemmParams&, int32_t, \
                                                                cudaStream_t);

}  // namespace gemm
}  // namespace mk
