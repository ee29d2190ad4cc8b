// How fast L2 feeds shared memory when many SMs load at once, without any compute: the GEMM's
// k-step question after session 45's traces (call AK). There the cooperative kernel's consumers
// spent 36-42% of their main loops waiting for full stages while its producer spent 72-78% of
// its loads waiting for empty ones: every stage was in flight and still late. bench_wgmma_rate
// showed that the tensor cores alone run at 0.98-1.00 of peak in every form, even next to
// ~40 B/clk of bulk copies. What is left is the feed: a per-SM limit (the SM's ingress, or
// latency over too few bytes in flight) or a global one (L2's total bandwidth). So each CTA
// (one per SM of the first `ctas` SMs) copies `blocks` blocks of `block` bytes from an
// L2-resident buffer into a ring of `bufs` shared-memory buffers with bulk copies, one per
// buffer in flight, and the sweep varies bytes in flight per SM and how many SMs load:
//  - per-SM B/clk rising with bytes in flight: latency-bound (deeper rings would help);
//  - per-SM B/clk rising when fewer SMs load: a global limit (fewer L2 bytes per FLOP, e.g.
//    multicast in CTA pairs, would help);
//  - flat in both: the SM's own ingress.
// Call AL (H100): 30-34 B/clk per SM with all 132 SMs copying (7.7-8.3 TB/s) at any depth,
// 40-61 with 66 or 33: the limit is global.
// Each point also runs as CTA pairs that multicast (L2 reads halved, every SM receives the same
// bytes). A second sweep loads the engine's own stages (2-D boxes of 8192 x 8192 x 1024 operands
// through its tensor maps: A 128 rows with B 256 or 128 rows, unpaired or as its CTA pairs with
// half of B multicast), i.e. the GEMM's feed without its compute. Reported: median per-CTA bytes
// received per SM cycle, and the aggregate GB/s into shared memory over the launch (events).
//
//   bench_l2_feed [--mib 32] [--blocks 2048] [--out bench/results/l2_feed.json] [--commit SHA]
#include <cuda_bf16.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_args.h"
#include "bench_cuda.cuh"
#include "device/rt/ptx.cuh"
#include "device/rt/ptx_ext.cuh"

namespace {

constexpr int kSmemBytes = 200 * 1024;  // the ring; the GEMM's rings are 192-216 KB
constexpr int kMaxBufs = 16;

struct Args {
  const uint8_t* src;
  uint64_t srcBlocks;  // src holds this many blocks
  int32_t block;       // bytes per copy (16-byte multiple)
  int32_t bufs;        // copies in flight (bufs * block <= kSmemBytes)
  int32_t blocks;      // copies per CTA
  uint64_t* rec;       // [grid][3]: start and end clock64, bytes
};

// The GEMM's stages (stageKernel): A and B as the operands of an 8192 x 8192 x 1024 bf16 GEMM
// ([rows][K], 64-column boxes, 128-byte swizzle, the engine's tensor maps), one stage a fill:
// A's 128 rows and B's bRows rows of one k-step of one tile, the CTAs' tiles strided over the
// grid as on the static schedule but in plain column-major order (no grouped raster: the whole
// 32 MB fits in L2 either way); pairs walk positions of two row blocks of one column block.
constexpr int kGemmRows = 8192, kGemmK = 1024, kTileK = 64, kTileM = 128;

struct StageArgs {
  CUtensorMap tmA;  // box kCols x 128
  CUtensorMap tmB;  // box kCols x bRows (pairs: kCols x bRows / 2)
  int32_t bRows;    // B rows a stage: 256 the cooperative tile, 128 a ping-pong unit
  int32_t kCols;    // a stage's k-step depth: 64 (the engine's), or 32 (half-size stages)
  int32_t bufs, fills;
  int32_t hold;  // consumer's cycles a stage (the tensor work it stands for); 0: none
  uint64_t* rec;
};

// Two threads per CTA, as a GEMM's roles: lane 0 of warp 0 issues the copies, lane 0 of warp 1
// consumes the fills in order and hands each buffer back (`empty`), so the issuer waits only
// when it reuses a buffer. kMc: CTA pairs (clusters of 2): each CTA copies half of a fill's bytes
// and multicasts them into both CTAs' rings, so each SM still receives every byte while L2 reads
// fewer (the GEMM's CTA pairs, session 43); a buffer goes back once both CTAs' consumers saw its
// fill complete (one arrive from each), so no copy can complete into the previous phase of the
// peer's barrier. (Calls AL and AM consumed on the issuing thread: the cluster arrives then cost
// ~880 cycles a copy whatever its size, and the pairs' rate was that.)
constexpr int kThreads = 64;

template <bool kMc>
struct Ring {
  uint64_t* full;
  uint64_t* empty;
  int bufs;
  uint32_t emptyPh = 0;  // bit b: the parity buffer b waits for next (issuer)

  // Thread 0, before the CTA's (and the pair's) barrier.
  __device__ void init() const {
    for (int b = 0; b < bufs; ++b) {
      mk::ptx::mbarInit(&full[b], 1);
      mk::ptx::mbarInit(&empty[b], kMc ? 2 : 1);
    }
    mk::ptx::fenceMbarInit();
  }
  // Issuer: buffer of fill i, once its previous fill was consumed (by both CTAs of a pair).
  __device__ int acquire(int i) {
    const int b = i % bufs;
    if (i >= bufs) {
      mk::ptx::mbarWait(&empty[b], (emptyPh >> b) & 1);
      emptyPh ^= 1u << b;
    }
    return b;
  }
  __device__ void release(int b) const {
    if constexpr (kMc) {
      mk::ptx::mbarArriveCluster(&empty[b], 0);
      mk::ptx::mbarArriveCluster(&empty[b], 1);
    } else {
      mk::ptx::mbarArrive(&empty[b]);
    }
  }
  // Consumer: every fill in order; shared memory then outlives the copies. hold 0: each
  // buffer goes back as soon as its fill landed. hold > 0: the GEMM consumer's discipline with
  // `hold` cycles of tensor work a stage: stage j's work starts once it landed and stage j - 1's
  // work is done, and only then is stage j - 1 handed back (the consumer's wgmma wait<1> after
  // issuing stage j), so two stages are out of the ring while it computes.
  __device__ void consumeAll(int fills, int hold = 0) const {
    uint32_t fullPh = 0;
    long long workEnd = 0;
    for (int j = 0; j < fills; ++j) {
      const int b = j % bufs;
      mk::ptx::mbarWait(&full[b], (fullPh >> b) & 1);
      fullPh ^= 1u << b;
      if (hold == 0) {
        release(b);
        continue;
      }
      while (clock64() < workEnd) {
      }
      if (j > 0) release((j - 1) % bufs);
      workEnd = clock64() + hold;
    }
    if (hold > 0 && fills > 0) {
      while (clock64() < workEnd) {
      }
      release((fills - 1) % bufs);
    }
  }
};

// The anatomy both kernels share: barriers, the pair's start barrier, the issuer `issue(ring)`
// on thread 0, the consumer on thread 32 with the record (start, end, bytes), the pair's end
// barrier (neither CTA leaves while the other's copies or arrives may still reach it).
template <bool kMc, class Issue>
__device__ __forceinline__ void runRing(int bufs, int fills, uint64_t fillBytes, uint64_t* rec,
                                        Issue issue, int hold = 0) {
  __shared__ uint64_t full[kMaxBufs], empty[kMaxBufs];
  __shared__ uint64_t t0;
  Ring<kMc> ring{full, empty, bufs};
  if (threadIdx.x == 0) {
    ring.init();
    t0 = clock64();
  }
  __syncthreads();
  if constexpr (kMc) mk::ptx::clusterSync();
  if (threadIdx.x == 0) {
    issue(ring);
  } else if (threadIdx.x == 32) {
    ring.consumeAll(fills, hold);
    uint64_t* r = rec + (size_t)blockIdx.x * 3;
    r[0] = t0;
    r[1] = clock64();
    r[2] = (uint64_t)fills * fillBytes;
  }
  if constexpr (kMc) mk::ptx::clusterSync();
}

// 1-D bulk copies of `block` bytes from a flat buffer (pairs: each CTA half of each block).
template <bool kMc>
__global__ void __launch_bounds__(kThreads, 1) feedKernel(const Args a) {
  extern __shared__ __align__(128) uint8_t buf[];
  runRing<kMc>(a.bufs, a.blocks, a.block, a.rec, [&](Ring<kMc>& ring) {
    const uint32_t rank = kMc ? mk::ptx::clusterCtaRank() : 0;
    const uint32_t part = kMc ? a.block / 2 : a.block;
    const uint64_t group = kMc ? blockIdx.x / 2 : blockIdx.x;  // a pair copies the same blocks
    for (int i = 0; i < a.blocks; ++i) {
      const int b = ring.acquire(i);
      // Blocks spread over the buffer as the GEMM's CTAs spread over the operands.
      const uint64_t blk = (group * 7919 + (uint64_t)i * 131) % a.srcBlocks;
      uint8_t* dst = buf + (size_t)b * a.block + rank * part;
      const uint8_t* src = a.src + blk * a.block + rank * part;
      mk::ptx::mbarArriveExpectTx(&ring.full[b], (uint32_t)a.block);
      if constexpr (kMc) {
        mk::ptx::bulkLoad1dMulticast(dst, src, part, &ring.full[b], 0x3);
      } else {
        mk::ptx::bulkLoad1d(dst, src, part, &ring.full[b]);
      }
    }
  });
}

// The engine's stage loads: A's box and B's box (pairs: own A, half of B's rows multicast).
template <bool kMc>
__global__ void __launch_bounds__(kThreads, 1) stageKernel(const __grid_constant__ StageArgs a) {
  extern __shared__ uint8_t raw[];
  uint8_t* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  const uint32_t stageBytes = (kTileM + a.bRows) * a.kCols * 2;
  runRing<kMc>(
      a.bufs, a.fills, stageBytes, a.rec,
      [&](Ring<kMc>& ring) {
        const uint32_t rank = kMc ? mk::ptx::clusterCtaRank() : 0;
        const int kTiles = kGemmK / a.kCols;
        const int tilesN = kGemmRows / a.bRows;
        const int posM = (kGemmRows / kTileM) / (kMc ? 2 : 1);  // positions along M
        const int walkers = kMc ? gridDim.x / 2 : gridDim.x;
        const int me = kMc ? blockIdx.x / 2 : blockIdx.x;
        const int half = a.bRows / 2;
        for (int i = 0; i < a.fills; ++i) {
          const int s = ring.acquire(i);
          const int k = (i % kTiles) * a.kCols;
          const int t = me + (i / kTiles) * walkers;
          const int m0 = (kMc ? 2 * (t % posM) + (int)rank : t % posM) * kTileM;
          const int n0 = ((t / posM) % tilesN) * a.bRows;
          uint8_t* st = base + (size_t)s * stageBytes;
          uint8_t* sb = st + kTileM * a.kCols * 2;
          mk::ptx::mbarArriveExpectTx(&ring.full[s], stageBytes);
          mk::ptx::tmaLoad2d(st, &a.tmA, &ring.full[s], k, m0);
          if constexpr (kMc) {
            mk::ptx::tmaLoad2dMulticast(sb + rank * half * a.kCols * 2, &a.tmB, &ring.full[s], k,
                                        n0 + (int)rank * half, 0x3);
          } else {
            mk::ptx::tmaLoad2d(sb, &a.tmB, &ring.full[s], k, n0);
          }
        }
      },
      a.hold);
}

struct Result {
  const char* kind;  // "bulk" (1-D copies of `block` bytes) or "stage" (the GEMM's boxes)
  int block, bufs, ctas, mc;
  double bytesPerClk, aggGBs;
};

// One configuration: a warm-up launch, then the measured one; `launch(cfg)` starts the kernel
// `fn` (its pairs' residency is checked: pairs past it would run as a second wave, which the
// per-CTA rates do not see but the aggregate does).
template <class Launch>
Result measure(const char* kind, int block, int bufs, int fills, int ctas, bool mc, uint64_t* rec,
               cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, const void* fn, Launch launch) {
  std::vector<uint64_t> h((size_t)ctas * 3);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(ctas);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = mc ? 2 : 1;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  if (mc) {
    int resident = 0;
    BENCH_CK(cudaOccupancyMaxActiveClusters(&resident, fn, &cfg));
    if (2 * resident < ctas)
      printf("  (%d of %d pairs resident at once: the aggregate GB/s includes a second wave)\n",
             resident, ctas / 2);
  }
  float ms = 0;
  for (int rep = 0; rep < 2; ++rep) {
    BENCH_CK(cudaEventRecord(e0, stream));
    BENCH_CK(launch(cfg));
    BENCH_CK(cudaEventRecord(e1, stream));
    BENCH_CK(cudaStreamSynchronize(stream));
  }
  BENCH_CK(cudaEventElapsedTime(&ms, e0, e1));
  BENCH_CK(cudaMemcpy(h.data(), rec, h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  std::vector<double> rate;
  for (int c = 0; c < ctas; ++c)
    if (h[c * 3 + 1] > h[c * 3]) rate.push_back((double)h[c * 3 + 2] / (h[c * 3 + 1] - h[c * 3]));
  std::sort(rate.begin(), rate.end());
  Result r;
  r.kind = kind;
  r.block = block;
  r.bufs = bufs;
  r.ctas = ctas;
  r.mc = mc ? 1 : 0;
  r.bytesPerClk = rate.empty() ? 0 : rate[rate.size() / 2];
  r.aggGBs = (double)ctas * fills * block / (ms * 1e-3) / 1e9;
  return r;
}

// A [rows][K] bf16 operand's tensor map as the engine encodes it (64-column boxes of `boxRows`,
// 128-byte swizzle, 256-byte L2 promotion); 32-column boxes (half-depth stages) 64-byte swizzle.
void encodeOperand(CUtensorMap* map, const void* base, uint32_t boxRows, uint32_t boxCols = 64) {
  using Encode =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Encode encode = nullptr;
  if (encode == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    BENCH_CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                              cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || fn == nullptr) {
      fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
      exit(1);
    }
    encode = reinterpret_cast<Encode>(fn);
  }
  cuuint64_t dims[2] = {kGemmK, kGemmRows};
  cuuint64_t strides[1] = {kGemmK * 2};
  cuuint32_t box[2] = {boxCols, boxRows};
  cuuint32_t estr[2] = {1, 1};
  if (encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
             estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
             boxCols == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    fprintf(stderr, "cuTensorMapEncodeTiled failed (box rows %u)\n", boxRows);
    exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int mib = 32, blocks = 2048;
  std::string out, commit = "unknown";
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--mib" && i + 1 < argc) {
      mib = atoi(argv[++i]);
    } else if (s == "--blocks" && i + 1 < argc) {
      blocks = atoi(argv[++i]);
    } else if (benchargs::outOrCommit(argc, argv, &i, &out, &commit)) {
      continue;  // --out or --commit, taken
    } else {
      fprintf(stderr, "usage: %s [--mib N] [--blocks N] [--out F] [--commit C]\n", argv[0]);
      return 2;
    }
  }
  if (mib < 1 || blocks < kMaxBufs) {
    fprintf(stderr, "--mib must be >= 1 and --blocks >= %d\n", kMaxBufs);
    return 2;
  }
  cudaDeviceProp prop;
  BENCH_CK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major < 9) {
    printf("skipped: bulk copies need sm_90 (this device is sm_%d%d)\n", prop.major, prop.minor);
    return 0;
  }
  const int sms = prop.multiProcessorCount;
  cudaStream_t stream;
  BENCH_CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  BENCH_CK(cudaEventCreate(&e0));
  BENCH_CK(cudaEventCreate(&e1));
  BENCH_CK(cudaFuncSetAttribute(feedKernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                kSmemBytes));
  BENCH_CK(cudaFuncSetAttribute(feedKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                kSmemBytes));
  BENCH_CK(cudaFuncSetAttribute(stageKernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                kSmemBytes));
  BENCH_CK(cudaFuncSetAttribute(stageKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                kSmemBytes));
  const uint64_t srcBytes = (uint64_t)mib << 20;
  uint8_t* src = nullptr;
  uint64_t* rec = nullptr;
  BENCH_CK(cudaMalloc(&src, srcBytes));
  BENCH_CK(cudaMalloc(&rec, (size_t)sms * 3 * sizeof(uint64_t)));
  benchcuda::fillKernel<<<1024, 256, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(src),
                                                  srcBytes / 2, 9);
  std::vector<Result> res;
  printf("L2 -> shared memory feed, %d MiB source, %d bulk copies per CTA, one CTA per SM\n", mib,
         blocks);
  // 48 KB is the cooperative tile's stage; 16 and 32 KB its A and B parts.
  for (int block : {16384, 32768, 49152})
    for (int bufs : {1, 2, 3, 4, 6, 8, 12}) {
      if (bufs * block > kSmemBytes) continue;
      for (int mc : {0, 1}) {
        if (mc && bufs < 2) continue;  // one buffer: the pair's handshake would be all there is
        for (int grid : {sms, sms / 2, sms / 4}) {
          const int ctas = mc ? grid & ~1 : grid;  // pairs: an even grid
          const Args a{src, srcBytes / block, block, bufs, blocks, rec};
          const void* fn = mc ? (const void*)feedKernel<true> : (const void*)feedKernel<false>;
          const Result r = measure("bulk", block, bufs, blocks, ctas, mc != 0, rec, stream, e0, e1,
                                   fn, [&](const cudaLaunchConfig_t& cfg) {
                                     return mc ? cudaLaunchKernelEx(&cfg, feedKernel<true>, a)
                                               : cudaLaunchKernelEx(&cfg, feedKernel<false>, a);
                                   });
          res.push_back(r);
          printf(
              "  block %2d KB x %2d in flight (%3d KB), %3d SMs%s: %6.1f B/clk per SM, %7.0f "
              "GB/s into shared memory\n",
              block / 1024, bufs, bufs * block / 1024, ctas, mc ? ", pairs multicast" : "",
              r.bytesPerClk, r.aggGBs);
          fflush(stdout);
        }
      }
    }
  // The engine's stages: A 128 rows + B 256 rows (the cooperative tile, 48 KB) or + B 128 rows
  // (a ping-pong unit, 32 KB), unpaired or as pairs (own A, half of B multicast: 32 / 24 KB of
  // L2 reads a CTA and stage), with 2..4 stages in flight.
  uint8_t *opA = nullptr, *opB = nullptr;
  const size_t opBytes = (size_t)kGemmRows * kGemmK * 2;
  BENCH_CK(cudaMalloc(&opA, opBytes));
  BENCH_CK(cudaMalloc(&opB, opBytes));
  benchcuda::fillKernel<<<1024, 256, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(opA),
                                                  opBytes / 2, 10);
  benchcuda::fillKernel<<<1024, 256, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(opB),
                                                  opBytes / 2, 11);
  printf("The GEMM's stages (8192 x 8192 x 1024 operands, 128-byte-swizzled boxes), %d per CTA\n",
         blocks);
  // stageKernel (unpaired or pairs) with `sa`, measured and kept.
  auto measureStages = [&](const char* kind, const StageArgs& sa, int stageBytes, int ctas,
                           bool mc) {
    const void* fn = mc ? (const void*)stageKernel<true> : (const void*)stageKernel<false>;
    const Result r = measure(kind, stageBytes, sa.bufs, sa.fills, ctas, mc, rec, stream, e0, e1, fn,
                             [&](const cudaLaunchConfig_t& cfg) {
                               return mc ? cudaLaunchKernelEx(&cfg, stageKernel<true>, sa)
                                         : cudaLaunchKernelEx(&cfg, stageKernel<false>, sa);
                             });
    res.push_back(r);
    return r;
  };
  for (int bRows : {256, 128})
    for (int mc : {0, 1}) {
      StageArgs sa{};
      encodeOperand(&sa.tmA, opA, kTileM);
      encodeOperand(&sa.tmB, opB, mc ? bRows / 2 : bRows);
      sa.bRows = bRows;
      sa.kCols = kTileK;
      sa.hold = 0;
      sa.fills = blocks;
      sa.rec = rec;
      const int stageBytes = (kTileM + bRows) * kTileK * 2;
      for (int bufs : {2, 3, 4}) {
        if (bufs * stageBytes + 1024 > kSmemBytes) continue;
        sa.bufs = bufs;
        for (int grid : {sms, sms / 2, sms / 4}) {
          const int ctas = mc ? grid & ~1 : grid;
          const Result r = measureStages("stage", sa, stageBytes, ctas, mc != 0);
          printf(
              "  stage A128+B%d (%2d KB) x %d in flight, %3d SMs%s: %6.1f B/clk per SM, %7.0f GB/s "
              "into shared memory\n",
              bRows, stageBytes / 1024, bufs, ctas, mc ? ", pairs (B multicast)" : "",
              r.bytesPerClk, r.aggGBs);
          fflush(stdout);
        }
      }
    }
  // The GEMM's ring discipline (Ring::consumeAll with hold): the cooperative tile's stages
  // (A128+B256), each held for the tensor work of its k-step at a fraction of peak (1024 cycles
  // a 64-deep k-step at peak), two out of the ring while one computes; the engine's 4 stages of
  // 64-deep k-steps against half-depth stages (24 KB, 32-deep), which keep more bytes in flight
  // in the same shared memory. What arrives per SM cycle, all SMs.
  printf("The GEMM's ring: stages held for their k-step's tensor work, two out of the ring\n");
  const int ringCfg[][2] = {{64, 4}, {64, 3}, {32, 8}, {32, 6}};  // k-step depth, stages
  for (const auto& rc : ringCfg)
    for (int hold64 : {1024, 1150})
      for (int mc : {0, 1}) {
        StageArgs sa{};
        encodeOperand(&sa.tmA, opA, kTileM, rc[0]);
        encodeOperand(&sa.tmB, opB, mc ? 128 : 256, rc[0]);
        sa.bRows = 256;
        sa.kCols = rc[0];
        sa.bufs = rc[1];
        sa.hold = hold64 * rc[0] / 64;
        sa.fills = blocks * (64 / rc[0]);
        sa.rec = rec;
        const int stageBytes = (kTileM + 256) * rc[0] * 2;
        if (rc[1] * stageBytes + 1024 > kSmemBytes) continue;
        const int ctas = mc ? sms & ~1 : sms;
        const Result r = measureStages("ring", sa, stageBytes, ctas, mc != 0);
        printf(
            "  ring %d-deep k-steps (%2d KB stages) x %d, hold %4d cycles a 64-deep k-step, %3d "
            "SMs%s: %6.1f B/clk per SM (a 64-deep k-step every %5.0f cycles)\n",
            rc[0], stageBytes / 1024, rc[1], hold64, ctas, mc ? ", pairs (B multicast)" : "",
            r.bytesPerClk, r.bytesPerClk > 0 ? 49152.0 / r.bytesPerClk : 0.0);
        fflush(stdout);
      }
  cudaFree(opA);
  cudaFree(opB);
  if (!out.empty()) {
    FILE* f = benchargs::openJson(out, "l2_feed", argc, argv, commit, prop.name, sms);
    if (f == nullptr) return 1;
    fprintf(f, "  \"source_mib\": %d,\n  \"copies_per_cta\": %d,\n  \"results\": [\n", mib, blocks);
    for (size_t i = 0; i < res.size(); ++i)
      fprintf(f,
              "    {\"kind\": \"%s\", \"block_bytes\": %d, \"in_flight\": %d, \"ctas\": %d, "
              "\"multicast_pairs\": %d, "
              "\"bytes_per_clk_per_sm\": %.2f, \"aggregate_gb_s\": %.1f}%s\n",
              res[i].kind, res[i].block, res[i].bufs, res[i].ctas, res[i].mc, res[i].bytesPerClk,
              res[i].aggGBs, i + 1 < res.size() ? "," : "");
    fprintf(f, "  ]\n}\n");
    fclose(f);
  }
  cudaFree(src);
  cudaFree(rec);
  return 0;
}
