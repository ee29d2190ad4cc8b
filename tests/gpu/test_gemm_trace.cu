// The GEMM engine's timeline stamps (GemmArgs::trace, fused/gemm/trace.h) on the GPU: a traced
// launch computes the same D (every element against the fp64 reference, outputs poisoned),
// every role stamps a header, and each walked tile up to traceTiles gets one complete record
// whose stamps (SM cycles) are ordered within the record and from one record to the next,
// between the header's start and end clocks; nothing is written past the buffer. The deep and
// wide pipelines (static and dynamic schedule; the deep one also as CTA pairs, static), and the
// ping-pong consumers (static; records are units, and WG1 has none for the halves wholly past
// N; unpaired and as CTA pairs; the whole 192-column units of pipeline 4, each warpgroup
// every other unit of its CTA, D through its small staging), a cap below and at the
// tiles a CTA walks, D with the direct epilogue (odd row pitch) and through the TMA staging
// (whose stamps inside the epilogue are then ordered between main loop and stores), the TMA
// stores issued by the store threads (GemmArgs::storeWarps 1, the default at this K) and by the
// consumers (0).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fused/gemm/primitives.cuh"  // GemmParams, buildParams
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
  for (int pipeline : {1, 2, 3, 4})
    for (bool dynamic : {false, true})
      for (bool pairs : {false, true})
        for (bool capped : {false, true})
          for (int n : {1100, 1088}) {
            if (pipeline >= 3 && dynamic) continue;  // the ping-pong consumers walk the static list
            // Traced pairs: the ping-pong ones and the cooperative deep ring (static schedule).
            if (pairs && pipeline != 3 && (pipeline != 1 || dynamic)) continue;
            if (pipeline == 4 && n != 1088) continue;  // 192-column units: 16-byte rows only
            ++i;
            // 8 x 5 tiles (tails in M, N and K) on 5 CTAs: 8 tiles a CTA on the static schedule.
            // N = 1100: 2200-byte rows, no tensor map for D (direct stores); 1088: TMA stores.
            // Either way the last column tile's second half is past N (ping-pong: WG1 skips it).
            // Pipeline 4: 8 x 6 units of 192 columns on 4 CTAs, 12 a CTA and 6 a consumer
            // warpgroup; the last unit of a row holds 128 columns.
            const bool tma = n == 1088;
            const int storeWarps = tma && capped ? 0 : 1;
            Problem p(1000, n, 576, BLayout::kNK, DType::kBF16, DType::kBF16);
            SCOPED_TRACE(p.name() + " pipeline " + std::to_string(pipeline) +
                         (dynamic ? " dynamic" : " static") + (pairs ? " pairs" : "") +
                         (capped ? " capped" : "") + " storeWarps " + std::to_string(storeWarps));
            p.alloc();
            p.randomize(seed + 31 * i);
            p.reference();
            p.poison();
            GemmArgs g = p.args();
            g.pipeline = pipeline;
            const bool wide = pipeline == 4;
            g.smBudget = wide ? 4 : 5;
            // Unpaired whatever MKERNEL_GEMM_CLUSTER says: a grid of 5; pairs: 2 pairs (4 CTAs),
            // each CTA walking 10 tiles of its own row blocks (8 row blocks: no CTA past M).
            g.cluster = pairs ? 2 : 1;
            const int grid = pairs || wide ? 4 : 5;
            int tiles = 0;
            {
              mk::gemm::GemmParams gp;
              int32_t built = 0;
              ASSERT_EQ(mk::gemm::buildParams(g, &gp, &built), ncclSuccess);
              ASSERT_EQ(built, grid);
              tiles = gp.tilesM * gp.tilesN;
            }
            ASSERT_EQ(tiles, wide ? 48 : 40);
            // Dynamic: a CTA may claim any number of tiles, so an uncapped trace holds them all.
            const int cap = capped ? 6 : (dynamic ? tiles : tiles / grid);
            const size_t words = traceWords(grid, cap);
            std::vector<uint64_t> host(words + kCanaryWords, kCanary);
            uint64_t* dev = nullptr;
            GT_CUDA(cudaMalloc(&dev, host.size() * sizeof(uint64_t)));
            GT_CUDA(cudaMemcpy(dev, host.data(), host.size() * sizeof(uint64_t),
                               cudaMemcpyHostToDevice));
            GT_CUDA(cudaMemset(dev, 0, words * sizeof(uint64_t)));
            g.trace = dev;
            g.traceTiles = cap;
            g.traceCtas = grid;
            g.storeWarps = storeWarps;
            if (dynamic) {
              GT_CUDA(cudaMemset(claim, 0, sizeof(int32_t)));
              g.tileClaim = claim;
            }
            ASSERT_EQ(mk::gemm::launch(g, 0), ncclSuccess);
            GT_CUDA(cudaDeviceSynchronize());
            EXPECT_EQ(p.check(), "");
            GT_CUDA(cudaMemcpy(host.data(), dev, host.size() * sizeof(uint64_t),
                               cudaMemcpyDeviceToHost));
            cudaFree(dev);
            for (int w = 0; w < kCanaryWords; ++w)
              EXPECT_EQ(host[words + w], kCanary) << "written past the trace buffer at word " << w;
            host.resize(words);
            int consumerRecords[2] = {0, 0}, producerRecords = 0, epiRecords = 0;
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
                    // Word 2: the empty waits between the tile's first and last loads.
                    EXPECT_LE(q[2], q[1] - q[0]) << "CTA " << c << " producer tile " << n;
                    for (int k = 3; k < kTraceWords; ++k)
                      EXPECT_EQ(q[k], 0u) << "CTA " << c << " producer tile " << n << " word " << k;
                    prevEnd = q[1];
                  } else {
                    EXPECT_GE(q[0], prevEnd) << "CTA " << c << " row " << r << " tile " << n;
                    for (int k = 1; k < 4; ++k)
                      EXPECT_GE(q[k], q[k - 1]) << "CTA " << c << " row " << r << " tile " << n;
                    // The epilogue's inner stamps: only through the cooperative kernels' TMA
                    // staging, then ordered (pipeline 4 leaves them 0).
                    if (tma && !wide) {
                      ++epiRecords;
                      EXPECT_GE(q[4], q[2]) << "CTA " << c << " row " << r << " tile " << n;
                      EXPECT_GE(q[5], q[4]) << "CTA " << c << " row " << r << " tile " << n;
                      EXPECT_GE(q[6], q[5]) << "CTA " << c << " row " << r << " tile " << n;
                      EXPECT_GE(q[3], q[6]) << "CTA " << c << " row " << r << " tile " << n;
                    } else {
                      EXPECT_EQ(q[4] | q[5] | q[6], 0u) << "CTA " << c << " row " << r;
                    }
                    // Word 7: the full waits inside the main loop.
                    EXPECT_LE(q[7], q[2] - q[1]) << "CTA " << c << " row " << r << " tile " << n;
                    prevEnd = q[3];
                  }
                }
                for (int m = n; m < cap; ++m) {  // after the first empty record, nothing
                  const uint64_t* q = h + (size_t)(1 + m) * kTraceWords;
                  for (int k = 0; k < kTraceWords; ++k)
                    EXPECT_EQ(q[k], 0u) << "CTA " << c << " row " << r << " record " << m;
                }
                EXPECT_LE(prevEnd, h[3])
                    << "CTA " << c << " row " << r << ": a stamp after the end";
                // Static schedule: every role walks its CTA's tiles; the ping-pong WG1 fewer (the
                // halves past N: the totals below); pipeline 4's warpgroups every other unit.
                const int walked = std::min(cap, tiles / grid / (wide && r > 0 ? 2 : 1));
                if (!dynamic && !(pipeline == 3 && r == 2))
                  EXPECT_EQ(n, walked) << "CTA " << c << " row " << r;
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
            // The last column tile of each row block has its second half past N.
            const int wg1Skips = pipeline == 3 ? mk::gemm::tilesM(g) : 0;
            if (expect > 0) {
              EXPECT_EQ(producerRecords, expect);
              EXPECT_EQ(consumerRecords[0], wide ? expect / 2 : expect);
              EXPECT_EQ(consumerRecords[1], wide ? expect / 2 : expect - wg1Skips);
            } else {
              EXPECT_LE(consumerRecords[0], grid * cap);
              if (pipeline != 3) EXPECT_EQ(consumerRecords[0], consumerRecords[1]);
            }
            const mk::gemm::TraceSummary s = mk::gemm::summarizeTrace(host, grid, cap);
            EXPECT_EQ(s.records, consumerRecords[0] + consumerRecords[1]);
            EXPECT_EQ(s.epiRecords, epiRecords);
            EXPECT_GT(s.clockGHz, 0.3);
            EXPECT_LT(s.clockGHz, 4.0);
            EXPECT_GT(s.mainUs, 0.0);
            EXPECT_GT(s.busyFrac, 0.0);
            EXPECT_LE(s.busyFrac, 1.0);
          }
  cudaFree(claim);
}
