// Timing diagnostics of the proxy engine: where a message's time goes on the CPU side.
// Collected by the proxy thread at a few clock reads per batch; reported when the proxy
// stops (MKERNEL_PROXY_STATS=1: one block on stderr; otherwise at INFO, subsystem PROXY).
#pragma once
#include <cstdint>
#include <string>

namespace mk {

uint64_t proxyNowNs();  // steady clock

// Histogram of durations in power-of-two microsecond buckets.
struct ProxyLatHist {
  static constexpr int kBuckets = 24;  // [0,1) us, [1,2), [2,4) ... up to ~8 s
  uint64_t n = 0, sumNs = 0, maxNs = 0;
  uint64_t bucket[kBuckets] = {};
  void add(uint64_t ns);
  // Upper bound (us) of the bucket holding quantile q of the samples.
  double quantileUs(double q) const;
  std::string str(const char* name) const;
};

struct ProxyTimes {
  ProxyLatHist cmdToPost;     // ring command taken -> its batch header handed to the backend,
  ProxyLatHist cmdToBatch;    //   = taken -> its batch formed (queued behind other work)
  ProxyLatHist batchToPost;   //   + batch formed -> header posted (isend calls, busy retries)
  ProxyLatHist isendHdr;      // the isend() call that posted a header (per batch; with
                              //   MKERNEL_SOCKET_TX_COALESCE the write is in postToSent)
  ProxyLatHist postToSent;    // header posted -> every message of the batch sent
  ProxyLatHist hdrToApplied;  // batch header received -> its data landed, signals applied
  uint64_t loops = 0, yields = 0, slowYields = 0, sleeps = 0;
  uint64_t maxGapNs = 0;  // longest loop iteration that did not sleep (descheduled?)
  uint64_t gapsOver200us = 0;
  void loop(uint64_t gapNs, bool slept) {
    loops++;
    if (slept) return;
    if (gapNs > maxGapNs) maxGapNs = gapNs;
    if (gapNs > 200000) gapsOver200us++;
  }
};

// Receive system calls of the backend's recv comms (Net::recvCounts), summed over peers.
struct ProxyRecvCalls {
  bool counted = false;  // the backend counts them
  uint64_t calls = 0, empty = 0, msgs = 0;
};

void proxyReportTimes(int rank, const ProxyTimes& t, uint64_t cmds, uint64_t batches,
                      const ProxyRecvCalls& rc);

}  // namespace mk
