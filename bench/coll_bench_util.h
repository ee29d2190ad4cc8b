// Small helpers of coll_bench: error checks, statistics, a watchdog, a JSON writer, run metadata.
#pragma once

#include <cuda_runtime.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

namespace collbench {

#define CB_CUDA(cmd)                                                                         \
  do {                                                                                       \
    cudaError_t e_ = (cmd);                                                                  \
    if (e_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "coll_bench: FAIL CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), \
              __FILE__, __LINE__, #cmd);                                                     \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

// Calls an NCCL function through an NcclApi; on error prints the library, call and message.
#define CB_NCCL(api, cmd)                                                                      \
  do {                                                                                         \
    ncclResult_t r_ = (cmd);                                                                   \
    if (r_ != ncclSuccess) {                                                                   \
      fprintf(stderr, "coll_bench: FAIL [%s] %s returned %d (%s) at %s:%d; last error: %s\n",  \
              (api).name.c_str(), #cmd, static_cast<int>(r_), (api).errorString(r_), __FILE__, \
              __LINE__, (api).lastError());                                                    \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

inline double nowUs() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// q-quantile (0..1) of samples, by nearest rank after sorting; NaN when empty.
inline double quantile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::lround(q * (v.size() - 1)));
  return v[std::min(i, v.size() - 1)];
}
inline double median(const std::vector<double>& v) {
  return quantile(v, 0.5);
}

// Watchdog: a hang in a collective ends the process with a message naming the phase.
inline const char*& watchdogPhase() {
  static const char* phase = "start";
  return phase;
}
inline void onAlarm(int) {
  const char* p = watchdogPhase();
  char msg[256];
  int n = snprintf(msg, sizeof(msg), "\ncoll_bench: FAIL watchdog timeout during: %s\n", p);
  if (n > 0) (void)!write(2, msg, static_cast<size_t>(std::min(n, 255)));
  _exit(3);
}
inline void armWatchdog(int seconds) {
  signal(SIGALRM, onAlarm);
  alarm(static_cast<unsigned>(seconds));
}
inline void setPhase(const char* p) {
  watchdogPhase() = p;
}

inline std::string runCommand(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return out;
  char buf[512];
  while (fgets(buf, sizeof(buf), f) != nullptr) out += buf;
  pclose(f);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

inline std::string dirName(const std::string& p) {
  size_t i = p.find_last_of('/');
  return i == std::string::npos ? std::string(".") : p.substr(0, i);
}

// The commit a benchmark records, as bench_common.sh and bench_py_util.py find it:
// MK_BENCH_COMMIT (binaries built elsewhere carry the commit they were built at), else the
// source tree's COMMIT_SNAP (a `git archive` snapshot unpacked inside another checkout, as the
// GPU scripts' .snap/: git there would name the enclosing checkout's HEAD), else git's HEAD,
// else "unknown". `dirty`: uncommitted changes (git), or "-dirty" in MK_BENCH_COMMIT.
inline std::string benchCommit(const std::string& benchDir, bool* dirty) {
  *dirty = false;
  if (const char* e = getenv("MK_BENCH_COMMIT")) {
    *dirty = std::string(e).find("-dirty") != std::string::npos;
    return e;
  }
  std::ifstream snap(benchDir + "/../COMMIT_SNAP");
  std::string c;
  if (snap && std::getline(snap, c) && !c.empty()) return c + " (COMMIT_SNAP)";
  c = runCommand("git -C '" + benchDir + "' rev-parse HEAD 2>/dev/null");
  if (c.empty()) return "unknown";
  *dirty = !runCommand("git -C '" + benchDir + "' status --porcelain 2>/dev/null").empty();
  return c;
}

inline bool makeDirs(const std::string& dir) {
  std::string cur;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!cur.empty()) mkdir(cur.c_str(), 0775);
    }
    if (i < dir.size()) cur += dir[i];
  }
  struct stat st;
  return stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

inline std::string timeStamp(const char* fmt) {
  char buf[64];
  time_t t = time(nullptr);
  struct tm tmv;
  localtime_r(&t, &tmv);
  strftime(buf, sizeof(buf), fmt, &tmv);
  return buf;
}

// Minimal JSON writer: the caller emits keys and values in order; commas are handled here.
class Json {
 public:
  Json& beginObject(const char* key = nullptr) { return open(key, '{'); }
  Json& endObject() { return close('}'); }
  Json& beginArray(const char* key = nullptr) { return open(key, '['); }
  Json& endArray() { return close(']'); }
  Json& str(const char* key, const std::string& v) {
    prefix(key);
    out_ += quote(v);
    return *this;
  }
  Json& num(const char* key, double v) {
    prefix(key);
    if (std::isfinite(v)) {
      char b[64];
      snprintf(b, sizeof(b), "%.6g", v);
      out_ += b;
    } else {
      out_ += "null";
    }
    return *this;
  }
  Json& integer(const char* key, long long v) {
    prefix(key);
    out_ += std::to_string(v);
    return *this;
  }
  Json& boolean(const char* key, bool v) {
    prefix(key);
    out_ += v ? "true" : "false";
    return *this;
  }
  Json& null(const char* key) {
    prefix(key);
    out_ += "null";
    return *this;
  }
  const std::string& text() const { return out_; }

 private:
  Json& open(const char* key, char c) {
    prefix(key);
    out_ += c;
    first_.push_back(true);
    return *this;
  }
  Json& close(char c) {
    first_.pop_back();
    out_ += '\n' + std::string(2 * first_.size(), ' ') + c;
    return *this;
  }
  void prefix(const char* key) {
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
      out_ += '\n' + std::string(2 * first_.size(), ' ');
    }
    if (key != nullptr) out_ += quote(key) + ": ";
  }
  static std::string quote(const std::string& s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') {
        q += '\\';
        q += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char b[8];
        snprintf(b, sizeof(b), "\\u%04x", c);
        q += b;
      } else {
        q += c;
      }
    }
    return q + "\"";
  }
  std::string out_;
  std::vector<bool> first_;
};

}  // namespace collbench
