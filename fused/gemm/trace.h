// Per-tile timeline of one GEMM launch (GemmArgs::trace, `bench_gemm_bench --trace`): where a
// tile's time goes. At small K (8192 x 8192 x 1024: 16 k-steps a tile) the engine stays ~10%
// behind cuBLAS while it matches it at K = 8192, and sessions 5-16 could only guess which
// per-tile cost it is (the epilogue, a late first stage, the main loop itself, the SM clock);
// these stamps measure each. The layout is shared by the kernel (gemm_kernel.cuh), the bench
// and the unit test of summarizeTrace, so all three read the same words.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#ifdef __CUDACC__
#define MK_TRACE_HD __host__ __device__ __forceinline__
#else
#define MK_TRACE_HD inline
#endif

namespace mk {
namespace gemm {

constexpr int kTraceRows = 3;   // per CTA: the producer thread, consumer warpgroups 0 and 1
constexpr int kTraceWords = 8;  // per record

// Row r of CTA c (< GemmArgs::traceCtas) starts at word traceRow(c, r, tiles): a header
// record, then `tiles` records.
//  header: globaltimer (ns) and clock64 at the role's start, then the same at its end;
//  consumer record (the warpgroup's n-th tile, or unit of the ping-pong consumers): [tile
//    start, its first stage ready, main loop done, epilogue's stores issued, then inside the
//    epilogue when it goes through the TMA staging (0 otherwise): staging free (the wait for
//    earlier stores' reads and the warpgroup's barrier), staging written (conversions and
//    shared stores of the first group of boxes), its barrier passed, then the cycles the
//    main loop spent waiting for full stages after the first], clock64. The ping-pong
//    consumers' tile start is before the wait for their turn;
//  producer record: [the tile's first load issued, its last load issued, the cycles spent
//    waiting for empty stages in between, 0...], clock64.
// Records are SM cycles: exact differences on one SM (globaltimer may tick only every
// microsecond, longer than an epilogue); the header's two clocks convert them to time (the
// role's mean clock over its life) and line different SMs up. Tiles past `tiles` are not
// recorded; words not written keep what the caller put there (0).
MK_TRACE_HD size_t traceRow(int cta, int row, int tiles) {
  return ((size_t)cta * kTraceRows + row) * (size_t)(1 + tiles) * kTraceWords;
}
MK_TRACE_HD size_t traceWords(int ctas, int tiles) {
  return traceRow(ctas, 0, tiles);
}

struct TraceSummary {
  int records = 0;            // consumer tile records read (both warpgroups)
  double spanUs = 0;          // earliest role start to latest role end
  double clockGHz = 0;        // mean SM clock over the consumers' lives (clock64 over globaltimer)
  double firstWaitUs = 0;     // median: tile start -> its first stage ready
  double mainUs = 0;          // median: first stage ready -> main loop done
  double epilogueUs = 0;      // median: main loop done -> stores issued
  double startSpreadUs = 0;   // latest consumer start - earliest
  double endSpreadUs = 0;     // latest consumer end - median consumer end (the tail)
  double mainFrac = 0;        // main-loop time over consumer warpgroups x span
  double producerLeadUs = 0;  // median: a tile's first load issued -> its first stage ready
  // The epilogue's parts (medians over the records that have them; TMA staging only): wait
  // for the staging, conversions + shared stores, the barrier before the stores, their issue.
  int epiRecords = 0;
  double epiWaitUs = 0, epiWriteUs = 0, epiBarUs = 0, epiIssueUs = 0;
  // Per CTA, the union of its consumer warpgroups' main loops over the span (averaged over
  // CTAs): with ping-pong consumers the two main loops alternate, so mainFrac (their sum over
  // two warpgroups' time) halves while this does not.
  double busyFrac = 0;
  // Where a slow k-step waits: the consumers' full-stage waits inside their main loops over
  // those loops' cycles (they starve: loads late), and the producer's empty-stage waits over
  // its first-to-last-load spans (the ring runs full: the tensor work is the limit). Each
  // counted wait includes its probe's tens of cycles.
  double fullWaitFrac = 0, emptyWaitFrac = 0;
};

namespace tracedetail {
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace tracedetail

// Summary of a trace buffer read back from the device (traceWords(ctas, tiles) words, zeroed
// before the launch). A record counts when all its stamps were written (nonzero, in order).
inline TraceSummary summarizeTrace(const std::vector<uint64_t>& w, int ctas, int tiles) {
  using tracedetail::median;
  TraceSummary s;
  if (ctas <= 0 || tiles <= 0 || w.size() < traceWords(ctas, tiles)) return s;
  std::vector<double> firstWait, mainLoop, epilogue, lead, epiWait, epiWrite, epiBar, epiIssue;
  std::vector<uint64_t> ends;
  uint64_t t0 = UINT64_MAX, t1 = 0, startLo = UINT64_MAX, startHi = 0, endHi = 0;
  double cycles = 0, ns = 0, mainNs = 0;
  int consumers = 0, busyCtas = 0;
  double busySum = 0;
  double fullWait = 0, mainCycles = 0, emptyWait = 0, loadCycles = 0;
  for (int c = 0; c < ctas; ++c) {
    std::vector<std::pair<uint64_t, uint64_t>> loops;  // this CTA's main loops, SM cycles
    uint64_t ctaLo = UINT64_MAX, ctaHi = 0;            // its consumers' life, SM cycles
    // The unit walk (pipeline 4): the producer's records are the units of both consumer
    // warpgroups in turn (WG w's n-th unit is the CTA's 2n + w-th), so its record count is the
    // sum of theirs; elsewhere each consumer record n is the producer's tile n.
    int walked[kTraceRows] = {};
    for (int r = 0; r < kTraceRows; ++r) {
      const uint64_t* h = w.data() + traceRow(c, r, tiles);
      for (int n = 0; n < tiles && h[(size_t)(1 + n) * kTraceWords] != 0; ++n) ++walked[r];
    }
    const bool unitWalk = walked[2] > 0 && walked[0] == walked[1] + walked[2];
    for (int r = 0; r < kTraceRows; ++r) {
      const uint64_t* h = w.data() + traceRow(c, r, tiles);
      if (h[0] == 0 || h[2] <= h[0] || h[3] <= h[1]) continue;  // never ran, or no end stamp
      t0 = std::min(t0, h[0]);
      t1 = std::max(t1, h[2]);
      if (r == 0) {
        for (int n = 0; n < tiles; ++n) {
          const uint64_t* q = h + (size_t)(1 + n) * kTraceWords;
          if (q[0] == 0 || q[1] < q[0] || q[2] > q[1] - q[0]) continue;
          emptyWait += (double)q[2];
          loadCycles += (double)(q[1] - q[0]);
        }
        continue;
      }
      ++consumers;
      startLo = std::min(startLo, h[0]);
      startHi = std::max(startHi, h[0]);
      endHi = std::max(endHi, h[2]);
      ends.push_back(h[2]);
      cycles += (double)(h[3] - h[1]);
      ctaLo = std::min(ctaLo, h[1]);
      ctaHi = std::max(ctaHi, h[3]);
      ns += (double)(h[2] - h[0]);
      const double perUs = 1e3 * (double)(h[3] - h[1]) / (double)(h[2] - h[0]);  // cycles a us
      const uint64_t* pr = w.data() + traceRow(c, 0, tiles);
      for (int n = 0; n < tiles; ++n) {
        const uint64_t* q = h + (size_t)(1 + n) * kTraceWords;
        if (q[0] == 0 || q[1] < q[0] || q[2] < q[1] || q[3] < q[2]) continue;
        ++s.records;
        firstWait.push_back((q[1] - q[0]) / perUs);
        mainLoop.push_back((q[2] - q[1]) / perUs);
        epilogue.push_back((q[3] - q[2]) / perUs);
        mainNs += 1e3 * (q[2] - q[1]) / perUs;
        if (q[7] <= q[2] - q[1]) {
          fullWait += (double)q[7];
          mainCycles += (double)(q[2] - q[1]);
        }
        loops.emplace_back(q[1], q[2]);
        if (q[4] != 0 && q[2] <= q[4] && q[4] <= q[5] && q[5] <= q[6] && q[6] <= q[3]) {
          ++s.epiRecords;
          epiWait.push_back((q[4] - q[2]) / perUs);
          epiWrite.push_back((q[5] - q[4]) / perUs);
          epiBar.push_back((q[6] - q[5]) / perUs);
          epiIssue.push_back((q[3] - q[6]) / perUs);
        }
        if (r == 1 || unitWalk) {  // the producer's record of the same tile or unit (one SM)
          const uint64_t* pq = pr + (size_t)(1 + (unitWalk ? 2 * n + r - 1 : n)) * kTraceWords;
          if (pq[0] != 0 && q[1] >= pq[0]) lead.push_back((q[1] - pq[0]) / perUs);
        }
      }
    }
    if (!loops.empty() && ctaHi > ctaLo) {
      std::sort(loops.begin(), loops.end());
      uint64_t busy = 0, from = loops[0].first, to = loops[0].second;
      for (const auto& l : loops) {
        if (l.first > to) {
          busy += to - from;
          from = l.first;
        }
        to = std::max(to, l.second);
      }
      busy += to - from;
      busySum += (double)busy / (double)(ctaHi - ctaLo);
      ++busyCtas;
    }
  }
  if (consumers == 0 || t1 <= t0) return s;
  s.busyFrac = busyCtas > 0 ? busySum / busyCtas : 0;
  s.fullWaitFrac = mainCycles > 0 ? fullWait / mainCycles : 0;
  s.emptyWaitFrac = loadCycles > 0 ? emptyWait / loadCycles : 0;
  s.epiWaitUs = median(epiWait);
  s.epiWriteUs = median(epiWrite);
  s.epiBarUs = median(epiBar);
  s.epiIssueUs = median(epiIssue);
  s.spanUs = (t1 - t0) * 1e-3;
  s.clockGHz = ns > 0 ? cycles / ns : 0;
  s.firstWaitUs = median(firstWait);
  s.mainUs = median(mainLoop);
  s.epilogueUs = median(epilogue);
  s.startSpreadUs = (startHi - startLo) * 1e-3;
  std::vector<double> endsUs;  // relative: ns since the epoch lose digits in a double
  for (uint64_t e : ends) endsUs.push_back((e - t0) * 1e-3);
  s.endSpreadUs = (endHi - t0) * 1e-3 - median(endsUs);
  s.mainFrac = mainNs / ((double)consumers * (double)(t1 - t0));
  s.producerLeadUs = median(lead);
  return s;
}

}  // namespace gemm
}  // namespace mk
