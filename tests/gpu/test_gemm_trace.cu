// The GEMM engine's timeline stamps (GemmArgs::trace, fused/gemm/trace.h) on the GPU: a traced
// launch computes the same D (every element against the fp64 reference, outputs poisoned),
// every role stamps a header, and each walked tile up to traceTiles gets one complete record
// whose stamps (SM cycles) are ordered within the record and from one record to the next,
// between the header's start and end clocks; nothing is written past the buffer. Both
// pipelines, the static and the dynamic schedule, a cap below and at the tiles a CTA walks.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fused/gemm/trace.h"
#include "test_gemm_util.cuh"

using namespace gemmtest;
using mk::gemm::GemmArgs;
using mk::gemm::kTraceRows;
using mk::gemm::kTraceWords;
using mk::gemm::traceRow;
using mk::gemm::traceWords;

TEST(GemmTrace, StampsEveryWalkedTile) {
  GEMMTEST_REQUIRE_SM90();
  const uint64_t seed = mktest::testSeed();
  constexpr uint64_t kCanary = 0x5a5a5a5a5a5a5a5aull;
  constexpr int kCanaryWords = 64;
  int32_t* claim = nullptr;
  GT_CUDA(cudaMalloc(&claim, sizeof(int32_t)));
  int i = 0;
  for (int pipeline : {1, 2})
    for (bool dynamic : {false, true})
      for (bool capped : {false, true}) {
        ++i;
        // 8 x 5 tiles (tails in M, N and K) on 5 CTAs: 8 tiles a CTA on the static schedule.
        Problem p(1000, 1100, 576, BLayout::kNK, DType::kBF16, DType::kBF16);
        SCOPED_TRACE(p.name() + " pipeline " + std::to_string(pipeline) +
                     (dynamic ? " dynamic" : " static") + (capped ? " capped" : ""));
        p.alloc();
        p.randomize(seed + 31 * i);
        p.reference();
        p.poison();
        GemmArgs g = p.args();
        g.pipeline = pipeline;
        g.smBudget = 5;
        g.cluster = 1;  // unpaired whatever MKERNEL_GEMM_CLUSTER says: a grid of 5
        const int grid = 5, tiles = mk::gemm::tilesM(g) * mk::gemm::tilesN(g);
        ASSERT_EQ(tiles, 40);
        // Dynamic: a CTA may claim any number of tiles, so an uncapped trace holds them all.
        const int cap = capped ? 6 : (dynamic ? tiles : tiles / grid);
        const size_t words = traceWords(grid, cap);
        std::vector<uint64_t> host(words + kCanaryWords, kCanary);
        uint64_t* dev = nullptr;
        GT_CUDA(cudaMalloc(&dev, host.size() * sizeof(uint64_t)));
        GT_CUDA(
            cudaMemcpy(dev, host.data(), host.size() * sizeof(uint64_t), cudaMemcpyHostToDevice));
        GT_CUDA(cudaMemset(dev, 0, words * sizeof(uint64_t)));
        g.trace = dev;
        g.traceTiles = cap;
        g.traceCtas = grid;
        if (dynamic) {
          GT_CUDA(cudaMemset(claim, 0, sizeof(int32_t)));
          g.tileClaim = claim;
        }
        ASSERT_EQ(mk::gemm::launch(g, 0), ncclSuccess);
        GT_CUDA(cudaDeviceSynchronize());
        EXPECT_EQ(p.check(), "");
        GT_CUDA(
            cudaMemcpy(host.data(), dev, host.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
        cudaFree(dev);
        for (int w = 0; w < kCanaryWords; ++w)
          EXPECT_EQ(host[words + w], kCanary) << "written past the trace buffer at word " << w;
        host.resize(words);
        int consumerRecords[2] = {0, 0}, producerRecords = 0;
        for (int c = 0; c < grid; ++c) {
          for (int r = 0; r < kTraceRows; ++r) {
            const uint64_t* h = host.data() + traceRow(c, r, cap);
            ASSERT_NE(h[0], 0u) << "CTA " << c << " row " << r << ": no start stamp";
            EXPECT_GE(h[2], h[0]) << "CTA " << c << " row " << r;
            EXPECT_GT(h[3], h[1]) << "CTA " << c << " row " << r << ": clock64 went back";
            uint64_t prevEnd = h[1];  // records are clock64 values, as the header's h[1], h[3]
            int n = 0;
            for (; n < cap; ++n) {
              const uint64_t* q = h + (size_t)(1 + n) * kTraceWords;
              if (q[0] == 0) break;
              if (r == 0) {
                EXPECT_GE(q[0], prevEnd) << "CTA " << c << " producer tile " << n;
                EXPECT_GE(q[1], q[0]) << "CTA " << c << " producer tile " << n;
                EXPECT_EQ(q[2] | q[3], 0u) << "CTA " << c << " producer tile " << n;
                prevEnd = q[1];
              } else {
                EXPECT_GE(q[0], prevEnd) << "CTA " << c << " row " << r << " tile " << n;
                for (int k = 1; k < kTraceWords; ++k)
                  EXPECT_GE(q[k], q[k - 1]) << "CTA " << c << " row " << r << " tile " << n;
                prevEnd = q[3];
              }
            }
            for (int m = n; m < cap; ++m) {  // after the first empty record, nothing
              const uint64_t* q = h + (size_t)(1 + m) * kTraceWords;
              EXPECT_EQ(q[0] | q[1] | q[2] | q[3], 0u) << "CTA " << c << " row " << r;
            }
            EXPECT_LE(prevEnd, h[3]) << "CTA " << c << " row " << r << ": a stamp after the end";
            if (!dynamic) EXPECT_EQ(n, std::min(cap, tiles / grid)) << "CTA " << c << " row " << r;
            if (r == 0) {
              producerRecords += n;
            } else {
              consumerRecords[r - 1] += n;
            }
          }
        }
        // Uncapped, every tile was recorded once by the producer and by each consumer
        // warpgroup; capped, each CTA's first `cap` tiles at most.
        const int expect = capped ? -1 : tiles;
        if (expect > 0) {
          EXPECT_EQ(producerRecords, expect);
          EXPECT_EQ(consumerRecords[0], expect);
          EXPECT_EQ(consumerRecords[1], expect);
        } else {
          EXPECT_LE(consumerRecords[0], grid * cap);
          EXPECT_EQ(consumerRecords[0], consumerRecords[1]);
        }
        const mk::gemm::TraceSummary s = mk::gemm::summarizeTrace(host, grid, cap);
        EXPECT_EQ(s.records, consumerRecords[0] + consumerRecords[1]);
        EXPECT_GT(s.clockGHz, 0.3);
        EXPECT_LT(s.clockGHz, 4.0);
        EXPECT_GT(s.mainUs, 0.0);
      }
  cudaFree(claim);
}
