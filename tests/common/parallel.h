// Host reference work spread over the machine's cores. The GPU suites compare large outputs
// element by element against double-precision host references; run serially, those
// references, not the GPU, set the suites' run time (the GPU host has 16 cores).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace mktest {

// Runs f(i) for every i in [0, count), on up to maxThreads threads (the calling one included),
// each taking the next index as it finishes one: uneven work per index balances itself. f must
// be safe to run concurrently for different i. Returns after every call has returned.
template <typename F>
void parallelFor(size_t count, F f, unsigned maxThreads = 32) {
  const unsigned hw = std::max(1u, std::min(maxThreads, std::thread::hardware_concurrency()));
  const unsigned nt = (unsigned)std::min<size_t>(hw, count);
  std::atomic<size_t> next{0};
  auto body = [&] {
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < count;) f(i);
  };
  std::vector<std::thread> ts;
  for (unsigned t = 1; t < nt; ++t) ts.emplace_back(body);
  body();
  for (auto& t : ts) t.join();
}

// Runs f(begin, end) over [0, n) cut into ranges of at least minPerRange indices, through
// parallelFor (for element loops too fine for one call per index).
template <typename F>
void parallelForRanges(size_t n, size_t minPerRange, F f, unsigned maxThreads = 32) {
  if (n == 0) return;
  const unsigned hw = std::max(1u, std::min(maxThreads, std::thread::hardware_concurrency()));
  const size_t per =
      std::max<size_t>(std::max<size_t>(minPerRange, 1), (n + 4 * hw - 1) / (4 * hw));
  const size_t ranges = (n + per - 1) / per;
  parallelFor(
      ranges, [&](size_t r) { f(r * per, std::min(n, (r + 1) * per)); }, maxThreads);
}

}  // namespace mktest
