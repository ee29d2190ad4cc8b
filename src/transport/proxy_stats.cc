#include "transport/proxy_stats.h"

#include <chrono>
#include <cstdio>
#include <string>

#include "base/checks.h"
#include "base/param.h"

namespace mk {

uint64_t proxyNowNs() {
  return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void ProxyLatHist::add(uint64_t ns) {
  n++;
  sumNs += ns;
  if (ns > maxNs) maxNs = ns;
  uint64_t us = ns / 1000;
  int b = 0;
  while (us > 0 && b < kBuckets - 1) us >>= 1, b++;
  bucket[b]++;
}

double ProxyLatHist::quantileUs(double q) const {
  if (n == 0) return 0;
  uint64_t need = (uint64_t)(q * (double)n);
  if (need >= n) need = n - 1;
  uint64_t seen = 0;
  for (int b = 0; b < kBuckets; b++) {
    seen += bucket[b];
    if (seen > need) return (double)(1ull << b);
  }
  return (double)(1ull << (kBuckets - 1));
}

std::string ProxyLatHist::str(const char* name) const {
  char buf[200];
  if (n == 0) {
    snprintf(buf, sizeof(buf), "%s: none", name);
  } else {
    snprintf(buf, sizeof(buf),
             "%s: n %llu, mean %.1f us, p50 < %.0f us, p99 < %.0f us, max %.1f us", name,
             (unsigned long long)n, (double)sumNs / (double)n / 1000.0, quantileUs(0.5),
             quantileUs(0.99), (double)maxNs / 1000.0);
  }
  return buf;
}

void proxyReportTimes(int rank, const ProxyTimes& t, uint64_t cmds, uint64_t batches,
                      const ProxyRecvCalls& rc) {
  char head[240];
  snprintf(head, sizeof(head),
           "proxy rank %d: %llu commands in %llu batches; %llu loops, %llu yields (%llu slow), "
           "%llu sleeps; "
           "longest loop without sleep %.1f us, %llu over 200 us",
           rank, (unsigned long long)cmds, (unsigned long long)batches, (unsigned long long)t.loops,
           (unsigned long long)t.yields, (unsigned long long)t.slowYields,
           (unsigned long long)t.sleeps, (double)t.maxGapNs / 1000.0,
           (unsigned long long)t.gapsOver200us);
  char calls[240];
  if (!rc.counted) {
    snprintf(calls, sizeof(calls), "receive system calls: not counted by this backend");
  } else {
    // Per message: what a message costs in calls that returned data (or EOF); the empty ones
    // are the polls between messages.
    const double msgs = rc.msgs ? (double)rc.msgs : 1.0;
    snprintf(calls, sizeof(calls),
             "receive system calls: %llu for %llu messages (%.2f per message with data, "
             "%llu empty polls)",
             (unsigned long long)rc.calls, (unsigned long long)rc.msgs,
             (double)(rc.calls - rc.empty) / msgs, (unsigned long long)rc.empty);
  }
  const std::string lines[7] = {
      t.cmdToPost.str("command -> header posted"),
      t.cmdToBatch.str("  command -> batch formed"),
      t.batchToPost.str("  batch formed -> header posted"),
      t.isendHdr.str("isend(header) call (queueing only with TX coalescing)"),
      t.postToSent.str("header posted -> batch sent"),
      t.hdrToApplied.str("header received -> applied"),
      calls};
  if (MK_PARAM_INT(ProxyStats) != 0) {
    fprintf(stderr, "[mkernel] %s\n", head);
    for (const std::string& l : lines)
      fprintf(stderr, "[mkernel] proxy rank %d: %s\n", rank, l.c_str());
    return;
  }
  MK_INFO(kProxy, "%s", head);
  for (const std::string& l : lines) MK_INFO(kProxy, "proxy rank %d: %s", rank, l.c_str());
}

}  // namespace mk
