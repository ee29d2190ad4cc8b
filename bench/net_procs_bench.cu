// One process per rank on one GPU, the layout of multi-node jobs, against any NCCL-API
// library: libmkernel.so or the real libnccl.so.2, loaded with dlopen by each rank (the
// parent never loads it and never touches CUDA, so forking is safe). nccl-tests' timing:
// per size, warm-up, then `iters` calls issued back to back on one stream, one host timer
// around issue + completion, divided by iters; averaged over ranks (max reported too).
//   sendrecv:  each rank sends to rank+1 and receives from rank-1 in one group (busbw = algbw)
//   allreduce: float sum, out of place (busbw = algbw * 2(n-1)/n)
//   reducescatter: float sum, out of place; the size is each rank's input, as nccl-tests
//              counts it (rounded down to a multiple of n elements, at least n; busbw =
//              algbw * (n-1)/n)
// Every size is checked once (fresh inputs, poisoned outputs, every element compared)
// before it is timed. The unique id travels through shared memory; so do the barrier and
// the results. --pingpong first measures a GPU flag ping-pong between the first two ranks
// (CUDA IPC): microseconds when their kernels run concurrently (MPS), milliseconds when the
// GPU time-slices the processes.
//   bench_net_procs_bench --lib PATH --nprocs N [--ops sendrecv,allreduce,reducescatter]
//       [--lat-sizes 8,64,...] [--bw-sizes 8388608,...] [--lat-iters 200] [--bw-iters 10]
//       [--warmup 5] [--warmup-first 0] [--rank-env NAME=VALUE]... (%r: rank, %n: node,
//       with --ranks-per-node)
//       [--ranks-per-node K] [--bind-cpus c0,c1,...] [--pingpong] [--label TEXT]
//       [--out file.json] [--timeout-s 240]
// Latency sizes (below 1 MiB) are also timed in halves (one stream wait between them:
// first_half_us, second_half_us): a slow first half says the start of the run was slow (a
// transient after setup or after the bulk phase of the op before), not the size.
// --warmup-first N adds N untimed calls to the first size of each op.
// Exit status 0 only if every rank finished and every check passed; a failure prints
// which rank, which phase and why.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "procs_harness.h"
#include "bench_args.h"

using namespace procs;  // NOLINT: the process harness (barrier, fail, api, ...)

namespace {

constexpr int kMaxResults = 64;

// ---- shared state (MAP_SHARED | MAP_ANONYMOUS, created before fork) -----------------------
struct Result {
  char op[16];
  uint64_t bytes;
  int iters;
  double us[kMaxRanks];         // per rank: time per call
  double issueUs[kMaxRanks];    // per rank: host time to issue one call
  int wrong[kMaxRanks];         // elements that failed the check
  double halfUs[kMaxRanks][2];  // per rank, latency sizes: time per call in each half
};
// The benchmark's part of the shared memory (after the harness's Control block).
struct Shared {
  int nResults;
  Result results[kMaxResults];
  double pingUs;
};
Shared* gs = nullptr;

struct Bufs {
  float* send = nullptr;
  float* recv = nullptr;
  size_t cap = 0;
};

void issue(const std::string& op, const Bufs& b, size_t count, ncclComm_t comm, cudaStream_t s) {
  if (op == "allreduce") {
    NK(api.allReduce(b.send, b.recv, count, ncclFloat32, ncclSum, comm, s));
  } else if (op == "reducescatter") {
    NK(api.reduceScatter(b.send, b.recv, count / gN, ncclFloat32, ncclSum, comm, s));
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
    } else if (op == "reducescatter") {
      if (i >= count / gN) {  // past the output block: still the poison
        uint32_t bits;
        memcpy(&bits, &h[i], 4);
        if (bits != 0xffffffffu && wrong++ < 3)
          fprintf(stderr,
                  "net_procs_bench: rank %d reducescatter wrote element %zu past its block\n",
                  gRank, i);
        continue;
      }
      want = 0;
      for (int r = 0; r < gN; r++) want += inputOf(r, (size_t)gRank * (count / gN) + i, salt);
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
    if (gRank == 0) gs->pingUs = *out == ~0ull ? -1 : (double)*out / 1000.0 / iters;
    CK(cudaFreeHost(out));
  }
  if (gRank == 0 && ps->failed) gs->pingUs = -2;
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
  int latIters = 200, bwIters = 10, warmup = 5, warmupFirst = 0;
  std::vector<std::string> rankEnv;
  std::vector<int> bindCpus;
  bool pingpong = false;
};

void rankMain(const Opts& o, PingShared* ps) {
  setupRank(o.rankEnv, o.ranksPerNode, o.bindCpus);
  setPhase("loading %s", o.lib.c_str());
  loadApi(o.lib.c_str());
  setPhase("CUDA initialisation on device 0");
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  if (o.pingpong) pingPong(ps);
  ncclComm_t comm = initComm();
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint64_t maxBytes = 0;
  for (uint64_t b : o.latSizes) maxBytes = b > maxBytes ? b : maxBytes;
  for (uint64_t b : o.bwSizes) maxBytes = b > maxBytes ? b : maxBytes;
  Bufs bufs;
  bufs.cap = std::max<size_t>((maxBytes + 3) / 4, (size_t)gN);  // reducescatter: >= n elements
  CK(cudaMalloc(&bufs.send, bufs.cap * sizeof(float)));
  CK(cudaMalloc(&bufs.recv, bufs.cap * sizeof(float)));
  int slot = 0;
  for (const std::string& op : o.ops) {
    std::vector<uint64_t> sizes = o.latSizes;
    sizes.insert(sizes.end(), o.bwSizes.begin(), o.bwSizes.end());
    for (uint64_t bytes : sizes) {
      const bool bw = bytes >= (1u << 20);
      const int iters = bw ? o.bwIters : o.latIters;
      size_t count = (size_t)((bytes + 3) / 4);
      if (op == "reducescatter") count = count < (size_t)gN ? gN : count - count % gN;
      setPhase("%s %llu bytes: check", op.c_str(), (unsigned long long)bytes);
      Result& r = gs->results[slot];
      if (gRank == 0) {
        snprintf(r.op, sizeof(r.op), "%s", op.c_str());
        r.bytes = count * 4;
        r.iters = iters;
        gs->nResults = slot + 1;
      }
      r.wrong[gRank] = checkOnce(op, bufs, count, comm, s, (uint32_t)(slot * 7919 + 1));
      setPhase("%s %llu bytes: warm-up", op.c_str(), (unsigned long long)bytes);
      const int warm = o.warmup + (bytes == sizes.front() ? o.warmupFirst : 0);
      for (int i = 0; i < warm; i++) issue(op, bufs, count, comm, s);
      waitStream(s, comm);
      setPhase("%s %llu bytes: %d timed calls", op.c_str(), (unsigned long long)bytes, iters);
      barrier();
      const int half = bw || iters < 2 ? 0 : iters / 2;
      double t0 = nowSec(), tm = t0, ts = t0, issueS = 0;
      for (int i = 0; i < iters; i++) {
        if (i == half && half > 0) {
          issueS += nowSec() - ts;
          waitStream(s, comm);
          tm = ts = nowSec();
        }
        issue(op, bufs, count, comm, s);
      }
      double t1 = nowSec();
      issueS += t1 - ts;
      waitStream(s, comm);
      double t2 = nowSec();
      r.us[gRank] = (t2 - t0) * 1e6 / iters;
      r.issueUs[gRank] = issueS * 1e6 / iters;  // the mid-run wait not counted
      r.halfUs[gRank][0] = half ? (tm - t0) * 1e6 / half : 0;
      r.halfUs[gRank][1] = half ? (t2 - tm) * 1e6 / (iters - half) : 0;
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

[[noreturn]] void usage(const char* why) {
  fprintf(stderr, "net_procs_bench: %s\n(see the comment at the top of bench/net_procs_bench.cu)\n",
          why);
  exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  double timeoutS = 240;
  const std::string cmd = benchargs::commandLine(argc, argv);
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
      o.ops = benchargs::splitList(val());
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
    else if (a == "--warmup-first")
      o.warmupFirst = atoi(val());
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
    if (op != "sendrecv" && op != "allreduce" && op != "reducescatter")
      usage(("unknown op " + op).c_str());
  for (const std::string& kv : o.rankEnv)
    if (kv.find('=') == std::string::npos || kv[0] == '=') usage("--rank-env takes NAME=VALUE");
  if ((o.latSizes.size() + o.bwSizes.size()) * o.ops.size() > (size_t)kMaxResults)
    usage("too many sizes");

  gTool = "net_procs_bench";
  void* mem = mapShared(sizeof(Shared) + sizeof(PingShared));
  if (mem == nullptr) usage("mmap failed");
  gs = static_cast<Shared*>(mem);
  PingShared* ps = reinterpret_cast<PingShared*>(gs + 1);
  bool ok = runRanks(o.nprocs, timeoutS, [&] { rankMain(o, ps); });
  // Report (what completed, even after a failure).
  printf("# %s: %d processes, library %s (version %s)\n", o.label.c_str(), o.nprocs, o.lib.c_str(),
         g->version);
  if (o.pingpong)
    printf("# GPU flag ping-pong between ranks 0 and 1: %.2f us per round trip%s\n", gs->pingUs,
           gs->pingUs == -1   ? " (timed out: kernels of the processes did not run concurrently)"
           : gs->pingUs == -2 ? " (skipped: CUDA IPC refused)"
                              : "");
  printf("# %-9s %12s %6s %12s %12s %12s %10s %10s %6s\n", "op", "bytes", "iters", "time_us",
         "max_us", "issue_us", "algbw", "busbw", "wrong");
  std::string json = "{\"label\": \"" + jsonEsc(o.label) + "\", \"command\": \"" + jsonEsc(cmd) +
                     "\", \"library\": \"" + jsonEsc(o.lib) + "\", \"version\": \"" + g->version +
                     "\", \"nprocs\": " + std::to_string(o.nprocs) +
                     ", \"ranks_per_node\": " + std::to_string(o.ranksPerNode) +
                     ", \"ok\": " + (ok ? "true" : "false") +
                     ", \"pingpong_us\": " + std::to_string(o.pingpong ? gs->pingUs : 0) +
                     ", \"results\": [";
  int totalWrong = 0;
  for (int i = 0; i < gs->nResults; i++) {
    const Result& r = gs->results[i];
    double sum = 0, mx = 0, issue = 0, h0 = 0, h1 = 0;
    int wrong = 0, have = 0;
    for (int k = 0; k < o.nprocs; k++) {
      if (r.us[k] <= 0) continue;
      have++;
      sum += r.us[k];
      issue += r.issueUs[k];
      mx = r.us[k] > mx ? r.us[k] : mx;
      wrong += r.wrong[k];
      h0 += r.halfUs[k][0];
      h1 += r.halfUs[k][1];
    }
    if (have != o.nprocs) continue;  // incomplete (a rank failed during it)
    totalWrong += wrong;
    const double us = sum / have;
    const double algbw = (double)r.bytes / us / 1e3;  // GB/s
    const double factor = strcmp(r.op, "allreduce") == 0       ? 2.0 * (o.nprocs - 1) / o.nprocs
                          : strcmp(r.op, "reducescatter") == 0 ? 1.0 * (o.nprocs - 1) / o.nprocs
                                                               : 1.0;
    printf("  %-9s %12llu %6d %12.2f %12.2f %12.2f %10.3f %10.3f %6d\n", r.op,
           (unsigned long long)r.bytes, r.iters, us, mx, issue / have, algbw, algbw * factor,
           wrong);
    char buf[480];
    snprintf(buf, sizeof(buf),
             "%s{\"op\": \"%s\", \"bytes\": %llu, \"iters\": %d, \"time_us\": %.3f, \"max_us\": "
             "%.3f, \"issue_us\": %.3f, \"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f, \"wrong\": %d, "
             "\"first_half_us\": %.3f, \"second_half_us\": %.3f}",
             i ? ", " : "", r.op, (unsigned long long)r.bytes, r.iters, us, mx, issue / have, algbw,
             algbw * factor, wrong, h0 / have, h1 / have);
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
