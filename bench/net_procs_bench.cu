// One process per rank on one GPU, the layout of multi-node jobs, against any NCCL-API
// library: libmkernel.so or the real libnccl.so.2, loaded with dlopen by each rank (the
// parent never loads it and never touches CUDA, so forking is safe). nccl-tests' timing:
// per size, warm-up, then `iters` calls issued back to back on one stream, one host timer
// around issue + completion, divided by iters; averaged over ranks (max reported too).
//   sendrecv:  each rank sends to rank+1 and receives from rank-1 in one group (busbw = algbw)
//   allreduce: float sum, out of place (busbw = algbw * 2(n-1)/n)
// Every size is checked once (fresh inputs, poisoned outputs, every element compared)
// before it is timed. The unique id travels through shared memory; so do the barrier and
// the results. --pingpong first measures a GPU flag ping-pong between the first two ranks
// (CUDA IPC): microseconds when their kernels run concurrently (MPS), milliseconds when the
// GPU time-slices the processes.
//   bench_net_procs_bench --lib PATH --nprocs N [--ops sendrecv,allreduce]
//       [--lat-sizes 8,64,...] [--bw-sizes 8388608,...] [--lat-iters 200] [--bw-iters 10]
//       [--warmup 5] [--rank-env NAME=VALUE]... (%r: rank, %n: node, with --ranks-per-node)
//       [--ranks-per-node K] [--bind-cpus c0,c1,...] [--pingpong] [--label TEXT]
//       [--out file.json] [--timeout-s 240]
// Exit status 0 only if every rank finished and every check passed; a failure prints
// which rank, which phase and why.
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

namespace {

constexpr int kMaxRanks = 16;
constexpr int kMaxResults = 64;

double nowSec() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- shared state (MAP_SHARED | MAP_ANONYMOUS, created before fork) -----------------------
struct Result {
  char op[16];
  uint64_t bytes;
  int iters;
  double us[kMaxRanks];       // per rank: time per call
  double issueUs[kMaxRanks];  // per rank: host time to issue one call
  int wrong[kMaxRanks];       // elements that failed the check
};
struct Shared {
  ncclUniqueId id;
  volatile int idReady;
  volatile int abort;
  volatile unsigned barrierCount, barrierGen;
  char phase[kMaxRanks][96];
  char error[kMaxRanks][512];
  int nResults;
  Result results[kMaxResults];
  double pingUs;
  char version[64];
};
Shared* g = nullptr;
int gRank = -1, gN = 0;
double gTimeoutS = 240;
double gStart = 0;

void setPhase(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void setPhase(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->phase[gRank], sizeof(g->phase[gRank]), fmt, ap);
  va_end(ap);
}

[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->error[gRank], sizeof(g->error[gRank]), fmt, ap);
  va_end(ap);
  fprintf(stderr, "net_procs_bench: rank %d: %s (phase: %s)\n", gRank, g->error[gRank],
          g->phase[gRank]);
  g->abort = 1;
  _exit(3);
}

bool expired() {
  return nowSec() - gStart > gTimeoutS;
}

void barrier() {
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
  decltype(&ncclGetVersion) getVersion;
  decltype(&ncclGetUniqueId) getUniqueId;
  decltype(&ncclCommInitRank) commInitRank;
  decltype(&ncclCommDestroy) commDestroy;
  decltype(&ncclCommAbort) commAbort;
  decltype(&ncclCommGetAsyncError) getAsyncError;
  decltype(&ncclGetErrorString) getErrorString;
  decltype(&ncclGetLastError) getLastError;
  decltype(&ncclAllReduce) allReduce;
  decltype(&ncclSend) send;
  decltype(&ncclRecv) recv;
  decltype(&ncclGroupStart) groupStart;
  decltype(&ncclGroupEnd) groupEnd;
} api;

void loadApi(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) fail("dlopen(%s): %s", path, dlerror());
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
void waitStream(cudaStream_t s, ncclComm_t comm) {
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

struct Bufs {
  float* send = nullptr;
  float* recv = nullptr;
  size_t cap = 0;
};

void issue(const std::string& op, const Bufs& b, size_t count, ncclComm_t comm, cudaStream_t s) {
  if (op == "allreduce") {
    NK(api.allReduce(b.send, b.recv, count, ncclFloat32, ncclSum, comm, s));
  } else {
    NK(api.groupStart());
    NK(api.send(b.send, count, ncclFloat32, (gRank + 1) % gN, comm, s));
    NK(api.recv(b.recv, count, ncclFloat32, (gRank - 1 + gN) % gN, comm, s));
    NK(api.groupEnd());
  }
}

float inputOf(int rank, size_t i, uint32_t salt) {
  return (float)((rank + 1) * 3 + (int)((i * 2654435761u + salt) % 61));
}

// Fresh input, poisoned output, one call, every element compared. Returns wrong elements.
int checkOnce(const std::string& op, const Bufs& b, size_t count, ncclComm_t comm, cudaStream_t s,
              uint32_t salt) {
  std::vector<float> h(count);
  for (size_t i = 0; i < count; i++) h[i] = inputOf(gRank, i, salt);
  CK(cudaMemcpy(b.send, h.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  CK(cudaMemset(b.recv, 0xff, count * sizeof(float)));  // NaN poison
  CK(cudaDeviceSynchronize());
  barrier();
  issue(op, b, count, comm, s);
  waitStream(s, comm);
  CK(cudaMemcpy(h.data(), b.recv, count * sizeof(float), cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (size_t i = 0; i < count; i++) {
    float want;
    if (op == "allreduce") {
      want = 0;
      for (int r = 0; r < gN; r++) want += inputOf(r, i, salt);
    } else {
      want = inputOf((gRank - 1 + gN) % gN, i, salt);
    }
    if (h[i] != want && wrong++ < 3)
      fprintf(stderr, "net_procs_bench: rank %d %s count %zu: element %zu is %g, expected %g\n",
              gRank, op.c_str(), count, i, h[i], want);
  }
  return wrong;
}

// ---- GPU ping-pong between ranks 0 and 1 (CUDA IPC flags) -------------------------------
__global__ void pingKernel(volatile unsigned long long* flags, int me, int iters,
                           unsigned long long timeoutNs, unsigned long long* outNs) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (int i = 1; i <= iters; i++) {
    if (me == 0) {
      flags[0] = i;
      __threadfence_system();
    }
    volatile unsigned long long* wait = &flags[me == 0 ? 1 : 0];
    while (*wait < (unsigned long long)i) {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      if (t - t0 > timeoutNs) {
        *outNs = ~0ull;
        return;
      }
    }
    if (me == 1) {
      flags[1] = i;
      __threadfence_system();
    }
  }
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  *outNs = t - t0;
}

struct PingShared {
  cudaIpcMemHandle_t h;
  volatile int failed;
};

// A diagnostic: when CUDA IPC is refused (pingUs = -2) the benchmark goes on without it.
void pingPong(PingShared* ps) {
  setPhase("GPU ping-pong (CUDA IPC)");
  unsigned long long* flags = nullptr;
  if (gRank == 0) {
    CK(cudaMalloc(&flags, 2 * sizeof(unsigned long long)));
    CK(cudaMemset(flags, 0, 2 * sizeof(unsigned long long)));
    CK(cudaDeviceSynchronize());
    if (cudaIpcGetMemHandle(&ps->h, flags) != cudaSuccess) {
      fprintf(stderr, "net_procs_bench: ping-pong skipped: cudaIpcGetMemHandle: %s\n",
              cudaGetErrorString(cudaGetLastError()));
      ps->failed = 1;
    }
  }
  barrier();
  if (gRank == 1 && !ps->failed &&
      cudaIpcOpenMemHandle((void**)&flags, ps->h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
    fprintf(stderr, "net_procs_bench: ping-pong skipped: cudaIpcOpenMemHandle: %s\n",
            cudaGetErrorString(cudaGetLastError()));
    ps->failed = 1;
  }
  barrier();
  if (gRank <= 1 && !ps->failed) {
    unsigned long long* out = nullptr;
    CK(cudaMallocHost(&out, sizeof(*out)));
    const int iters = 1000;  // ~5 s when the GPU time-slices the two processes
    pingKernel<<<1, 1>>>(flags, gRank, iters, 20ull * 1000 * 1000 * 1000, out);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    if (gRank == 0) g->pingUs = *out == ~0ull ? -1 : (double)*out / 1000.0 / iters;
    CK(cudaFreeHost(out));
  }
  if (gRank == 0 && ps->failed) g->pingUs = -2;
  barrier();
  if (gRank == 1 && flags) CK(cudaIpcCloseMemHandle(flags));
  if (gRank == 0) CK(cudaFree(flags));
}

// ---- one rank -------------------------------------------------------------------------
struct Opts {
  std::string lib, label, out;
  int nprocs = 2, ranksPerNode = 1;
  std::vector<std::string> ops = {"sendrecv", "allreduce"};
  std::vector<uint64_t> latSizes = {8, 64, 512, 4096, 32768, 65536};
  std::vector<uint64_t> bwSizes = {8u << 20, 32u << 20, 128u << 20, 256u << 20};
  int latIters = 200, bwIters = 10, warmup = 5;
  std::vector<std::string> rankEnv;
  std::vector<int> bindCpus;
  bool pingpong = false;
};

std::string subst(const std::string& v, int rank, int node) {
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

void rankMain(const Opts& o, PingShared* ps) {
  const int node = gRank / o.ranksPerNode;
  for (const std::string& kv : o.rankEnv) {
    size_t eq = kv.find('=');
    setenv(kv.substr(0, eq).c_str(), subst(kv.substr(eq + 1), gRank, node).c_str(), 1);
  }
  if (!o.bindCpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(o.bindCpus[gRank % o.bindCpus.size()], &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
      fail("cannot bind to CPU %d", o.bindCpus[gRank % o.bindCpus.size()]);
  }
  setPhase("loading %s", o.lib.c_str());
  loadApi(o.lib.c_str());
  setPhase("CUDA initialisation on device 0");
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  if (o.pingpong) pingPong(ps);
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
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint64_t maxBytes = 0;
  for (uint64_t b : o.latSizes) maxBytes = b > maxBytes ? b : maxBytes;
  for (uint64_t b : o.bwSizes) maxBytes = b > maxBytes ? b : maxBytes;
  Bufs bufs;
  bufs.cap = (maxBytes + 3) / 4;
  CK(cudaMalloc(&bufs.send, bufs.cap * sizeof(float)));
  CK(cudaMalloc(&bufs.recv, bufs.cap * sizeof(float)));
  int slot = 0;
  for (const std::string& op : o.ops) {
    std::vector<uint64_t> sizes = o.latSizes;
    sizes.insert(sizes.end(), o.bwSizes.begin(), o.bwSizes.end());
    for (uint64_t bytes : sizes) {
      const bool bw = bytes >= (1u << 20);
      const int iters = bw ? o.bwIters : o.latIters;
      const size_t count = (size_t)((bytes + 3) / 4);
      setPhase("%s %llu bytes: check", op.c_str(), (unsigned long long)bytes);
      Result& r = g->results[slot];
      if (gRank == 0) {
        snprintf(r.op, sizeof(r.op), "%s", op.c_str());
        r.bytes = count * 4;
        r.iters = iters;
        g->nResults = slot + 1;
      }
      r.wrong[gRank] = checkOnce(op, bufs, count, comm, s, (uint32_t)(slot * 7919 + 1));
      setPhase("%s %llu bytes: warm-up", op.c_str(), (unsigned long long)bytes);
      for (int i = 0; i < o.warmup; i++) issue(op, bufs, count, comm, s);
      waitStream(s, comm);
      setPhase("%s %llu bytes: %d timed calls", op.c_str(), (unsigned long long)bytes, iters);
      barrier();
      double t0 = nowSec();
      for (int i = 0; i < iters; i++) issue(op, bufs, count, comm, s);
      double t1 = nowSec();
      waitStream(s, comm);
      double t2 = nowSec();
      r.us[gRank] = (t2 - t0) * 1e6 / iters;
      r.issueUs[gRank] = (t1 - t0) * 1e6 / iters;
      slot++;
      if (slot == kMaxResults) fail("too many sizes (at most %d results)", kMaxResults);
    }
  }
  setPhase("teardown");
  barrier();
  CK(cudaFree(bufs.send));
  CK(cudaFree(bufs.recv));
  NK(api.commDestroy(comm));
  CK(cudaStreamDestroy(s));
  setPhase("done");
}

std::vector<uint64_t> parseList(const char* s) {
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

std::string jsonEsc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if ((unsigned char)c < 0x20) continue;
    o += c;
  }
  return o;
}

[[noreturn]] void usage(const char* why) {
  fprintf(stderr, "net_procs_bench: %s\n(see the comment at the top of bench/net_procs_bench.cu)\n",
          why);
  exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  double timeoutS = 240;
  std::string cmd;
  for (int i = 0; i < argc; i++) cmd += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--lib")
      o.lib = val();
    else if (a == "--nprocs")
      o.nprocs = atoi(val());
    else if (a == "--ranks-per-node")
      o.ranksPerNode = atoi(val());
    else if (a == "--ops") {
      o.ops.clear();
      std::string l = val();
      for (size_t p = 0; p <= l.size();) {
        size_t q = l.find(',', p);
        if (q == std::string::npos) q = l.size();
        if (q > p) o.ops.push_back(l.substr(p, q - p));
        p = q + 1;
      }
    } else if (a == "--lat-sizes")
      o.latSizes = parseList(val());
    else if (a == "--bw-sizes")
      o.bwSizes = parseList(val());
    else if (a == "--lat-iters")
      o.latIters = atoi(val());
    else if (a == "--bw-iters")
      o.bwIters = atoi(val());
    else if (a == "--warmup")
      o.warmup = atoi(val());
    else if (a == "--rank-env")
      o.rankEnv.push_back(val());
    else if (a == "--bind-cpus") {
      for (uint64_t c : parseList(val())) o.bindCpus.push_back((int)c);
    } else if (a == "--pingpong")
      o.pingpong = true;
    else if (a == "--label")
      o.label = val();
    else if (a == "--out")
      o.out = val();
    else if (a == "--timeout-s")
      timeoutS = atof(val());
    else
      usage(("unknown option " + a).c_str());
  }
  if (o.lib.empty()) usage("--lib is required");
  if (o.nprocs < 2 || o.nprocs > kMaxRanks) usage("--nprocs must be 2..16");
  if (o.ranksPerNode < 1) usage("--ranks-per-node must be >= 1");
  for (const std::string& op : o.ops)
    if (op != "sendrecv" && op != "allreduce") usage(("unknown op " + op).c_str());
  for (const std::string& kv : o.rankEnv)
    if (kv.find('=') == std::string::npos || kv[0] == '=') usage("--rank-env takes NAME=VALUE");
  if ((o.latSizes.size() + o.bwSizes.size()) * o.ops.size() > (size_t)kMaxResults)
    usage("too many sizes");

  void* mem = mmap(nullptr, sizeof(Shared) + sizeof(PingShared), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) usage("mmap failed");
  memset(mem, 0, sizeof(Shared) + sizeof(PingShared));
  g = static_cast<Shared*>(mem);
  PingShared* ps = reinterpret_cast<PingShared*>(g + 1);
  gN = o.nprocs;
  gTimeoutS = timeoutS;
  gStart = nowSec();
  fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < o.nprocs; r++) {
    pid_t pid = fork();
    if (pid < 0) usage("fork failed");
    if (pid == 0) {
      gRank = r;
      rankMain(o, ps);
      _exit(0);
    }
    pids.push_back(pid);
  }
  // Parent: wait for every rank, bounded; a rank that fails or hangs ends the run.
  std::vector<int> status(o.nprocs, -1);
  int left = o.nprocs;
  bool killed = false;
  while (left > 0) {
    for (int r = 0; r < o.nprocs; r++) {
      if (status[r] != -1) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = st;
        left--;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) g->abort = 1;
      }
    }
    if (left && !killed && nowSec() - gStart > timeoutS + 30) {
      fprintf(stderr, "net_procs_bench: ranks still running after %.0f s; killing them\n",
              timeoutS + 30);
      for (int r = 0; r < o.nprocs; r++)
        if (status[r] == -1) {
          fprintf(stderr, "net_procs_bench:   rank %d was in phase: %s\n", r, g->phase[r]);
          kill(pids[r], SIGKILL);
        }
      killed = true;
    }
    usleep(20000);
  }
  bool ok = true;
  for (int r = 0; r < o.nprocs; r++) {
    const int st = status[r];
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
    ok = false;
    if (WIFSIGNALED(st))
      fprintf(stderr, "net_procs_bench: rank %d died of signal %d in phase: %s\n", r, WTERMSIG(st),
              g->phase[r]);
    else
      fprintf(stderr, "net_procs_bench: rank %d exited with %d in phase: %s%s%s\n", r,
              WEXITSTATUS(st), g->phase[r], g->error[r][0] ? ": " : "", g->error[r]);
  }
  // Report (what completed, even after a failure).
  printf("# %s: %d processes, library %s (version %s)\n", o.label.c_str(), o.nprocs, o.lib.c_str(),
         g->version);
  if (o.pingpong)
    printf("# GPU flag ping-pong between ranks 0 and 1: %.2f us per round trip%s\n", g->pingUs,
           g->pingUs == -1   ? " (timed out: kernels of the processes did not run concurrently)"
           : g->pingUs == -2 ? " (skipped: CUDA IPC refused)"
                             : "");
  printf("# %-9s %12s %6s %12s %12s %12s %10s %10s %6s\n", "op", "bytes", "iters", "time_us",
         "max_us", "issue_us", "algbw", "busbw", "wrong");
  std::string json = "{\"label\": \"" + jsonEsc(o.label) + "\", \"command\": \"" + jsonEsc(cmd) +
                     "\", \"library\": \"" + jsonEsc(o.lib) + "\", \"version\": \"" + g->version +
                     "\", \"nprocs\": " + std::to_string(o.nprocs) +
                     ", \"ranks_per_node\": " + std::to_string(o.ranksPerNode) +
                     ", \"ok\": " + (ok ? "true" : "false") +
                     ", \"pingpong_us\": " + std::to_string(o.pingpong ? g->pingUs : 0) +
                     ", \"results\": [";
  int totalWrong = 0;
  for (int i = 0; i < g->nResults; i++) {
    const Result& r = g->results[i];
    double sum = 0, mx = 0, issue = 0;
    int wrong = 0, have = 0;
    for (int k = 0; k < o.nprocs; k++) {
      if (r.us[k] <= 0) continue;
      have++;
      sum += r.us[k];
      issue += r.issueUs[k];
      mx = r.us[k] > mx ? r.us[k] : mx;
      wrong += r.wrong[k];
    }
    if (have != o.nprocs) continue;  // incomplete (a rank failed during it)
    totalWrong += wrong;
    const double us = sum / have;
    const double algbw = (double)r.bytes / us / 1e3;  // GB/s
    const double factor = strcmp(r.op, "allreduce") == 0 ? 2.0 * (o.nprocs - 1) / o.nprocs : 1.0;
    printf("  %-9s %12llu %6d %12.2f %12.2f %12.2f %10.3f %10.3f %6d\n", r.op,
           (unsigned long long)r.bytes, r.iters, us, mx, issue / have, algbw, algbw * factor,
           wrong);
    char buf[400];
    snprintf(buf, sizeof(buf),
             "%s{\"op\": \"%s\", \"bytes\": %llu, \"iters\": %d, \"time_us\": %.3f, \"max_us\": "
             "%.3f, \"issue_us\": %.3f, \"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f, \"wrong\": %d}",
             i ? ", " : "", r.op, (unsigned long long)r.bytes, r.iters, us, mx, issue / have, algbw,
             algbw * factor, wrong);
    json += buf;
  }
  json += "]}\n";
  if (totalWrong) {
    ok = false;
    fprintf(stderr, "net_procs_bench: %d wrong elements\n", totalWrong);
  }
  if (!o.out.empty()) {
    FILE* f = fopen(o.out.c_str(), "w");
    if (!f || fputs(json.c_str(), f) < 0) {
      fprintf(stderr, "net_procs_bench: cannot write %s\n", o.out.c_str());
      ok = false;
    }
    if (f) fclose(f);
  }
  return ok ? 0 : 1;
}
