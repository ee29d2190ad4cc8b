// Inter-node path of the device communication API on one GPU: 2 virtual nodes x 4 ranks
// (MKERNEL_EMULATE_NODES=2, socket backend on loopback).
//   bandwidth: ranks 0-3 put to ranks 4-7 (pair i -> i+4) with put_signal, zero-copy (source
//              in the proxy's window) and staged (source anywhere in device memory), against
//              the raw TCP loopback throughput of the same pairs and connection count,
//              measured here with plain sockets (target: put >= 70% of raw);
//   latency:   GPU put_signal -> data landed and signalled at the peer (ping-pong / 2,
//              %globaltimer inside the kernel), against a host-driven send of the same size
//              (cudaMemcpy D2H + TCP send -> recv + cudaMemcpy H2D, ping-pong / 2), and raw
//              TCP ping-pong.
// Writes JSON (command, commit, device, date) and prints tables (stdout, line-buffered);
// progress lines, one per phase, go to stderr.
//   bench_net_bench [--iters N] [--ctas C] [--sizes a,b] [--lat-iters N] [--lat-sizes a,b]
//                   [--phase-timeout S] [--full] [--out file.json] [--commit SHA]
// Every phase is bounded: device waits end at MKERNEL_TIMEOUT_MS (set to the phase bound
// unless given), the host polls kernels with a deadline, sockets have timeouts, and a
// watchdog ends the process (naming the phase) if anything else blocks past the bound.
// The default configuration takes seconds; --full is the larger sweep.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <utility>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include "bench_args.h"
#include "coll_bench_util.h"
#include "comm/comm.h"
#include "base/param.h"
#include "device/net/devcomm.cuh"
#include "net_bench_util.h"
#include "transport/net_state.h"

namespace dn = mk::dev::net;
using netbench::die;
using netbench::now;

namespace {

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) die("%s:%d %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
  } while (0)
#define NK(call)                                                                  \
  do {                                                                            \
    ncclResult_t r_ = (call);                                                     \
    if (r_ != ncclSuccess)                                                        \
      die("%s:%d %s: %s (%s)", __FILE__, __LINE__, #call, ncclGetErrorString(r_), \
          ncclGetLastError(nullptr));                                             \
  } while (0)

// ---- kernels -----------------------------------------------------------------------------
// Sender: CTA b puts slice b of the message `iters` times, adding 1 to the peer's slot each
// time; t0 = the earliest start.
__global__ void bwSend(mk::NetDev d, const char* src, int peer, uint64_t bytes, int iters,
                       uint32_t slot, unsigned long long* t0, int* ok) {
  if (threadIdx.x == 0) atomicMin(t0, (unsigned long long)mk::ptx::globalTimerNs());
  uint64_t per = (bytes / gridDim.x + 15) / 16 * 16;
  uint64_t lo = per * blockIdx.x < bytes ? per * blockIdx.x : bytes;
  uint64_t hi = lo + per < bytes ? lo + per : bytes;
  bool good = true;
  for (int i = 0; i < iters && good; i++)
    good = dn::put_signal(d, src + lo, peer, lo, hi - lo, slot, 1, mk::kSignalAdd);
  if (good) good = dn::quiet(d);
  if (!good && threadIdx.x == 0) *ok = 0;
}

// Receiver: waits for every slice of every iteration; t1 = when the last one landed.
__global__ void bwRecv(mk::NetDev d, uint32_t slot, uint64_t target, int from,
                       unsigned long long* t1, int* ok) {
  bool good = dn::wait_signal(d, slot, target, from);
  if (threadIdx.x == 0) {
    *t1 = mk::ptx::globalTimerNs();
    if (!good) *ok = 0;
  }
}

// Ping-pong: the initiator puts, the responder waits then puts back. Timed after `warm`
// round trips.
__global__ void pingPong(mk::NetDev d, const char* src, int peer, uint64_t bytes, int iters,
                         int warm, int initiator, uint32_t slotIn, uint32_t slotOut,
                         unsigned long long* ns, int* ok) {
  bool good = true;
  uint64_t t = 0;
  for (int i = 0; i < warm + iters && good; i++) {
    if (i == warm) t = mk::ptx::globalTimerNs();
    if (initiator) {
      good = dn::put_signal(d, src, peer, 0, bytes, slotOut, i + 1) &&
             dn::wait_signal(d, slotIn, i + 1, peer);
    } else {
      good = dn::wait_signal(d, slotIn, i + 1, peer) &&
             dn::put_signal(d, src, peer, 0, bytes, slotOut, i + 1);
    }
  }
  if (threadIdx.x == 0) {
    *ns = mk::ptx::globalTimerNs() - t;
    if (!good) *ok = 0;
  }
}

// ---- the ranks ---------------------------------------------------------------------------
struct Ctx {
  int n = 0;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> st;
};

// Every rank's async error (proxy error first, then the device record) with its message.
std::string asyncErrors(Ctx& x) {
  std::string all;
  for (int i = 0; i < x.n; i++) {
    if (!x.comms[i]) continue;
    ncclResult_t a = ncclSuccess;
    if (ncclCommGetAsyncError(x.comms[i], &a) != ncclSuccess) a = ncclInternalError;
    if (a == ncclSuccess || a == ncclInProgress) continue;
    std::string m;
    {
      std::lock_guard<std::mutex> g(x.comms[i]->asyncMu);
      m = x.comms[i]->asyncMsg;
    }
    all += "\n  rank " + std::to_string(i) + ": " + ncclGetErrorString(a) + ": " + m;
  }
  return all;
}

// A failed phase: abort every comm (kernels leave within milliseconds), wait for them a
// little, report every rank's state and error, and exit without teardown.
[[noreturn]] void failRun(Ctx& x, const std::string& why) {
  fprintf(stderr, "net_bench: %s; aborting every comm\n", why.c_str());
  netbench::setAbortFlags();
  for (int i = 0; i < x.n; i++)
    if (x.comms[i]) mk::netAbort(x.comms[i]);
  double end = now() + 5;
  std::string running;
  for (int i = 0; i < x.n; i++) {
    while (cudaStreamQuery(x.st[i]) == cudaErrorNotReady && now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (cudaStreamQuery(x.st[i]) == cudaErrorNotReady) running += " " + std::to_string(i);
  }
  std::string errs = asyncErrors(x);
  die("%s.%s%s%s", why.c_str(),
      running.empty() ? "" : " Kernels still running 5 s after the abort on ranks:",
      running.c_str(),
      errs.empty() ? " No rank reported an async error." : (" Async errors:" + errs).c_str());
}

// Polls until the streams of `ranks` are idle. An async error on any rank, or boundS
// passing, fails the run with a description (never a wait without a deadline: a kernel
// waiting for a signal that never comes would otherwise block until MKERNEL_TIMEOUT_MS).
void waitStreams(Ctx& x, const std::vector<int>& ranks, double boundS, const char* what) {
  const double t0 = now();
  double nextPoll = t0;
  for (;;) {
    std::string running;
    for (int i : ranks) {
      cudaError_t q = cudaStreamQuery(x.st[i]);
      if (q == cudaErrorNotReady)
        running += " " + std::to_string(i);
      else if (q != cudaSuccess)
        failRun(x, std::string(what) + ": rank " + std::to_string(i) + ": CUDA error " +
                       cudaGetErrorString(q));
    }
    if (running.empty()) return;
    if (now() >= nextPoll) {  // errors every 20 ms: cheap, and no load on the timed path
      std::string errs = asyncErrors(x);
      if (!errs.empty()) failRun(x, std::string(what) + ": a rank reported an error:" + errs);
      nextPoll = now() + 0.02;
    }
    if (now() - t0 > boundS) {
      char m[512];
      snprintf(m, sizeof(m), "%s: kernels of ranks%s still running after %.0f s (bound)", what,
               running.c_str(), boundS);
      failRun(x, m);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// A stream of this thread's own, polled to completion with a deadline.
void spinStream(cudaStream_t s, double deadline) {
  for (uint32_t k = 0;; k++) {
    cudaError_t q = cudaStreamQuery(s);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) die("host-driven copy: %s", cudaGetErrorString(q));
    if ((k & 1023) == 0 && now() > deadline) die("host-driven copy still running at the deadline");
  }
}

// ---- plain TCP ---------------------------------------------------------------------------
// pairs x conns connections, each moving bytesPerPair / conns; GB/s of the whole.
double rawTcpBandwidth(int pairs, int conns, size_t bytesPerPair, double timeoutS) {
  int port = 0, lfd = netbench::listenLoopback(&port);
  std::vector<std::pair<int, int>> fds;
  for (int i = 0; i < pairs * conns; i++) fds.push_back(netbench::tcpPair(lfd, port, timeoutS));
  size_t per = bytesPerPair / conns;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> th;
  for (auto& f : fds) {
    th.emplace_back([&, f] {
      std::vector<char> buf(4 << 20, 1);
      ready++;
      while (!go.load()) std::this_thread::yield();
      for (size_t left = per; left;) {
        size_t n = std::min(left, buf.size());
        netbench::sendAll(f.first, buf.data(), n);
        left -= n;
      }
    });
    th.emplace_back([&, f] {
      std::vector<char> buf(4 << 20);
      ready++;
      while (!go.load()) std::this_thread::yield();
      for (size_t left = per; left;) {
        size_t n = std::min(left, buf.size());
        netbench::recvAll(f.second, buf.data(), n);
        left -= n;
      }
    });
  }
  while (ready.load() < (int)th.size()) std::this_thread::yield();
  double t0 = now();
  go = true;
  for (auto& t : th) t.join();
  double dt = now() - t0;
  for (auto& f : fds) close(f.first), close(f.second);
  close(lfd);
  return (double)per * conns * pairs / dt / 1e9;
}

// One-way latency (us) of a host-driven transfer: ping-pong over one TCP connection, with
// (withCopies) the GPU<->host copies a host-driven transport needs on both ends.
double hostPingPongUs(size_t bytes, int iters, int warm, bool withCopies, double timeoutS) {
  int port = 0, lfd = netbench::listenLoopback(&port);
  auto f = netbench::tcpPair(lfd, port, timeoutS);
  const double deadline = now() + timeoutS;
  double result = 0;
  auto side = [&](int fd, bool initiator) {
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    char *h = nullptr, *dev = nullptr;
    CK(cudaHostAlloc((void**)&h, std::max<size_t>(bytes, 1), cudaHostAllocDefault));
    CK(cudaMalloc((void**)&dev, std::max<size_t>(bytes, 1)));
    double t0 = 0;
    for (int i = 0; i < warm + iters; i++) {
      if (i == warm) t0 = now();
      auto out = [&] {
        if (withCopies) {
          CK(cudaMemcpyAsync(h, dev, bytes, cudaMemcpyDeviceToHost, s));
          spinStream(s, deadline);
        }
        netbench::sendAll(fd, h, bytes);
      };
      auto in = [&] {
        netbench::recvAll(fd, h, bytes);
        if (withCopies) {
          CK(cudaMemcpyAsync(dev, h, bytes, cudaMemcpyHostToDevice, s));
          spinStream(s, deadline);
        }
      };
      if (initiator)
        out(), in();
      else
        in(), out();
    }
    if (initiator) result = (now() - t0) / iters / 2 * 1e6;
    cudaFreeHost(h);
    cudaFree(dev);
    cudaStreamDestroy(s);
  };
  std::thread b(side, f.second, false);
  side(f.first, true);
  b.join();
  close(f.first), close(f.second), close(lfd);
  return result;
}

void setDefault(const char* name, const std::string& value) {
  if (!getenv(name)) setenv(name, value.c_str(), 1);
}

std::vector<size_t> parseSizes(const std::string& s) {
  std::vector<size_t> v;
  for (const std::string& item : benchargs::splitList(s)) {
    char* end = nullptr;
    unsigned long long x = strtoull(item.c_str(), &end, 10);
    if (*end != '\0') {
      fprintf(stderr, "bad size '%s' in '%s'\n", item.c_str(), s.c_str());
      exit(2);
    }
    v.push_back((size_t)x);
  }
  return v;
}

struct Options {
  int iters = 10, ctas = 4, latIters = 50, warm = 5;
  std::vector<size_t> sizes = {256 << 10, 1 << 20, 4 << 20};
  std::vector<size_t> latSizes = {8, 65536, 1 << 20};
  double phaseS = 20;
  std::string out = "bench/results/net-bench.json", commit, cmd;
};

void usage(const char* argv0, FILE* f) {
  fprintf(f,
          "usage: %s [--iters N] [--ctas C] [--sizes a,b,...] [--lat-iters N] "
          "[--lat-sizes a,b,...]\n"
          "          [--phase-timeout S] [--full] [--out file.json] [--commit SHA]\n"
          "  2 virtual nodes x 4 ranks on GPU 0, socket backend on loopback.\n"
          "  defaults: --iters 10 --ctas 4 --sizes 262144,1048576,4194304 --lat-iters 50\n"
          "            --lat-sizes 8,65536,1048576 --phase-timeout 20 (a few seconds in all)\n"
          "  --full:   --iters 20 --sizes 65536,1048576,4194304,16777216 --lat-iters 200\n"
          "            --lat-sizes 8,1024,65536,1048576 --phase-timeout 60 (later flags win)\n"
          "  Each phase (one size of one measurement) must end within --phase-timeout seconds;\n"
          "  MKERNEL_TIMEOUT_MS defaults to the same bound. Environment defaults (kept when\n"
          "  set): MKERNEL_EMULATE_NODES=2 MKERNEL_NET=socket NCCL_SOCKET_IFNAME=lo\n"
          "  MKERNEL_WORKSPACE_BYTES=MKERNEL_NET_WINDOW_BYTES=32 MiB (or the largest size)\n"
          "  MKERNEL_BOOTSTRAP_TIMEOUT_S=20 MKERNEL_NET_TIMEOUT_S=20.\n",
          argv0);
}

Options parseArgs(int argc, char** argv) {
  Options o;
  o.cmd = argv[0];
  // --full first: it sets defaults that the other flags may then override.
  for (int i = 1; i < argc; i++)
    if (std::string(argv[i]) == "--full") {
      o.iters = 20;
      o.latIters = 200;
      o.warm = 20;
      o.sizes = {64 << 10, 1 << 20, 4 << 20, 16 << 20};
      o.latSizes = {8, 1024, 65536, 1 << 20};
      o.phaseS = 60;
    }
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    o.cmd += " " + a;
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", a.c_str());
        exit(2);
      }
      o.cmd += std::string(" ") + argv[i + 1];
      return argv[++i];
    };
    if (a == "--iters")
      o.iters = atoi(next().c_str());
    else if (a == "--ctas")
      o.ctas = atoi(next().c_str());
    else if (a == "--lat-iters")
      o.latIters = atoi(next().c_str());
    else if (a == "--sizes")
      o.sizes = parseSizes(next());
    else if (a == "--lat-sizes")
      o.latSizes = parseSizes(next());
    else if (a == "--phase-timeout")
      o.phaseS = atof(next().c_str());
    else if (a == "--out")
      o.out = next();
    else if (a == "--commit")
      o.commit = next();
    else if (a == "--full")
      continue;
    else if (a == "--help" || a == "-h") {
      usage(argv[0], stdout);
      exit(0);
    } else {
      fprintf(stderr, "unknown argument %s\n", a.c_str());
      usage(argv[0], stderr);
      exit(2);
    }
  }
  if (o.iters < 1 || o.ctas < 1 || o.ctas > 64 || o.latIters < 1 || o.phaseS < 1 ||
      o.sizes.empty() || o.latSizes.empty()) {
    fprintf(stderr,
            "bad arguments: iters >= 1, 1 <= ctas <= 64, lat-iters >= 1, "
            "phase-timeout >= 1, sizes not empty\n");
    exit(2);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  // stdout may be a file killed by `timeout`: line-buffer it so every finished row is kept.
  setvbuf(stdout, nullptr, _IOLBF, 0);
  Options o = parseArgs(argc, argv);
  if (o.commit.empty()) {
    bool dirty = false;
    o.commit = collbench::benchCommit(collbench::dirName(__FILE__), &dirty);
  }
  size_t maxSize = 0;
  for (size_t s : o.sizes) maxSize = std::max(maxSize, s);
  for (size_t s : o.latSizes) maxSize = std::max(maxSize, s);
  // 32 MiB windows as before (1 MiB staging chunks: the socket backend's sweet spot), or
  // the largest message rounded up to 1 MiB.
  const size_t window = std::max<size_t>(32 << 20, (maxSize + (1 << 20) - 1) >> 20 << 20);
  setDefault("MKERNEL_EMULATE_NODES", "2");
  setDefault("MKERNEL_NET", "socket");
  setDefault("NCCL_SOCKET_IFNAME", "lo");
  setDefault("MKERNEL_WORKSPACE_BYTES", std::to_string(window));
  setDefault("MKERNEL_NET_WINDOW_BYTES", std::to_string(window));
  // Device waits give up at the phase bound instead of the library's 300 s default.
  setDefault("MKERNEL_TIMEOUT_MS", std::to_string((long long)(o.phaseS * 1000)));
  setDefault("MKERNEL_BOOTSTRAP_TIMEOUT_S", "20");
  setDefault("MKERNEL_NET_TIMEOUT_S", "20");
  mk::paramReset();
  // The host-side bound of a phase: the device deadline plus slack for its record to land.
  const double phaseS = o.phaseS + 2;
  netbench::startWatchdog(/*graceS=*/10);

  netbench::beginPhase(30, "CUDA start");
  int ndev = 0;
  cudaError_t ge = cudaGetDeviceCount(&ndev);
  if (ge != cudaSuccess || ndev == 0) {
    printf("no GPU (%s): nothing to measure\n",
           ge != cudaSuccess ? cudaGetErrorString(ge) : "cudaGetDeviceCount returned 0");
    return 0;
  }
  CK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  // CUDA lazy loading (the default since CUDA 12.2) loads a kernel at its first launch, and
  // that load may synchronise the context. The first bwSend launch then waits for the bwRecv
  // kernels already spinning for bwSend's data: a deadlock until MKERNEL_TIMEOUT_MS (300 s by
  // default), the likely hang of the first H200 run. Load every kernel before any launch.
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, bwSend));
  CK(cudaFuncGetAttributes(&fa, bwRecv));
  CK(cudaFuncGetAttributes(&fa, pingPong));

  const int n = 8, pairs = 4;
  Ctx x;
  x.n = n;
  x.comms.assign(n, nullptr);
  std::vector<int> devs(n, 0);
  netbench::beginPhase(60, "ncclCommInitAll: 8 ranks on GPU 0, windows %zu MiB", window >> 20);
  NK(ncclCommInitAll(x.comms.data(), n, devs.data()));
  CK(cudaSetDevice(0));
  {
    std::lock_guard<std::mutex> g(netbench::phaseState().mu);
    for (auto c : x.comms) netbench::phaseState().abortFlags.push_back(c->abortFlag);
  }
  x.st.assign(n, nullptr);
  for (int i = 0; i < n; i++) CK(cudaStreamCreateWithFlags(&x.st[i], cudaStreamNonBlocking));
  if (x.comms[0]->topo.nNodes != 2)
    die("the comm has %d (virtual) nodes; this benchmark needs 2 x 4 ranks "
        "(MKERNEL_EMULATE_NODES=2)",
        x.comms[0]->topo.nNodes);
  for (int i = 0; i < n; i++)
    if (x.comms[i]->topo.node != i / pairs)
      die("rank %d is on node %d, expected %d", i, x.comms[i]->topo.node, i / pairs);
  const bool wired = x.comms[0]->net != nullptr;
  if (!wired) {  // when api/init.cc does not call netInit (collective: one thread per rank)
    printf("# comm init did not create the inter-node state: calling netInit here\n");
    std::vector<std::thread> th;
    for (int i = 0; i < n; i++)
      th.emplace_back([&, i] {
        CK(cudaSetDevice(0));
        NK(mk::netInit(x.comms[i]));
      });
    for (auto& t : th) t.join();
  }
  std::vector<mk::NetDev> view(n);
  for (int i = 0; i < n; i++) NK(mk::netDevView(x.comms[i], &view[i]));
  mk::NetHostView hv;
  NK(mk::netHostView(x.comms[0], &hv));
  for (size_t s : o.sizes)
    if (s > view[0].windowBytes || s > view[0].sendUser)
      die("size %zu exceeds the window (%llu bytes; MKERNEL_NET_WINDOW_BYTES)", s,
          (unsigned long long)view[0].windowBytes);
  for (size_t s : o.latSizes)
    if (s > view[0].windowBytes)
      die("latency size %zu exceeds the window (%llu bytes; MKERNEL_NET_WINDOW_BYTES)", s,
          (unsigned long long)view[0].windowBytes);

  netbench::beginPhase(30, "buffers");
  const size_t srcBytes = std::max<size_t>(maxSize, 1 << 20);
  std::vector<char*> src(n);
  for (int i = 0; i < n; i++) {
    CK(cudaMalloc((void**)&src[i], srcBytes));
    CK(cudaMemset(src[i], i + 1, srcBytes));
  }
  // Timestamps and the success flag live in device memory (GPU atomics on mapped host
  // memory are not guaranteed over PCIe) and are copied back after each run, once the
  // kernels are done (the copies then cannot wait behind a spinning kernel).
  unsigned long long* dtm = nullptr;  // [2n]: senders' start, receivers' end
  int* dok = nullptr;
  std::vector<unsigned long long> tm(2 * n);
  CK(cudaMalloc((void**)&dtm, sizeof(unsigned long long) * 2 * n));
  CK(cudaMalloc((void**)&dok, sizeof(int)));
  CK(cudaDeviceSynchronize());  // nothing of ours runs yet: bounded by the watchdog
  auto resetTimes = [&] {
    for (int i = 0; i < n; i++) tm[i] = ~0ull, tm[n + i] = 0;
    int one = 1;
    CK(cudaMemcpy(dtm, tm.data(), sizeof(unsigned long long) * 2 * n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dok, &one, sizeof(int), cudaMemcpyHostToDevice));
  };
  auto readTimes = [&]() -> bool {
    int good = 0;
    CK(cudaMemcpy(tm.data(), dtm, sizeof(unsigned long long) * 2 * n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&good, dok, sizeof(int), cudaMemcpyDeviceToHost));
    return good != 0;
  };
  const int conns = (int)mk::paramInt(mk::ParamId::SocketNConns);
  uint32_t slot = 16;
  std::vector<int> all(n), lat0{0, 4};
  for (int i = 0; i < n; i++) all[i] = i;

  struct BwRow {
    size_t bytes;
    double zc, staged, raw;
  };
  std::vector<BwRow> bw;
  printf("# %s, backend %s, MKERNEL_SOCKET_NCONNS=%d, windows %llu B, staging %u x %llu B\n",
         prop.name, hv.backend, conns, (unsigned long long)view[0].windowBytes, view[0].stageSlots,
         (unsigned long long)view[0].stageChunk);
  printf("# inter-node bandwidth, %d pairs (rank i -> i+4), %d CTAs per sender, %d iterations\n",
         pairs, o.ctas, o.iters);
  printf("%12s %14s %14s %14s %8s\n", "bytes", "put zc GB/s", "put stg GB/s", "raw TCP GB/s",
         "zc/raw");
  for (size_t bytes : o.sizes) {
    BwRow row{bytes, 0, 0, 0};
    for (int mode = 0; mode < 2; mode++) {
      netbench::beginPhase(phaseS, "bandwidth %zu B x %d iterations, %s source", bytes, o.iters,
                           mode == 0 ? "zero-copy" : "staged");
      resetTimes();
      uint32_t s = slot++;
      // Receivers first, so that each is already waiting when data lands (t1 is exact).
      for (int i = 0; i < pairs; i++)
        bwRecv<<<1, 32, 0, x.st[i + pairs]>>>(view[i + pairs], s, (uint64_t)o.ctas * o.iters, i,
                                              &dtm[n + i], dok);
      for (int i = 0; i < pairs; i++) {
        // Zero-copy: the source is the user part of the proxy's source window.
        const char* from = mode == 0 ? view[i].sendBase : src[i];
        bwSend<<<o.ctas, 256, 0, x.st[i]>>>(view[i], from, i + pairs, bytes, o.iters, s, &dtm[i],
                                            dok);
      }
      CK(cudaGetLastError());
      waitStreams(x, all, phaseS, "bandwidth");
      if (!readTimes()) failRun(x, "bandwidth: a sender or receiver kernel reported a failure");
      unsigned long long t0 = ~0ull, t1 = 0;
      for (int i = 0; i < pairs; i++) t0 = std::min(t0, tm[i]), t1 = std::max(t1, tm[n + i]);
      double gbs = t1 > t0 ? (double)bytes * o.iters * pairs / (double)(t1 - t0) : 0;
      (mode == 0 ? row.zc : row.staged) = gbs;
    }
    netbench::beginPhase(phaseS, "raw TCP bandwidth %zu B x %d iterations, %d x %d connections",
                         bytes, o.iters, pairs, conns);
    row.raw = rawTcpBandwidth(pairs, conns, bytes * o.iters, o.phaseS);
    printf("%12zu %14.2f %14.2f %14.2f %8.2f\n", bytes, row.zc, row.staged, row.raw,
           row.zc / row.raw);
    bw.push_back(row);
  }

  struct LatRow {
    size_t bytes;
    double gpu, host, tcp;
  };
  std::vector<LatRow> lat;
  printf("# one-way latency (ping-pong / 2), rank 0 <-> rank 4, %d iterations after %d warm-up\n",
         o.latIters, o.warm);
  printf("%12s %14s %16s %14s\n", "bytes", "GPU put us", "host-driven us", "raw TCP us");
  for (size_t bytes : o.latSizes) {
    netbench::beginPhase(phaseS, "GPU ping-pong %zu B x %d", bytes, o.warm + o.latIters);
    uint32_t a = slot++, b = slot++;
    resetTimes();
    pingPong<<<1, 256, 0, x.st[4]>>>(view[4], src[4], 0, bytes, o.latIters, o.warm, 0, a, b,
                                     &dtm[1], dok);
    pingPong<<<1, 256, 0, x.st[0]>>>(view[0], src[0], 4, bytes, o.latIters, o.warm, 1, b, a,
                                     &dtm[0], dok);
    CK(cudaGetLastError());
    waitStreams(x, lat0, phaseS, "GPU ping-pong");
    if (!readTimes()) failRun(x, "GPU ping-pong: a kernel reported a failure");
    LatRow r{bytes, (double)tm[0] / o.latIters / 2 / 1e3, 0, 0};
    netbench::beginPhase(phaseS, "host-driven ping-pong %zu B x %d", bytes, o.warm + o.latIters);
    r.host = hostPingPongUs(bytes, o.latIters, o.warm, true, o.phaseS);
    netbench::beginPhase(phaseS, "raw TCP ping-pong %zu B x %d", bytes, o.warm + o.latIters);
    r.tcp = hostPingPongUs(bytes, o.latIters, o.warm, false, o.phaseS);
    printf("%12zu %14.2f %16.2f %14.2f\n", bytes, r.gpu, r.host, r.tcp);
    lat.push_back(r);
  }

  netbench::beginPhase(30, "writing %s", o.out.c_str());
  double worst = 1e9;
  for (auto& r : bw) worst = std::min(worst, std::max(r.zc, r.staged) / r.raw);
  printf("# put / raw TCP (best of zero-copy and staged, worst size): %.2f (target >= 0.70): %s\n",
         worst, worst >= 0.70 ? "met" : "NOT met");
  time_t t = time(nullptr);
  char date[64];
  strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
  collbench::Json j;
  j.beginObject();
  j.str("benchmark", "net").str("command", o.cmd).str("git_commit", o.commit);
  j.str("device", prop.name).str("date", date);
  char setup[512];
  snprintf(setup, sizeof(setup),
           "2 virtual nodes x 4 ranks on one GPU, MKERNEL_NET=%s (backend %s), "
           "MKERNEL_SOCKET_NCONNS=%d, windows %llu B, iters %d, CTAs %d, latency iters %d "
           "(+%d warm-up)",
           mk::paramStr(mk::ParamId::Net), hv.backend, conns,
           (unsigned long long)view[0].windowBytes, o.iters, o.ctas, o.latIters, o.warm);
  j.str("setup", setup);
  j.num("target_put_over_raw", 0.70).num("min_put_over_raw", worst);
  j.beginArray("bandwidth");
  for (auto& r : bw) {
    j.beginObject();
    j.integer("bytes", (long long)r.bytes).num("put_zero_copy_gbs", r.zc);
    j.num("put_staged_gbs", r.staged).num("raw_tcp_gbs", r.raw);
    j.num("zero_copy_over_raw", r.zc / r.raw).num("staged_over_raw", r.staged / r.raw);
    j.endObject();
  }
  j.endArray();
  j.beginArray("latency_us");
  for (auto& r : lat) {
    j.beginObject();
    j.integer("bytes", (long long)r.bytes).num("gpu_put", r.gpu).num("host_driven", r.host);
    j.num("raw_tcp", r.tcp);
    j.endObject();
  }
  j.endArray();
  j.endObject();
  collbench::makeDirs(collbench::dirName(o.out));
  FILE* f = fopen(o.out.c_str(), "w");
  if (!f) {
    fprintf(stderr, "net_bench: cannot write %s: %s\n", o.out.c_str(), strerror(errno));
  } else {
    fprintf(f, "%s\n", j.text().c_str());
    fclose(f);
    printf("wrote %s\n", o.out.c_str());
  }

  netbench::beginPhase(30, "teardown");
  for (int i = 0; i < n; i++) {
    if (!wired) mk::netFini(x.comms[i]);
    ncclCommDestroy(x.comms[i]);
    x.comms[i] = nullptr;
  }
  {
    std::lock_guard<std::mutex> g(netbench::phaseState().mu);
    netbench::phaseState().abortFlags.clear();  // freed with the comms
  }
  for (int i = 0; i < n; i++) {
    cudaStreamDestroy(x.st[i]);
    cudaFree(src[i]);
  }
  cudaFree(dtm);
  cudaFree(dok);
  fprintf(stderr, "[net_bench +%6.1f s] done\n", now() - netbench::phaseState().t0);
  return 0;
}
