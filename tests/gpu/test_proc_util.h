// Helpers of the GPU tests that run ranks as processes (this binary re-spawned, one rank per
// child: test_coll_procs.cc, test_coll_hier_kill.cc, test_fused_matrix_procs.cu) and of the
// tests that time their waits (fused matrix, fault and abort tests).
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

namespace gputest {

using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
// Polls a stream with a bound: true when its work completed without error, false on an error
// or when timeoutS passes first.
inline bool streamCompleted(cudaStream_t s, double timeoutS) {
  const auto t0 = Clock::now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady || since(t0) > timeoutS) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// steady_clock is CLOCK_MONOTONIC on Linux: one clock for every process of the machine, so
// times taken in different processes (a victim's kill, a survivor's error) compare.
inline int64_t monoNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// The unique id travels to the children in an environment variable, as hex.
inline std::string idToHex(const ncclUniqueId& id) {
  std::string hex;
  for (size_t i = 0; i < sizeof(id.internal); i++) {
    char b[3];
    snprintf(b, sizeof(b), "%02x", (unsigned char)id.internal[i]);
    hex += b;
  }
  return hex;
}
inline bool hexToId(const char* hex, ncclUniqueId* id) {
  if (!hex || strlen(hex) != 2 * sizeof(id->internal)) return false;
  for (size_t i = 0; i < sizeof(id->internal); i++) {
    unsigned v = 0;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return false;
    id->internal[i] = (char)v;
  }
  return true;
}

// A number in a file, written under a temporary name and renamed (readers see all or nothing).
inline void writeNumber(const std::string& path, int64_t v) {
  const std::string tmp = path + ".tmp";
  FILE* f = fopen(tmp.c_str(), "w");
  if (!f) return;
  fprintf(f, "%lld\n", (long long)v);
  fclose(f);
  rename(tmp.c_str(), path.c_str());
}
inline bool readNumber(const std::string& path, int64_t* v) {
  FILE* f = fopen(path.c_str(), "r");
  if (!f) return false;
  long long x = 0;
  const bool ok = fscanf(f, "%lld", &x) == 1;
  fclose(f);
  if (ok) *v = x;
  return ok;
}

// A child's "plan n rank seed" (plan: at most 31 characters). On a malformed spec prints
// "<what>: <spec>" to stderr and returns false.
inline bool parseChildSpec(const char* spec, const char* what, char (&plan)[32], int* n, int* me,
                           uint64_t* seed) {
  unsigned long long s = 0;
  if (sscanf(spec, "%31s %d %d %llu", plan, n, me, &s) != 4) {
    fprintf(stderr, "%s: %s\n", what, spec);
    return false;
  }
  *seed = s;
  return true;
}

// Polls ncclCommGetAsyncError every 5 ms from t0 until it reports an error (*async) or limitS
// has passed. Returns ncclSuccess, or the result of a query that failed.
inline ncclResult_t pollAsyncError(ncclComm_t comm, Clock::time_point t0, double limitS,
                                   ncclResult_t* async) {
  while ((*async == ncclSuccess || *async == ncclInProgress) && since(t0) < limitS) {
    const ncclResult_t q = ncclCommGetAsyncError(comm, async);
    if (q != ncclSuccess) return q;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return ncclSuccess;
}

}  // namespace gputest
