// One process per rank on one GPU, against any NCCL-API library (libmkernel.so or the real
// libnccl.so.2) that each rank loads with dlopen: the parent forks the ranks before touching
// CUDA and never loads the library. Shared by bench/net_procs_bench.cu (collectives) and
// bench/fused_procs_bench.cu (fused GEMM + collective against cuBLAS + the collective).
// Every wait is bounded by the run's budget (--timeout-s); a rank that fails records which
// phase and why, and the others stop at their next barrier or stream wait.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

namespace procs {

constexpr int kMaxRanks = 16;

inline double nowSec() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The harness's part of the shared memory (MAP_SHARED | MAP_ANONYMOUS, created before fork).
struct Control {
  ncclUniqueId id;
  volatile int idReady;
  volatile int abort;
  volatile unsigned barrierCount, barrierGen;
  char phase[kMaxRanks][96];
  char error[kMaxRanks][512];
  char version[64];
};
inline Control* g = nullptr;
inline int gRank = -1, gN = 0;
inline double gTimeoutS = 240;
inline double gStart = 0;
inline const char* gTool = "procs_bench";  // prefix of every message

inline void setPhase(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void setPhase(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->phase[gRank], sizeof(g->phase[gRank]), fmt, ap);
  va_end(ap);
}

[[noreturn]] inline void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] inline void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->error[gRank], sizeof(g->error[gRank]), fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s: rank %d: %s (phase: %s)\n", gTool, gRank, g->error[gRank], g->phase[gRank]);
  g->abort = 1;
  _exit(3);
}

inline bool expired() {
  return nowSec() - gStart > gTimeoutS;
}

inline void barrier() {
  unsigned gen = __atomic_load_n(&g->barrierGen, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&g->barrierCount, 1u, __ATOMIC_ACQ_REL) == (unsigned)gN) {
    __atomic_store_n(&g->barrierCount, 0u, __ATOMIC_RELAXED);
    __atomic_store_n(&g->barrierGen, gen + 1, __ATOMIC_RELEASE);
    return;
  }
  while (__atomic_load_n(&g->barrierGen, __ATOMIC_ACQUIRE) == gen) {
    if (g->abort) fail("another rank failed");
    if (expired()) fail("barrier timed out");
    sched_yield();
  }
}

#define CK(call)                                                          \
  do {                                                                    \
    cudaError_t e_ = (call);                                              \
    if (e_ != cudaSuccess) fail("%s: %s", #call, cudaGetErrorString(e_)); \
  } while (0)

// ---- the library under test ------------------------------------------------------------
struct Api {
  void* handle = nullptr;
  decltype(&ncclGetVersion) getVersion;
  decltype(&ncclGetUniqueId) getUniqueId;
  decltype(&ncclCommInitRank) commInitRank;
  decltype(&ncclCommDestroy) commDestroy;
  decltype(&ncclCommAbort) commAbort;
  decltype(&ncclCommGetAsyncError) getAsyncError;
  decltype(&ncclGetErrorString) getErrorString;
  decltype(&ncclGetLastError) getLastError;
  decltype(&ncclAllReduce) allReduce;
  decltype(&ncclAllGather) allGather;
  decltype(&ncclReduceScatter) reduceScatter;
  decltype(&ncclSend) send;
  decltype(&ncclRecv) recv;
  decltype(&ncclGroupStart) groupStart;
  decltype(&ncclGroupEnd) groupEnd;
};
inline Api api;

inline void loadApi(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) fail("dlopen(%s): %s", path, dlerror());
  api.handle = h;
  auto sym = [&](const char* name) {
    void* p = dlsym(h, name);
    if (!p) fail("%s has no symbol %s", path, name);
    return p;
  };
#define SYM(field, name) api.field = reinterpret_cast<decltype(api.field)>(sym(name))
  SYM(getVersion, "ncclGetVersion");
  SYM(getUniqueId, "ncclGetUniqueId");
  SYM(commInitRank, "ncclCommInitRank");
  SYM(commDestroy, "ncclCommDestroy");
  SYM(commAbort, "ncclCommAbort");
  SYM(getAsyncError, "ncclCommGetAsyncError");
  SYM(getErrorString, "ncclGetErrorString");
  SYM(getLastError, "ncclGetLastError");
  SYM(allReduce, "ncclAllReduce");
  SYM(allGather, "ncclAllGather");
  SYM(reduceScatter, "ncclReduceScatter");
  SYM(send, "ncclSend");
  SYM(recv, "ncclRecv");
  SYM(groupStart, "ncclGroupStart");
  SYM(groupEnd, "ncclGroupEnd");
#undef SYM
}

#define NK(call)                                                                     \
  do {                                                                               \
    ncclResult_t r_ = (call);                                                        \
    if (r_ != ncclSuccess && r_ != ncclInProgress)                                   \
      fail("%s: %s (%s)", #call, api.getErrorString(r_), api.getLastError(nullptr)); \
  } while (0)

// Waits for the stream as nccl-tests does: poll, check the comm's async error, yield.
inline void waitStream(cudaStream_t s, ncclComm_t comm) {
  for (int spin = 0;; spin++) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) fail("cudaStreamQuery: %s", cudaGetErrorString(e));
    if ((spin & 255) == 0) {
      ncclResult_t ae = ncclSuccess;
      NK(api.getAsyncError(comm, &ae));
      if (ae != ncclSuccess && ae != ncclInProgress)
        fail("async error %s: %s", api.getErrorString(ae), api.getLastError(comm));
      if (g->abort) {
        api.commAbort(comm);
        fail("another rank failed");
      }
      if (expired()) {
        api.commAbort(comm);
        fail("operation not complete after the %.0f s budget", gTimeoutS);
      }
    }
    sched_yield();
  }
}

// --rank-env values: %r is the rank, %n its node (rank / ranks-per-node).
inline std::string subst(const std::string& v, int rank, int node) {
  std::string o;
  for (size_t i = 0; i < v.size(); i++) {
    if (v[i] == '%' && i + 1 < v.size() && (v[i + 1] == 'r' || v[i + 1] == 'n')) {
      o += std::to_string(v[i + 1] == 'r' ? rank : node);
      i++;
    } else {
      o += v[i];
    }
  }
  return o;
}

// In a rank, before the library is loaded: its environment and CPU binding.
inline void setupRank(const std::vector<std::string>& rankEnv, int ranksPerNode,
                      const std::vector<int>& bindCpus) {
  const int node = gRank / ranksPerNode;
  for (const std::string& kv : rankEnv) {
    size_t eq = kv.find('=');
    setenv(kv.substr(0, eq).c_str(), subst(kv.substr(eq + 1), gRank, node).c_str(), 1);
  }
  if (!bindCpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(bindCpus[gRank % bindCpus.size()], &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
      fail("cannot bind to CPU %d", bindCpus[gRank % bindCpus.size()]);
  }
}

// Rank 0 makes the unique id (and records the library's version); every rank joins.
inline ncclComm_t initComm() {
  setPhase("ncclGetUniqueId / ncclCommInitRank");
  if (gRank == 0) {
    int v = 0;
    NK(api.getVersion(&v));
    snprintf(g->version, sizeof(g->version), "%d", v);
    NK(api.getUniqueId(&g->id));
    __atomic_store_n(&g->idReady, 1, __ATOMIC_RELEASE);
  }
  while (!__atomic_load_n(&g->idReady, __ATOMIC_ACQUIRE)) {
    if (g->abort) fail("another rank failed");
    if (expired()) fail("no unique id from rank 0");
    usleep(1000);
  }
  ncclComm_t comm = nullptr;
  NK(api.commInitRank(&comm, gN, g->id, gRank));
  return comm;
}

// Maps the shared memory: the Control block, then `payloadBytes` for the benchmark (zeroed).
// Returns the payload.
inline void* mapShared(size_t payloadBytes) {
  const size_t bytes = sizeof(Control) + payloadBytes;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return nullptr;
  memset(mem, 0, bytes);
  g = static_cast<Control*>(mem);
  return static_cast<char*>(mem) + sizeof(Control);
}

// Forks nprocs ranks running rankMain(rank) and waits, bounded: a rank that fails or hangs
// past the budget (+30 s) ends the run. Prints each failed rank's phase and error. Returns
// true when every rank exited 0.
inline bool runRanks(int nprocs, double timeoutS, const std::function<void()>& rankMain) {
  gN = nprocs;
  gTimeoutS = timeoutS;
  gStart = nowSec();
  fflush(stdout);
  fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < nprocs; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "%s: fork failed\n", gTool);
      g->abort = 1;
      break;
    }
    if (pid == 0) {
      gRank = r;
      rankMain();
      fflush(stdout);
      _exit(0);
    }
    pids.push_back(pid);
  }
  const int started = (int)pids.size();
  std::vector<int> status(started, -1);
  int left = started;
  bool killed = false;
  while (left > 0) {
    for (int r = 0; r < started; r++) {
      if (status[r] != -1) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = st;
        left--;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) g->abort = 1;
      }
    }
    if (left && !killed && nowSec() - gStart > timeoutS + 30) {
      fprintf(stderr, "%s: ranks still running after %.0f s; killing them\n", gTool, timeoutS + 30);
      for (int r = 0; r < started; r++)
        if (status[r] == -1) {
          fprintf(stderr, "%s:   rank %d was in phase: %s\n", gTool, r, g->phase[r]);
          kill(pids[r], SIGKILL);
        }
      killed = true;
    }
    usleep(20000);
  }
  bool ok = started == nprocs;
  for (int r = 0; r < started; r++) {
    const int st = status[r];
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
    ok = false;
    if (WIFSIGNALED(st))
      fprintf(stderr, "%s: rank %d died of signal %d in phase: %s\n", gTool, r, WTERMSIG(st),
              g->phase[r]);
    else
      fprintf(stderr, "%s: rank %d exited with %d in phase: %s%s%s\n", gTool, r, WEXITSTATUS(st),
              g->phase[r], g->error[r][0] ? ": " : "", g->error[r]);
  }
  return ok;
}

// Numbers in a comma list, with K/M suffixes (x 2^10, 2^20).
inline std::vector<uint64_t> parseList(const char* s) {
  std::vector<uint64_t> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    uint64_t x = strtoull(p, &end, 10);
    if (end == p) break;
    if (*end == 'K' || *end == 'k') x <<= 10, end++;
    if (*end == 'M' || *end == 'm') x <<= 20, end++;
    v.push_back(x);
    p = *end == ',' ? end + 1 : end;
  }
  return v;
}

inline std::string jsonEsc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if ((unsigned char)c < 0x20) continue;
    o += c;
  }
  return o;
}

}  // namespace procs
