#include "base/debug.h"

#include <cstdint>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "mkernel/version.h"

namespace mk {
namespace {

struct LogState {
  std::mutex mu;
  bool init = false;
  int level = kLogNone;
  uint64_t mask = kAllSubsys;
  FILE* file = stderr;
  char host[64] = "";
  std::string lastError;
};

LogState& state() {
  static LogState* s = new LogState();  // leaked on purpose: logging works during exit
  return *s;
}

thread_local int tlsDevice = -1;
thread_local char tlsLastError[1024];

uint64_t parseSubsys(const char* str) {
  if (str == nullptr || *str == '\0') return kInit | kEnv;  // NCCL's default
  bool invert = str[0] == '^';
  if (invert) str++;
  static const struct {
    const char* name;
    uint64_t bit;
  } names[] = {{"INIT", kInit},
               {"COLL", kColl},
               {"P2P", kP2p},
               {"SHM", kShm},
               {"NET", kNet},
               {"GRAPH", kGraph},
               {"TUNING", kTune},
               {"ENV", kEnv},
               {"ALLOC", kAlloc},
               {"CALL", kCall},
               {"PROXY", kProxy},
               {"NVLS", kNvls},
               {"BOOTSTRAP", kBootstrap},
               {"REG", kReg},
               {"FUSED", kFused},
               {"ALL", kAllSubsys}};
  uint64_t mask = 0;
  std::string s(str);
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    std::string tok = s.substr(pos, end - pos);
    for (auto& n : names)
      if (strcasecmp(tok.c_str(), n.name) == 0) mask |= n.bit;
    pos = end + 1;
  }
  return invert ? ~mask : mask;
}

FILE* openDebugFile(const char* pattern, const char* host) {
  // %h -> hostname, %p -> pid, %% -> %; like NCCL_DEBUG_FILE.
  std::string path;
  for (const char* p = pattern; *p; p++) {
    if (p[0] == '%' && p[1] == 'h') {
      path += host;
      p++;
    } else if (p[0] == '%' && p[1] == 'p') {
      path += std::to_string(getpid());
      p++;
    } else if (p[0] == '%' && p[1] == '%') {
      path += '%';
      p++;
    } else {
      path += *p;
    }
  }
  FILE* f = fopen(path.c_str(), "w");
  if (f) setvbuf(f, nullptr, _IOLBF, 1024);
  return f ? f : stderr;
}

void initLocked(LogState& s) {
  if (s.init) return;
  const char* lvl = getenv("NCCL_DEBUG");
  s.level = kLogNone;
  if (lvl) {
    if (strcasecmp(lvl, "VERSION") == 0)
      s.level = kLogVersion;
    else if (strcasecmp(lvl, "WARN") == 0)
      s.level = kLogWarn;
    else if (strcasecmp(lvl, "INFO") == 0)
      s.level = kLogInfo;
    else if (strcasecmp(lvl, "ABORT") == 0)
      s.level = kLogAbort;
    else if (strcasecmp(lvl, "TRACE") == 0)
      s.level = kLogTrace;
  }
  s.mask = parseSubsys(getenv("NCCL_DEBUG_SUBSYS"));
  gethostname(s.host, sizeof(s.host) - 1);
  char* dot = strchr(s.host, '.');
  if (dot) *dot = '\0';
  if (s.file != stderr && s.file != nullptr) fclose(s.file);
  s.file = stderr;
  const char* file = getenv("NCCL_DEBUG_FILE");
  if (file && *file && s.level > kLogNone) s.file = openDebugFile(file, s.host);
  s.init = true;
}

}  // namespace

int logLevel() {
  LogState& s = state();
  if (!__atomic_load_n(&s.init, __ATOMIC_ACQUIRE)) {
    std::lock_guard<std::mutex> g(s.mu);
    initLocked(s);
  }
  return s.level;
}

bool logEnabled(int level, uint64_t subsys) {
  if (logLevel() < level) return false;
  return level <= kLogWarn || (state().mask & subsys) != 0;
}

void logReset() {
  LogState& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  s.init = false;
  initLocked(s);
}

void logSetThreadDevice(int dev) {
  tlsDevice = dev;
}

namespace {

int64_t monotonicMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void emit(int level, uint64_t subsys, const char* file, int line, const char* msg,
          bool record = true) {
  LogState& s = state();
  int cur = logLevel();
  std::lock_guard<std::mutex> g(s.mu);
  if (level == kLogWarn && record) s.lastError = msg;  // recorded whether or not it is printed
  if (cur < level) return;
  if (level > kLogWarn && (s.mask & subsys) == 0) return;
  const char* name = level == kLogWarn ? "WARN" : level == kLogTrace ? "TRACE" : "INFO";
  long tid = syscall(SYS_gettid);
  char dev[16];
  if (tlsDevice >= 0)
    snprintf(dev, sizeof(dev), "%d", tlsDevice);
  else
    snprintf(dev, sizeof(dev), "-");
  if (level == kLogWarn)
    fprintf(s.file, "%s:%d:%ld [%s] mkernel WARN %s:%d %s\n", s.host, getpid(), tid, dev,
            strrchr(file, '/') ? strrchr(file, '/') + 1 : file, line, msg);
  else
    fprintf(s.file, "%s:%d:%ld [%s] mkernel %s %s\n", s.host, getpid(), tid, dev, name, msg);
  fflush(s.file);
}

}  // namespace

namespace {
void emitV(int level, uint64_t subsys, const char* file, int line, bool record, const char* fmt,
           va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  emit(level, subsys, file, line, msg, record);
}
}  // namespace

void logMessage(int level, uint64_t subsys, const char* file, int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emitV(level, subsys, file, line, true, fmt, ap);
  va_end(ap);
}

void logAdvisory(const char* file, int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emitV(kLogWarn, kAllSubsys, file, line, false, fmt, ap);
  va_end(ap);
}

void logMessageLimited(LogRateLimit* rl, int64_t intervalMs, int level, uint64_t subsys,
                       const char* file, int line, const char* fmt, ...) {
  // One winner per interval, decided by a CAS so that concurrent callers neither both print
  // nor both stay silent; everyone else only bumps the counter.
  int64_t now = monotonicMs();
  int64_t next = rl->nextMs.load(std::memory_order_relaxed);
  if (now < next || !rl->nextMs.compare_exchange_strong(next, now + intervalMs)) {
    rl->suppressed.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  uint64_t dropped = rl->suppressed.exchange(0, std::memory_order_relaxed);
  if (dropped > 0 && n >= 0 && (size_t)n < sizeof(msg))
    snprintf(msg + n, sizeof(msg) - n, " (suppressed %llu similar messages)",
             (unsigned long long)dropped);
  emit(level, subsys, file, line, msg);
}

const char* lastError() {
  LogState& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  snprintf(tlsLastError, sizeof(tlsLastError), "%s", s.lastError.c_str());
  return tlsLastError;
}

void setLastError(const char* msg) {
  LogState& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  s.lastError = msg ? msg : "";
}

void logVersionBanner() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (logLevel() >= kLogVersion) {
      LogState& s = state();
      std::lock_guard<std::mutex> g(s.mu);
      fprintf(s.file, "%s:%d:%ld [%d] mkernel INFO mkernel version %s (NCCL API %d.%d.%d)\n",
              s.host, getpid(), (long)syscall(SYS_gettid), tlsDevice, MKERNEL_VERSION_STRING,
              NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
      fflush(s.file);
    }
  });
}

}  // namespace mk
