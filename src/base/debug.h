// Logging and the last-error record, with NCCL's user-facing behaviour:
// NCCL_DEBUG (VERSION/WARN/INFO/TRACE), NCCL_DEBUG_SUBSYS (comma list, ^ negates),
// NCCL_DEBUG_FILE (%h host, %p pid). Lines read "host:pid:tid [dev] mkernel LEVEL msg".
#pragma once
#include <atomic>
#include <cstdint>

namespace mk {

enum LogLevel : int {
  kLogNone = 0,
  kLogVersion = 1,
  kLogWarn = 2,
  kLogInfo = 3,
  kLogAbort = 4,
  kLogTrace = 5,
};

// Subsystem bits, the same names NCCL users pass in NCCL_DEBUG_SUBSYS.
enum LogSubsys : uint64_t {
  kInit = 1ull << 0,
  kColl = 1ull << 1,
  kP2p = 1ull << 2,
  kShm = 1ull << 3,
  kNet = 1ull << 4,
  kGraph = 1ull << 5,
  kTune = 1ull << 6,
  kEnv = 1ull << 7,
  kAlloc = 1ull << 8,
  kCall = 1ull << 9,
  kProxy = 1ull << 10,
  kNvls = 1ull << 11,
  kBootstrap = 1ull << 12,
  kReg = 1ull << 13,
  kFused = 1ull << 14,
  kAllSubsys = ~0ull,
};

// Current level; the first call reads the environment.
int logLevel();
bool logEnabled(int level, uint64_t subsys);
void logMessage(int level, uint64_t subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
// A warning that is no error of the call that logs it (a risk noticed at init): printed at WARN
// level like MK_WARN, but ncclGetLastError keeps returning the last real error.
void logAdvisory(const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
// Re-reads NCCL_DEBUG* (ncclResetDebugInit, tests).
void logReset();
// The device printed in "[dev]" for log lines of this thread (-1: unknown).
void logSetThreadDevice(int dev);
// Last warning, for ncclGetLastError: the returned pointer is owned by the calling thread.
const char* lastError();
void setLastError(const char* msg);
// Prints the version banner once per process (at VERSION level and above).
void logVersionBanner();

// Memory of one call site of a rate-limited message (a function-local static in the macros).
struct LogRateLimit {
  std::atomic<int64_t> nextMs{INT64_MIN};  // CLOCK_MONOTONIC ms before which the site is quiet
  std::atomic<uint64_t> suppressed{0};     // messages dropped since the last one printed
};
// logMessage for a message that can repeat many times a second (a failing accept() in a loop, a
// flood of bad peers): at most one per intervalMs per LogRateLimit; the next one printed ends
// with "(suppressed N similar messages)". Suppressed warnings do not update the last error.
void logMessageLimited(LogRateLimit* rl, int64_t intervalMs, int level, uint64_t subsys,
                       const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 7, 8)));

}  // namespace mk

#define MK_WARN(...) \
  ::mk::logMessage(::mk::kLogWarn, ::mk::kAllSubsys, __FILE__, __LINE__, __VA_ARGS__)
#define MK_WARN_ADVISORY(...) ::mk::logAdvisory(__FILE__, __LINE__, __VA_ARGS__)
#define MK_INFO(subsys, ...)                                                       \
  do {                                                                             \
    if (::mk::logEnabled(::mk::kLogInfo, (subsys)))                                \
      ::mk::logMessage(::mk::kLogInfo, (subsys), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define MK_TRACE(subsys, ...)                                                       \
  do {                                                                              \
    if (::mk::logEnabled(::mk::kLogTrace, (subsys)))                                \
      ::mk::logMessage(::mk::kLogTrace, (subsys), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
// At most one of these per intervalMs per call site (see logMessageLimited).
#define MK_WARN_RATELIMITED(intervalMs, ...)                                               \
  do {                                                                                     \
    static ::mk::LogRateLimit mkRateLimit_;                                                \
    ::mk::logMessageLimited(&mkRateLimit_, (intervalMs), ::mk::kLogWarn, ::mk::kAllSubsys, \
                            __FILE__, __LINE__, __VA_ARGS__);                              \
  } while (0)
#define MK_INFO_RATELIMITED(subsys, intervalMs, ...)                                           \
  do {                                                                                         \
    static ::mk::LogRateLimit mkRateLimit_;                                                    \
    if (::mk::logEnabled(::mk::kLogInfo, (subsys)))                                            \
      ::mk::logMessageLimited(&mkRateLimit_, (intervalMs), ::mk::kLogInfo, (subsys), __FILE__, \
                              __LINE__, __VA_ARGS__);                                          \
  } while (0)
