// CPU tests of the GEMM engine's timeline stamps (fused/gemm/trace.h): the buffer layout and
// the summary the benchmark prints, on buffers written here in the layout the kernel writes
// (no CUDA call). The host-side rules for GemmArgs::trace are in test_gemm_can_implement.cc.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>
#include <gtest/gtest.h>

#include "fused/gemm/trace.h"

using mk::gemm::kTraceRows;
using mk::gemm::kTraceWords;
using mk::gemm::traceRow;
using mk::gemm::traceWords;

TEST(GemmTrace, LayoutHasNoOverlap) {
  // Every (cta, row, record) owns its own words, and the buffer's size is the end of the last.
  const int ctas = 5, tiles = 3;
  std::vector<int> owner(traceWords(ctas, tiles), -1);
  for (int c = 0; c < ctas; ++c)
    for (int r = 0; r < kTraceRows; ++r)
      for (int n = 0; n <= tiles; ++n)
        for (int w = 0; w < kTraceWords; ++w) {
          const size_t i = traceRow(c, r, tiles) + (size_t)n * kTraceWords + w;
          ASSERT_LT(i, owner.size());
          EXPECT_EQ(owner[i], -1) << c << " " << r << " " << n << " " << w;
          owner[i] = ((c * kTraceRows + r) * (tiles + 1) + n) * kTraceWords + w;
        }
  for (int o : owner) EXPECT_GE(o, 0);
}

TEST(GemmTrace, SummaryOfKnownTimelines) {
  // Two CTAs, tiles of random lengths (seeded per run, printed), each consumer's records
  // built from known parts in SM cycles at 2 cycles a ns (the headers' two clocks say so),
  // so the summary's medians in microseconds are known exactly.
  std::random_device rd;
  const unsigned seed = rd();
  std::mt19937 gen(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::uniform_int_distribution<int> jitter(0, 1999);
  const int ctas = 2, tiles = 3;
  std::vector<uint64_t> w(traceWords(ctas, tiles), 0);
  const uint64_t base = 1700000000000000000ull;  // globaltimer: ns since the epoch
  const uint64_t clk0 = 123456789;               // clock64 at the first role's start
  std::vector<double> firstWaits, mains, epilogues;
  double mainCycles = 0;
  uint64_t lastEnd = 0;
  for (int c = 0; c < ctas; ++c) {
    uint64_t* pr = w.data() + traceRow(c, 0, tiles);
    pr[0] = base + 100 * c;
    pr[1] = clk0 + 200 * c;
    for (int r = 1; r < kTraceRows; ++r) {
      uint64_t* h = w.data() + traceRow(c, r, tiles);
      h[0] = base + 200 + 100 * c + 10 * r;  // the consumers start a little later
      h[1] = pr[1] + 2 * (h[0] - pr[0]);     // the same SM's counter, 2 cycles a ns
      uint64_t t = h[1];
      for (int n = 0; n < tiles; ++n) {
        uint64_t* q = h + (size_t)(1 + n) * kTraceWords;
        const uint64_t fw = 200 + jitter(gen), ml = 18000 + jitter(gen), ep = 800 + jitter(gen);
        q[0] = t;
        q[1] = t + fw;
        q[2] = q[1] + ml;
        q[3] = q[2] + ep;
        if (r == 1) pr[(1 + n) * kTraceWords] = q[1] - 1400;  // the producer 0.7 us ahead
        t = q[3] + 10;
        firstWaits.push_back(fw / 2000.0);
        mains.push_back(ml / 2000.0);
        epilogues.push_back(ep / 2000.0);
        mainCycles += ml;
      }
      h[3] = t + 100 + (t - h[1]) % 2;  // an even count: exactly 2 cycles a ns
      h[2] = h[0] + (h[3] - h[1]) / 2;
      lastEnd = std::max(lastEnd, h[2]);
    }
    pr[2] = lastEnd;
    pr[3] = pr[1] + 2 * (pr[2] - pr[0]);
  }
  // A record the kernel never finished (a tile past an abort) counts for nothing.
  uint64_t* unfinished = w.data() + traceRow(1, 2, tiles) + (size_t)tiles * kTraceWords;
  unfinished[3] = 0;
  const mk::gemm::TraceSummary s = mk::gemm::summarizeTrace(w, ctas, tiles);
  EXPECT_EQ(s.records, ctas * 2 * tiles - 1);
  // Its parts leave the expectation too: the last pushed for CTA 1, warpgroup 1.
  const size_t drop = (size_t)(1 * 2 + 1) * tiles + tiles - 1;
  mainCycles -= mains[drop] * 2000.0;
  firstWaits.erase(firstWaits.begin() + drop);
  mains.erase(mains.begin() + drop);
  epilogues.erase(epilogues.begin() + drop);
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  EXPECT_NEAR(s.firstWaitUs, med(firstWaits), 1e-9);
  EXPECT_NEAR(s.mainUs, med(mains), 1e-9);
  EXPECT_NEAR(s.epilogueUs, med(epilogues), 1e-9);
  EXPECT_NEAR(s.clockGHz, 2.0, 1e-12);
  EXPECT_NEAR(s.producerLeadUs, 0.7, 1e-9);
  EXPECT_NEAR(s.spanUs, (lastEnd - base) * 1e-3, 1e-6);
  EXPECT_NEAR(s.startSpreadUs, 0.11, 1e-6);  // CTA 0 WG 0 at +210 ns, CTA 1 WG 1 at +320
  EXPECT_NEAR(s.mainFrac, mainCycles / 2.0 / (4.0 * (lastEnd - base)), 1e-12);
  EXPECT_GE(s.endSpreadUs, 0.0);
  // Nothing usable: zeros, not garbage.
  std::vector<uint64_t> none(traceWords(ctas, tiles), 0);
  EXPECT_EQ(mk::gemm::summarizeTrace(none, ctas, tiles).records, 0);
  EXPECT_EQ(mk::gemm::summarizeTrace(w, ctas, tiles + 1).records, 0);  // buffer too short
}

// The unit walk (pipeline 4): the producer's records are the units of both warpgroups in turn
// (unit u is WG u % 2's record u / 2), so a consumer record's lead is taken from the producer's
// record of the same unit, here always 0.5 us (1000 cycles at 2 a ns) ahead; pairing record n
// with the producer's record n would mix units (leads of 0.5 us and more than 10 us).
TEST(GemmTrace, UnitWalkProducerLead) {
  const int ctas = 1, tiles = 4;  // 4 units: records 0-3 of the producer, 0-1 of each WG
  std::vector<uint64_t> w(traceWords(ctas, tiles), 0);
  const uint64_t base = 1700000000000000000ull, clk0 = 5000000;
  uint64_t* pr = w.data() + traceRow(0, 0, tiles);
  pr[0] = base;
  pr[1] = clk0;
  uint64_t end = 0;
  for (int r = 1; r < kTraceRows; ++r) {
    uint64_t* h = w.data() + traceRow(0, r, tiles);
    h[0] = base + 100;
    h[1] = clk0 + 200;
    for (int n = 0; n < 2; ++n) {
      const int u = 2 * n + (r - 1);
      uint64_t* q = h + (size_t)(1 + n) * kTraceWords;
      q[0] = clk0 + 1000 + 20000 * (uint64_t)u;  // units in turn, 10 us apart
      q[1] = q[0] + 1500;
      q[2] = q[1] + 16000;
      q[3] = q[2] + 3000;
      uint64_t* pq = pr + (size_t)(1 + u) * kTraceWords;
      pq[0] = q[1] - 1000;
      pq[1] = pq[0] + 100;
      end = std::max(end, q[3]);
    }
    h[3] = end + 100 + (end + 100 - h[1]) % 2;
    h[2] = h[0] + (h[3] - h[1]) / 2;
  }
  pr[3] = w[traceRow(0, 1, tiles) + 3];
  pr[2] = pr[0] + (pr[3] - pr[1]) / 2;
  const mk::gemm::TraceSummary s = mk::gemm::summarizeTrace(w, ctas, tiles);
  EXPECT_EQ(s.records, 4);
  EXPECT_NEAR(s.clockGHz, 2.0, 1e-12);
  EXPECT_NEAR(s.producerLeadUs, 0.5, 1e-9);
}

// The epilogue's parts (words 4-6: staging free, staging written, barrier passed) and the
// busy fraction (per CTA, the union of its warpgroups' main loops over their life), on a
// hand-made ping-pong-like timeline of one CTA at 2 cycles a ns: WG0's and WG1's main loops
// alternate and overlap a little at each hand-over, so the union is not their sum.
TEST(GemmTrace, EpiloguePartsAndBusyFraction) {
  const int ctas = 1, tiles = 2;
  std::vector<uint64_t> w(traceWords(ctas, tiles), 0);
  const uint64_t base = 1700000000000000000ull;
  auto header = [&](int row, uint64_t clkFrom, uint64_t clkTo) {
    uint64_t* h = w.data() + traceRow(0, row, tiles);
    h[0] = base + clkFrom / 2;
    h[1] = clkFrom;
    h[2] = base + clkTo / 2;
    h[3] = clkTo;
  };
  auto record = [&](int row, int n, std::vector<uint64_t> q) {
    uint64_t* r = w.data() + traceRow(0, row, tiles) + (size_t)(1 + n) * kTraceWords;
    for (size_t k = 0; k < q.size(); ++k) r[k] = q[k];
  };
  header(1, 1000, 4400);
  header(2, 1000, 5100);
  // WG0: unit 0 with its epilogue's parts (wait 50, write 150, barrier 50, issue 150 cycles).
  record(1, 0, {1000, 1100, 2100, 2500, 2150, 2300, 2350, 0});
  record(1, 1, {2500, 3000, 4000, 4300});
  // WG1: a record whose inner words are out of order counts for the main loop, not the parts.
  record(2, 0, {1000, 2050, 3050, 3400, 1, 0, 0, 0});
  record(2, 1, {3400, 4050, 5000, 5100});
  const mk::gemm::TraceSummary s = mk::gemm::summarizeTrace(w, ctas, tiles);
  EXPECT_EQ(s.records, 4);
  EXPECT_EQ(s.epiRecords, 1);
  EXPECT_NEAR(s.epiWaitUs, 0.025, 1e-12);
  EXPECT_NEAR(s.epiWriteUs, 0.075, 1e-12);
  EXPECT_NEAR(s.epiBarUs, 0.025, 1e-12);
  EXPECT_NEAR(s.epiIssueUs, 0.075, 1e-12);
  // Main loops [1100,2100] [2050,3050] [3000,4000] [4050,5000]: union 2900 + 950 cycles of the
  // consumers' 1000..5100.
  EXPECT_NEAR(s.busyFrac, 3850.0 / 4100.0, 1e-12);
  // The sum of the four main loops (3950 cycles, 1975 ns) over two warpgroups' 2050 ns.
  EXPECT_NEAR(s.mainFrac, (3950.0 / 2) / (2.0 * (5100 - 1000) / 2), 1e-12);
}

// The wait fractions: consumer word 7 (full waits inside the main loop) over the main loops'
// cycles, producer word 2 (empty waits between its first and last loads) over those spans; a
// count larger than its span (a torn record) counts for neither side.
TEST(GemmTrace, WaitFractions) {
  const int ctas = 1, tiles = 2;
  std::vector<uint64_t> w(traceWords(ctas, tiles), 0);
  const uint64_t base = 1700000000000000000ull;
  for (int row = 0; row < kTraceRows; ++row) {
    uint64_t* h = w.data() + traceRow(0, row, tiles);
    h[0] = base;
    h[1] = 1000;
    h[2] = base + 3000;
    h[3] = 7000;
  }
  auto record = [&](int row, int n, std::vector<uint64_t> q) {
    uint64_t* r = w.data() + traceRow(0, row, tiles) + (size_t)(1 + n) * kTraceWords;
    for (size_t k = 0; k < q.size(); ++k) r[k] = q[k];
  };
  // Producer: loads over 1000 and 2000 cycles, 300 and 100 of them waiting for empty stages.
  record(0, 0, {1000, 2000, 300});
  record(0, 1, {3000, 5000, 100});
  // Consumers: main loops of 1000, 2000, 1000 and 1500 cycles, waiting 50, 0, 250 and (torn,
  // more than its loop) 9999.
  record(1, 0, {1000, 1100, 2100, 2500, 0, 0, 0, 50});
  record(1, 1, {2500, 2600, 4600, 5000, 0, 0, 0, 0});
  record(2, 0, {1000, 1200, 2200, 2600, 0, 0, 0, 250});
  record(2, 1, {2600, 2700, 4200, 4600, 0, 0, 0, 9999});
  const mk::gemm::TraceSummary s = mk::gemm::summarizeTrace(w, ctas, tiles);
  EXPECT_EQ(s.records, 4);
  EXPECT_NEAR(s.emptyWaitFrac, 400.0 / 3000.0, 1e-12);
  EXPECT_NEAR(s.fullWaitFrac, 300.0 / 4000.0, 1e-12);
  // Untraced words (all 0): no waits, not garbage.
  record(0, 0, {1000, 2000, 0});
  record(0, 1, {3000, 5000, 0});
  for (int row = 1; row <= 2; ++row)
    for (int n = 0; n < tiles; ++n)
      w[traceRow(0, row, tiles) + (size_t)(1 + n) * kTraceWords + 7] = 0;
  const mk::gemm::TraceSummary z = mk::gemm::summarizeTrace(w, ctas, tiles);
  EXPECT_EQ(z.fullWaitFrac, 0.0);
  EXPECT_EQ(z.emptyWaitFrac, 0.0);
}
