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
// bytes). Reported: median per-CTA bytes received per SM cycle, and the aggregate GB/s into shared
// memory over the launch (events).
//
//   bench_l2_feed [--mib 32] [--blocks 2048] [--out bench/results/l2_feed.json] [--commit SHA]
#include <cuda_bf16.h>
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

// Two threads per CTA, as a GEMM's roles: lane 0 of warp 0 issues the copies, lane 0 of warp 1
// consumes the fills in order and hands each buffer back (`empty`), so the issuer waits only
// when it reuses a buffer. kMc: CTA pairs (clusters of 2) where each CTA copies half of every
// block and multicasts it into both CTAs' rings, so each SM still receives every byte while L2
// reads half of them (the GEMM's CTA pairs, session 43); a buffer goes back once both CTAs'
// consumers saw its fill complete (one arrive from each), so no copy can complete into the
// previous phase of the peer's barrier. (Calls AL and AM consumed on the issuing thread: the
// cluster arrives then cost ~880 cycles a copy whatever its size, the pairs' rate was that.)
constexpr int kThreads = 64;

template <bool kMc>
__global__ void __launch_bounds__(kThreads, 1) feedKernel(const Args a) {
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ uint64_t full[kMaxBufs], empty[kMaxBufs];
  __shared__ uint64_t t0;
  if (threadIdx.x == 0) {
    for (int b = 0; b < a.bufs; ++b) {
      mk::ptx::mbarInit(&full[b], 1);
      mk::ptx::mbarInit(&empty[b], kMc ? 2 : 1);
    }
    mk::ptx::fenceMbarInit();
    t0 = clock64();
  }
  __syncthreads();
  if constexpr (kMc) mk::ptx::clusterSync();  // the peer's barriers exist before any copy
  if (threadIdx.x == 0) {
    const uint32_t rank = kMc ? mk::ptx::clusterCtaRank() : 0;
    const uint32_t part = kMc ? a.block / 2 : a.block;
    const uint64_t group = kMc ? blockIdx.x / 2 : blockIdx.x;  // a pair copies the same blocks
    uint32_t emptyPh = 0;                                      // bit b: parity buffer b waits for
    for (int i = 0; i < a.blocks; ++i) {
      const int b = i % a.bufs;
      if (i >= a.bufs) {
        mk::ptx::mbarWait(&empty[b], (emptyPh >> b) & 1);  // fill i - bufs consumed (by both)
        emptyPh ^= 1u << b;
      }
      // Blocks spread over the buffer as the GEMM's CTAs spread over the operands.
      const uint64_t blk = (group * 7919 + (uint64_t)i * 131) % a.srcBlocks;
      uint8_t* dst = ring + (size_t)b * a.block + rank * part;
      const uint8_t* src = a.src + blk * a.block + rank * part;
      mk::ptx::mbarArriveExpectTx(&full[b], (uint32_t)a.block);
      if constexpr (kMc) {
        mk::ptx::bulkLoad1dMulticast(dst, src, part, &full[b], 0x3);
      } else {
        mk::ptx::bulkLoad1d(dst, src, part, &full[b]);
      }
    }
  } else if (threadIdx.x == 32) {
    // Every fill consumed: shared memory outlives the copies.
    uint32_t fullPh = 0;
    for (int j = 0; j < a.blocks; ++j) {
      const int b = j % a.bufs;
      mk::ptx::mbarWait(&full[b], (fullPh >> b) & 1);
      fullPh ^= 1u << b;
      if constexpr (kMc) {
        mk::ptx::mbarArriveCluster(&empty[b], 0);
        mk::ptx::mbarArriveCluster(&empty[b], 1);
      } else {
        mk::ptx::mbarArrive(&empty[b]);
      }
    }
    const uint64_t t1 = clock64();
    uint64_t* r = a.rec + (size_t)blockIdx.x * 3;
    r[0] = t0;
    r[1] = t1;
    r[2] = (uint64_t)a.blocks * a.block;
  }
  // Neither CTA of a pair leaves while the other's copies or arrives may still reach it.
  if constexpr (kMc) mk::ptx::clusterSync();
}

struct Result {
  int block, bufs, ctas, mc;
  double bytesPerClk, aggGBs;
};

Result runOne(Args a, int ctas, bool mc, cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1) {
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
  float ms = 0;
  for (int rep = 0; rep < 2; ++rep) {  // a warm-up launch, then the measured one
    BENCH_CK(cudaEventRecord(e0, stream));
    BENCH_CK(mc ? cudaLaunchKernelEx(&cfg, feedKernel<true>, a)
                : cudaLaunchKernelEx(&cfg, feedKernel<false>, a));
    BENCH_CK(cudaEventRecord(e1, stream));
    BENCH_CK(cudaStreamSynchronize(stream));
  }
  BENCH_CK(cudaEventElapsedTime(&ms, e0, e1));
  BENCH_CK(cudaMemcpy(h.data(), a.rec, h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  std::vector<double> rate;
  for (int c = 0; c < ctas; ++c)
    if (h[c * 3 + 1] > h[c * 3]) rate.push_back((double)h[c * 3 + 2] / (h[c * 3 + 1] - h[c * 3]));
  std::sort(rate.begin(), rate.end());
  Result r;
  r.block = a.block;
  r.bufs = a.bufs;
  r.ctas = ctas;
  r.mc = mc ? 1 : 0;
  r.bytesPerClk = rate.empty() ? 0 : rate[rate.size() / 2];
  r.aggGBs = (double)ctas * a.blocks * a.block / (ms * 1e-3) / 1e9;
  return r;
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
    } else if (s == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (s == "--commit" && i + 1 < argc) {
      commit = argv[++i];
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
          Args a{src, srcBytes / block, block, bufs, blocks, rec};
          const Result r = runOne(a, ctas, mc != 0, stream, e0, e1);
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
  if (!out.empty()) {
    FILE* f = benchargs::openJson(out, "l2_feed", argc, argv, commit, prop.name, sms);
    if (f == nullptr) return 1;
    fprintf(f, "  \"source_mib\": %d,\n  \"copies_per_cta\": %d,\n  \"results\": [\n", mib, blocks);
    for (size_t i = 0; i < res.size(); ++i)
      fprintf(f,
              "    {\"block_bytes\": %d, \"in_flight\": %d, \"ctas\": %d, \"multicast_pairs\": %d, "
              "\"bytes_per_clk_per_sm\": %.2f, \"aggregate_gb_s\": %.1f}%s\n",
              res[i].block, res[i].bufs, res[i].ctas, res[i].mc, res[i].bytesPerClk, res[i].aggGBs,
              i + 1 < res.size() ? "," : "");
    fprintf(f, "  ]\n}\n");
    fclose(f);
  }
  cudaFree(src);
  cudaFree(rec);
  return 0;
}
