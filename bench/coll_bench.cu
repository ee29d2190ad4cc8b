// Collective benchmark of mkernel (linked in statically) against the real NCCL (dlopen'ed).
//
//  (a) one rank: 8-byte float AllReduce latency (CUDA events; median of many), per-op time
//      back to back and inside a CUDA graph, host time per call over 10k calls without sync;
//      mkernel and the real NCCL side by side, with the ratio.
//  (b) N ranks (default 4) sharing one GPU, one thread driving N communicators through
//      ncclGroupStart/End (mkernel only: the real NCCL refuses two ranks on one GPU):
//      busbw of a 256 MiB float AllReduce against the HBM bound derived from the measured
//      cudaMemcpy D2D bandwidth (see printBoundModel), and a sweep 8 B .. 256 MiB of AllReduce,
//      AllGather, ReduceScatter, Broadcast, Reduce printed as nccl-tests rows (with #wrong);
//      --reg 1/2 registers the buffers (ncclCommRegister / windows) as nccl-tests -R does,
//      and the JSON counts the launches that took the zero-copy paths.
// Results also go to bench/results/coll_<date>_<time>.json with the command line, git commit,
// device and date. Run with --help for the options.
#include <algorithm>
#include <chrono>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "coll_bench_api.h"
#include "bench_args.h"
#include "coll_bench_options.h"
#include "coll_bench_util.h"
#include "coll/zc_plan.h"
#include "device/rt/ptx.cuh"

using namespace collbench;

namespace {

// ---------------------------------------------------------------------------------------------
__global__ void fillKernel(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

// Counts elements that differ from the expectation: chunk == 0: every element == value;
// chunk > 0: element i == i / chunk + 1 (AllGather of "rank + 1"). NaN never matches.
__global__ void checkKernel(const float* p, size_t n, size_t chunk, float value,
                            unsigned long long* bad) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    float expect = chunk ? static_cast<float>(i / chunk + 1) : value;
    if (!(p[i] == expect)) ++local;
  }
  if (local) atomicAdd(bad, local);
}

// Keeps the stream busy for `ns` nanoseconds (global timer), so work queued behind it is
// already submitted when it starts.
__global__ void spinKernel(unsigned long long ns) {
  const unsigned long long t0 = mk::ptx::globalTimerNs();
  while (mk::ptx::globalTimerNs() - t0 < ns) {
  }
}

void fill(float* p, size_t n, float v, cudaStream_t s) {
  fillKernel<<<1024, 256, 0, s>>>(p, n, v);
  CB_CUDA(cudaGetLastError());
}

float elapsedMs(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CB_CUDA(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

// ---------------------------------------------------------------------------------------------
// (a) one rank
struct SingleRank {
  bool ran = false;
  std::string error, lib, graphNote;
  int version = 0;
  double callMed = NAN, callP10 = NAN, callP90 = NAN;  // event before the call .. after it
  double gpuMed = NAN, gpuP10 = NAN, gpuP90 = NAN;     // op already queued behind a spin kernel
  double b2bUs = NAN;                                  // 1000 calls back to back, per op
  double graphUs = NAN;                                // graph of 100 calls, per op
  double hostUs = NAN, hostBatchMedUs = NAN;           // host time per call
  bool correct = false;
};

// NCCL errors inside the one-rank measurement abort only that measurement (caught by the caller).
void ncclOrThrow(const NcclApi& api, ncclResult_t res, const char* what) {
  if (res != ncclSuccess)
    throw std::runtime_error(std::string(what) + " returned " + api.errorString(res) + " " +
                             api.lastError());
}
#define SR_NCCL(api, cmd) ncclOrThrow(api, (cmd), #cmd)

SingleRank measureSingleRankOrThrow(const NcclApi& api, const Options& o) {
  SingleRank r;
  r.lib = api.path.empty() ? "linked in (mkernel_static)" : api.path;
  SR_NCCL(api, api.getVersion(&r.version));
  CB_CUDA(cudaSetDevice(o.device));
  ncclUniqueId id;
  SR_NCCL(api, api.getUniqueId(&id));
  ncclComm_t comm;
  SR_NCCL(api, api.commInitRank(&comm, 1, id, 0));
  cudaStream_t s;
  CB_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *send, *recv;
  CB_CUDA(cudaMalloc(&send, 256));
  CB_CUDA(cudaMalloc(&recv, 256));
  fill(send, 2, 1.5f, s);
  fill(recv, 2, -1.0f, s);
  const size_t count = 2;  // 8 bytes
  auto call = [&]() {
    SR_NCCL(api, api.allReduce(send, recv, count, ncclFloat, ncclSum, comm, s));
  };
  for (int i = 0; i < 200; ++i) call();
  CB_CUDA(cudaStreamSynchronize(s));
  cudaEvent_t e0, e1;
  CB_CUDA(cudaEventCreate(&e0));
  CB_CUDA(cudaEventCreate(&e1));

  std::vector<double> v;
  for (int i = 0; i < o.latIters; ++i) {
    CB_CUDA(cudaEventRecord(e0, s));
    call();
    CB_CUDA(cudaEventRecord(e1, s));
    CB_CUDA(cudaEventSynchronize(e1));
    v.push_back(1000.0 * elapsedMs(e0, e1));
  }
  r.callMed = median(v), r.callP10 = quantile(v, 0.1), r.callP90 = quantile(v, 0.9);
  v.clear();
  for (int i = 0; i < o.latIters; ++i) {
    spinKernel<<<1, 1, 0, s>>>(300000);  // 300 us: covers the host time of the next calls
    CB_CUDA(cudaEventRecord(e0, s));
    call();
    CB_CUDA(cudaEventRecord(e1, s));
    CB_CUDA(cudaEventSynchronize(e1));
    v.push_back(1000.0 * elapsedMs(e0, e1));
  }
  r.gpuMed = median(v), r.gpuP10 = quantile(v, 0.1), r.gpuP90 = quantile(v, 0.9);

  CB_CUDA(cudaEventRecord(e0, s));
  for (int i = 0; i < 1000; ++i) call();
  CB_CUDA(cudaEventRecord(e1, s));
  CB_CUDA(cudaEventSynchronize(e1));
  r.b2bUs = elapsedMs(e0, e1);  // ms for 1000 ops == us per op

  // CUDA graph of 100 calls (failures are reported, not fatal).
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool captured = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  ncclResult_t cr = ncclSuccess;
  for (int i = 0; captured && i < 100 && cr == ncclSuccess; ++i)
    cr = api.allReduce(send, recv, count, ncclFloat, ncclSum, comm, s);
  if (captured && cudaStreamEndCapture(s, &graph) != cudaSuccess) captured = false;
  if (cr != ncclSuccess) {
    r.graphNote = std::string("ncclAllReduce during capture: ") + api.errorString(cr);
  } else if (!captured || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    r.graphNote = "stream capture / graph instantiation failed";
  } else {
    CB_CUDA(cudaGraphLaunch(exec, s));
    CB_CUDA(cudaStreamSynchronize(s));
    v.clear();
    for (int i = 0; i < 20; ++i) {
      CB_CUDA(cudaEventRecord(e0, s));
      CB_CUDA(cudaGraphLaunch(exec, s));
      CB_CUDA(cudaEventRecord(e1, s));
      CB_CUDA(cudaEventSynchronize(e1));
      v.push_back(1000.0 * elapsedMs(e0, e1) / 100.0);
    }
    r.graphUs = median(v);
  }
  cudaGetLastError();
  CB_CUDA(cudaStreamSynchronize(s));

  // Host cost: batches of 250 calls, each batch timed, the stream drained (untimed) between
  // batches so the launch queue never fills and blocks the host.
  const int batch = 250;
  double total = 0;
  int calls = 0;
  v.clear();
  while (calls < o.hostCalls) {
    int n = std::min(batch, o.hostCalls - calls);
    double t0 = nowUs();
    for (int i = 0; i < n; ++i) call();
    double dt = nowUs() - t0;
    total += dt;
    calls += n;
    v.push_back(dt / n);
    CB_CUDA(cudaStreamSynchronize(s));
  }
  r.hostUs = total / calls;
  r.hostBatchMedUs = median(v);

  float h[2] = {0, 0};
  CB_CUDA(cudaMemcpy(h, recv, sizeof(h), cudaMemcpyDeviceToHost));
  r.correct = h[0] == 1.5f && h[1] == 1.5f;
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  SR_NCCL(api, api.commDestroy(comm));
  cudaFree(send);
  cudaFree(recv);
  cudaStreamDestroy(s);
  r.ran = true;
  return r;
}

SingleRank measureSingleRank(const NcclApi& api, const Options& o) {
  try {
    return measureSingleRankOrThrow(api, o);
  } catch (const std::exception& e) {
    SingleRank r;
    r.lib = api.path.empty() ? "linked in (mkernel_static)" : api.path;
    r.error = e.what();
    cudaDeviceSynchronize();
    cudaGetLastError();
    return r;
  }
}

void printSingle(const SingleRank& m, const SingleRank* n) {
  printf("#\n# (a) one rank, 8-byte float AllReduce (sum); times in us\n");
  if (!m.ran) printf("#   mkernel: FAIL %s\n", m.error.c_str());
  if (n && !n->ran) printf("#   nccl: FAIL %s\n", n->error.c_str());
  printf("#   mkernel: %s (version %d)%s\n", m.lib.c_str(), m.version,
         m.correct ? "" : "  RESULT WRONG");
  if (n && n->ran)
    printf("#   nccl:    %s (version %d)%s\n", n->lib.c_str(), n->version,
           n->correct ? "" : "  RESULT WRONG");
  printf("# %-58s %10s %10s %14s\n", "measurement", "mkernel", "nccl", "mkernel/nccl");
  auto row = [&](const char* what, double a, double b) {
    if (n && n->ran)
      printf("# %-58s %10.2f %10.2f %14.2f\n", what, a, b, a / b);
    else
      printf("# %-58s %10.2f %10s %14s\n", what, a, "-", "-");
  };
  const SingleRank z;
  const SingleRank& b = (n && n->ran) ? *n : z;
  row("latency, call to completion, median", m.callMed, b.callMed);
  row("latency, call to completion, p10", m.callP10, b.callP10);
  row("latency, call to completion, p90", m.callP90, b.callP90);
  row("latency, device side (op queued behind a spin), median", m.gpuMed, b.gpuMed);
  row("per op, 1000 calls back to back", m.b2bUs, b.b2bUs);
  row("per op, CUDA graph of 100 calls, median of 20 launches", m.graphUs, b.graphUs);
  row("host time per ncclAllReduce call (no sync), mean", m.hostUs, b.hostUs);
  row("host time per call, median of batches of 250", m.hostBatchMedUs, b.hostBatchMedUs);
  if (!m.graphNote.empty()) printf("#   mkernel graph: %s\n", m.graphNote.c_str());
  if (n && !n->graphNote.empty()) printf("#   nccl graph: %s\n", n->graphNote.c_str());
}

// ---------------------------------------------------------------------------------------------
// (b) N ranks sharing one GPU, one thread, ncclGroupStart/End around the N calls.
enum Coll { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce };
const char* kCollNames[] = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce"};

struct Shared {
  const NcclApi* api = nullptr;
  int n = 0;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  std::vector<float*> send, recv;
  size_t capacity = 0;  // bytes of each buffer
  unsigned long long* bad = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  std::vector<cudaEvent_t> joins;
  int reg = 0;                                 // Options::reg: buffers from ncclMemAlloc when > 0
  std::vector<void*> sendReg, recvReg;         // ncclCommRegister handles (reg 1)
  std::vector<ncclWindow_t> sendWin, recvWin;  // windows (reg 2)
};

const char* regName(int reg) {
  return reg == 3   ? "ncclMemAlloc, not registered"
         : reg == 2 ? "windows (ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC)"
         : reg == 1 ? "registered (ncclCommRegister)"
                    : "cudaMalloc, not registered";
}

struct Row {
  std::string coll;
  size_t bytes = 0, count = 0;
  int root = -1;
  double timeUs = NAN, algbw = NAN, busbw = NAN;
  // Host time of the timed loop per call (enqueue only): near timeUs, the host bounds the row.
  double hostUs = NAN;
  unsigned long long wrong = 0;
  std::string error;  // non-empty: the collective returned an error, no timing
};

double busFactor(Coll c, int n) {
  switch (c) {
    case kAllReduce:
      return 2.0 * (n - 1) / n;
    case kAllGather:
    case kReduceScatter:
      return double(n - 1) / n;
    default:
      return 1.0;
  }
}

// Issues one collective on every rank of the shared GPU (inside a group). Returns the first
// error (the group is always closed) so that a failing collective does not end the benchmark.
ncclResult_t launch(Shared& sh, Coll c, size_t elems) {
  const NcclApi& api = *sh.api;
  const int n = sh.n;
  ncclResult_t first = api.groupStart();
  if (first != ncclSuccess) return first;
  for (int r = 0; r < n && first == ncclSuccess; ++r) {
    cudaStream_t s = sh.streams[r];
    ncclComm_t comm = sh.comms[r];
    switch (c) {
      case kAllReduce:
        first = api.allReduce(sh.send[r], sh.recv[r], elems, ncclFloat, ncclSum, comm, s);
        break;
      case kAllGather:
        first = api.allGather(sh.send[r], sh.recv[r], elems / n, ncclFloat, comm, s);
        break;
      case kReduceScatter:
        first = api.reduceScatter(sh.send[r], sh.recv[r], elems / n, ncclFloat, ncclSum, comm, s);
        break;
      case kBroadcast:
        first = api.broadcast(sh.send[r], sh.recv[r], elems, ncclFloat, 0, comm, s);
        break;
      case kReduce:
        first = api.reduce(sh.send[r], sh.recv[r], elems, ncclFloat, ncclSum, 0, comm, s);
        break;
    }
  }
  ncclResult_t end = api.groupEnd();
  return first != ncclSuccess ? first : end;
}

// Times `iters` back-to-back calls (after `warmup`), then checks every rank's output.
Row timeColl(Shared& sh, Coll c, size_t bytes, int iters, int warmup) {
  const int n = sh.n;
  Row row;
  row.coll = kCollNames[c];
  size_t elems = bytes / sizeof(float);
  if (c == kAllGather || c == kReduceScatter) elems = elems / n * n;
  row.bytes = elems * sizeof(float);
  row.count = elems;
  row.root = (c == kBroadcast || c == kReduce) ? 0 : -1;
  if (elems == 0) return row;
  size_t outElems = c == kReduceScatter ? elems / n : elems;
  for (int r = 0; r < n; ++r)
    CB_CUDA(cudaMemsetAsync(sh.recv[r], 0xFF, outElems * sizeof(float), sh.streams[r]));  // NaN
  for (int r = 0; r < n; ++r) CB_CUDA(cudaStreamSynchronize(sh.streams[r]));
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < warmup && res == ncclSuccess; ++i) res = launch(sh, c, elems);
  CB_CUDA(cudaEventRecord(sh.start, sh.streams[0]));
  for (int r = 1; r < n; ++r) CB_CUDA(cudaStreamWaitEvent(sh.streams[r], sh.start, 0));
  const auto h0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters && res == ncclSuccess; ++i) res = launch(sh, c, elems);
  row.hostUs =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count() /
      iters;
  if (res != ncclSuccess) {
    row.error = std::string(sh.api->errorString(res)) + " " + sh.api->lastError();
    for (int r = 0; r < n; ++r) cudaStreamSynchronize(sh.streams[r]);
    cudaGetLastError();
    return row;
  }
  for (int r = 1; r < n; ++r) {
    CB_CUDA(cudaEventRecord(sh.joins[r], sh.streams[r]));
    CB_CUDA(cudaStreamWaitEvent(sh.streams[0], sh.joins[r], 0));
  }
  CB_CUDA(cudaEventRecord(sh.stop, sh.streams[0]));
  CB_CUDA(cudaEventSynchronize(sh.stop));
  row.timeUs = 1000.0 * elapsedMs(sh.start, sh.stop) / iters;
  row.algbw = row.bytes / (row.timeUs * 1e-6) / 1e9;
  row.busbw = row.algbw * busFactor(c, n);

  const float sum = n * (n + 1) / 2.0f;  // rank r contributes r + 1
  CB_CUDA(cudaMemsetAsync(sh.bad, 0, sizeof(*sh.bad), sh.streams[0]));
  for (int r = 0; r < n; ++r) {
    if (c == kReduce && r != 0) continue;
    size_t chunk = c == kAllGather ? elems / n : 0;
    float value = c == kBroadcast ? 1.0f : sum;
    checkKernel<<<1024, 256, 0, sh.streams[0]>>>(sh.recv[r], outElems, chunk, value, sh.bad);
    CB_CUDA(cudaGetLastError());
  }
  CB_CUDA(cudaMemcpyAsync(&row.wrong, sh.bad, sizeof(row.wrong), cudaMemcpyDeviceToHost,
                          sh.streams[0]));
  CB_CUDA(cudaStreamSynchronize(sh.streams[0]));
  return row;
}

bool setupShared(Shared& sh, const NcclApi& api, const Options& o, std::string* err) {
  sh.api = &api;
  sh.n = o.ranks;
  CB_CUDA(cudaSetDevice(o.device));
  sh.comms.resize(sh.n);
  std::vector<int> devs(sh.n, o.device);
  ncclResult_t res = api.commInitAll(sh.comms.data(), sh.n, devs.data());
  if (res != ncclSuccess) {
    *err = std::string("ncclCommInitAll of ") + std::to_string(sh.n) + " ranks on device " +
           std::to_string(o.device) + " failed: " + api.errorString(res) + " " + api.lastError();
    return false;
  }
  sh.capacity = std::max(o.maxBytes, o.bigBytes);
  sh.streams.resize(sh.n);
  sh.send.resize(sh.n);
  sh.recv.resize(sh.n);
  sh.joins.resize(sh.n);
  sh.reg = o.reg;
  for (int r = 0; r < sh.n; ++r) {
    CB_CUDA(cudaStreamCreateWithFlags(&sh.streams[r], cudaStreamNonBlocking));
    if (sh.reg > 0) {  // mkernel only (the shared part never runs the real NCCL)
      CB_NCCL(api, ncclMemAlloc(reinterpret_cast<void**>(&sh.send[r]), sh.capacity));
      CB_NCCL(api, ncclMemAlloc(reinterpret_cast<void**>(&sh.recv[r]), sh.capacity));
    } else {
      CB_CUDA(cudaMalloc(&sh.send[r], sh.capacity));
      CB_CUDA(cudaMalloc(&sh.recv[r], sh.capacity));
    }
    CB_CUDA(cudaEventCreateWithFlags(&sh.joins[r], cudaEventDisableTiming));
    fill(sh.send[r], sh.capacity / sizeof(float), float(r + 1), sh.streams[r]);
  }
  // Registration as nccl-tests -R does it: every rank in one group (windows are collective).
  sh.sendReg.assign(sh.n, nullptr);
  sh.recvReg.assign(sh.n, nullptr);
  sh.sendWin.assign(sh.n, nullptr);
  sh.recvWin.assign(sh.n, nullptr);
  if (sh.reg == 1 || sh.reg == 2) {
    CB_NCCL(api, ncclGroupStart());
    for (int r = 0; r < sh.n; ++r) {
      if (sh.reg == 1) {
        CB_NCCL(api, ncclCommRegister(sh.comms[r], sh.send[r], sh.capacity, &sh.sendReg[r]));
        CB_NCCL(api, ncclCommRegister(sh.comms[r], sh.recv[r], sh.capacity, &sh.recvReg[r]));
      } else {
        CB_NCCL(api, ncclCommWindowRegister(sh.comms[r], sh.send[r], sh.capacity, &sh.sendWin[r],
                                            NCCL_WIN_COLL_SYMMETRIC));
        CB_NCCL(api, ncclCommWindowRegister(sh.comms[r], sh.recv[r], sh.capacity, &sh.recvWin[r],
                                            NCCL_WIN_COLL_SYMMETRIC));
      }
    }
    CB_NCCL(api, ncclGroupEnd());
  }
  CB_CUDA(cudaMalloc(&sh.bad, sizeof(*sh.bad)));
  CB_CUDA(cudaEventCreate(&sh.start));
  CB_CUDA(cudaEventCreate(&sh.stop));
  CB_CUDA(cudaDeviceSynchronize());
  return true;
}

void teardownShared(Shared& sh) {
  for (int r = 0; r < sh.n; ++r) {
    if (sh.sendWin[r]) CB_NCCL(*sh.api, ncclCommWindowDeregister(sh.comms[r], sh.sendWin[r]));
    if (sh.recvWin[r]) CB_NCCL(*sh.api, ncclCommWindowDeregister(sh.comms[r], sh.recvWin[r]));
    if (sh.sendReg[r]) CB_NCCL(*sh.api, ncclCommDeregister(sh.comms[r], sh.sendReg[r]));
    if (sh.recvReg[r]) CB_NCCL(*sh.api, ncclCommDeregister(sh.comms[r], sh.recvReg[r]));
  }
  for (int r = 0; r < sh.n; ++r) CB_NCCL(*sh.api, sh.api->commDestroy(sh.comms[r]));
  for (int r = 0; r < sh.n; ++r) {
    if (sh.reg > 0) {
      ncclMemFree(sh.send[r]);
      ncclMemFree(sh.recv[r]);
    } else {
      cudaFree(sh.send[r]);
      cudaFree(sh.recv[r]);
    }
    cudaStreamDestroy(sh.streams[r]);
    cudaEventDestroy(sh.joins[r]);
  }
  cudaFree(sh.bad);
  cudaEventDestroy(sh.start);
  cudaEventDestroy(sh.stop);
}

// Median time of a D2D cudaMemcpy of `bytes`; returns bytes moved (read + written) per second.
double copyBandwidth(Shared& sh, size_t bytes) {
  cudaStream_t s = sh.streams[0];
  float* src = sh.recv[0];
  float* dst = sh.recv[sh.n > 1 ? 1 : 0] + (sh.n > 1 ? 0 : bytes / 2 / sizeof(float));
  if (sh.n == 1) bytes /= 2;
  std::vector<double> v;
  for (int i = 0; i < 12; ++i) {
    CB_CUDA(cudaEventRecord(sh.start, s));
    CB_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
    CB_CUDA(cudaEventRecord(sh.stop, s));
    CB_CUDA(cudaEventSynchronize(sh.stop));
    if (i >= 2) v.push_back(elapsedMs(sh.start, sh.stop) * 1e-3);
  }
  return 2.0 * bytes / median(v);
}

struct BoundResult {
  double copyRW = NAN;        // bytes read+written per second by cudaMemcpy D2D
  double minPerRank = NAN;    // bytes moved per rank at least (2 B: inputs read, outputs written)
  double naivePerRank = NAN;  // staged through the workspace ((5n-2)/n B; separate processes)
  double boundTimeUs = NAN, boundBusbw = NAN, naiveBusbw = NAN;
  Row measured;
  double ratio = NAN, naiveRatio = NAN;
};

void printBoundModel(int n) {
  printf(
      "#   HBM bound model: on one GPU every byte of every rank goes through the same HBM.\n"
      "#   Any AllReduce must read every input element once and write every output element\n"
      "#   once: at least 2 B bytes per rank. The ranks here are threads of one process on\n"
      "#   one GPU, so mkernel's zero-copy AllReduce moves exactly that (rank q reads segment\n"
      "#   q of all inputs, writes it to all outputs). BOUND: T_min = n * 2 B / (cudaMemcpy\n"
      "#   D2D read+write bandwidth); the target is checked against it.\n"
      "#   For reference, ranks in separate processes without registered buffers must stage:\n"
      "#   per element n input reads + n output writes, n-1 cross-rank transfers (write +\n"
      "#   read) for the reduction, 1 write + n-1 reads to spread the result: (5n-2)/n B =\n"
      "#   %.2f B per rank for n=%d (the 'staged bound' below).\n",
      (5.0 * n - 2) / n, n);
}

BoundResult measureBound(Shared& sh, const Options& o) {
  BoundResult b;
  const int n = sh.n;
  const double B = double(o.bigBytes / sizeof(float) * sizeof(float));
  b.copyRW = copyBandwidth(sh, o.bigBytes);
  b.minPerRank = 2.0 * B;
  b.naivePerRank = (5.0 * n - 2) / n * B;
  double tMin = n * b.minPerRank / b.copyRW, tNaive = n * b.naivePerRank / b.copyRW;
  b.boundTimeUs = tMin * 1e6;
  b.boundBusbw = B / tMin / 1e9 * busFactor(kAllReduce, n);
  b.naiveBusbw = B / tNaive / 1e9 * busFactor(kAllReduce, n);
  b.measured = timeColl(sh, kAllReduce, o.bigBytes, 20, 5);
  b.ratio = b.measured.busbw / b.boundBusbw;
  b.naiveRatio = b.measured.busbw / b.naiveBusbw;
  return b;
}

int itersFor(const Options& o, size_t bytes) {
  if (o.iters > 0) return o.iters;
  if (bytes <= (size_t(1) << 20)) return 200;
  if (bytes <= (size_t(32) << 20)) return 50;
  return 20;
}

void printRowHeader(const char* what) {
  printf("#\n# %s\n", what);
  printf("# %10s %12s %8s %6s %6s %10s %8s %8s %8s %8s\n", "size", "count", "type", "redop", "root",
         "time", "algbw", "busbw", "#wrong", "host");
  printf("# %10s %12s %8s %6s %6s %10s %8s %8s %8s %8s\n", "(B)", "(elements)", "", "", "", "(us)",
         "(GB/s)", "(GB/s)", "", "(us)");
}

void printRow(const Row& r) {
  const char* op = (r.coll == "allgather" || r.coll == "broadcast") ? "none" : "sum";
  if (!r.error.empty()) {
    printf("  %10zu %12zu %8s %6s %6d  FAIL: %s\n", r.bytes, r.count, "float", op, r.root,
           r.error.c_str());
    return;
  }
  printf("  %10zu %12zu %8s %6s %6d %10.2f %8.2f %8.2f %8llu %8.2f\n", r.bytes, r.count, "float",
         op, r.root, r.timeUs, r.algbw, r.busbw, r.wrong, r.hostUs);
}

void jsonSingle(Json& j, const char* key, const SingleRank& s) {
  j.beginObject(key);
  j.str("library", s.lib).integer("version", s.version).boolean("ran", s.ran);
  j.str("error", s.error).boolean("result_correct", s.correct);
  j.num("latency_call_median_us", s.callMed).num("latency_call_p10_us", s.callP10);
  j.num("latency_call_p90_us", s.callP90).num("latency_device_median_us", s.gpuMed);
  j.num("latency_device_p10_us", s.gpuP10).num("latency_device_p90_us", s.gpuP90);
  j.num("back_to_back_per_op_us", s.b2bUs).num("graph_per_op_us", s.graphUs);
  j.str("graph_note", s.graphNote);
  j.num("host_per_call_us", s.hostUs).num("host_per_call_batch_median_us", s.hostBatchMedUs);
  j.endObject();
}

void jsonRow(Json& j, const Row& r) {
  j.beginObject();
  j.str("coll", r.coll).integer("size_bytes", static_cast<long long>(r.bytes));
  j.integer("count", static_cast<long long>(r.count)).str("type", "float");
  j.str("redop", (r.coll == "allgather" || r.coll == "broadcast") ? "none" : "sum");
  j.integer("root", r.root).num("time_us", r.timeUs).num("algbw_GBps", r.algbw);
  j.num("busbw_GBps", r.busbw).integer("wrong", static_cast<long long>(r.wrong));
  j.num("host_enqueue_us", r.hostUs);
  if (!r.error.empty()) j.str("error", r.error);
  j.endObject();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parseArgs(argc, argv, &o)) return 2;
  armWatchdog(o.timeoutS);
  setvbuf(stdout, nullptr, _IOLBF, 0);

  const std::string cmd = benchargs::commandLine(argc, argv);
  const std::string srcDir = dirName(__FILE__);  // .../bench
  bool dirty = false;
  const std::string commit = benchCommit(srcDir, &dirty);
  const std::string date = timeStamp("%Y-%m-%dT%H:%M:%S%z");

  int ndev = 0;
  CB_CUDA(cudaGetDeviceCount(&ndev));
  if (o.device >= ndev) {
    fprintf(stderr, "coll_bench: FAIL device %d requested, %d visible\n", o.device, ndev);
    return 1;
  }
  CB_CUDA(cudaSetDevice(o.device));
  cudaDeviceProp prop;
  CB_CUDA(cudaGetDeviceProperties(&prop, o.device));
  printf("# coll_bench: %s\n# commit %s%s, %s\n", cmd.c_str(), commit.c_str(),
         dirty ? " (dirty tree)" : "", date.c_str());
  printf("# device %d: %s, %d SMs, %.1f GiB, compute capability %d.%d\n", o.device, prop.name,
         prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, prop.major, prop.minor);

  std::vector<std::string> failures;
  NcclApi mk = mkernelApi();
  NcclApi real;
  bool haveReal = false;
  std::string realErr;
  if (o.single && o.useReal) {
    std::string path = o.realNccl;
    if (path.empty()) {  // PyTorch's pip package first (what torch loads), then the loader's
      path = runCommand(
          "python3 -c \"import glob, os, nvidia.nccl as m; "
          "d = list(m.__path__) + ([os.path.dirname(m.__file__)] if m.__file__ else []); "
          "print(sorted(sum([glob.glob(x + '/lib/libnccl.so*') for x in d], []))[-1])\" "
          "2>/dev/null");
      if (path.empty()) path = "libnccl.so.2";
    }
    haveReal = loadRealNccl(path, &real, &realErr);
    if (!haveReal)
      printf("# real NCCL not used: %s (set MK_REAL_NCCL or --real-nccl)\n", realErr.c_str());
  }

  SingleRank sMk, sReal;
  if (o.single) {
    setPhase("(a) one-rank measurements, mkernel");
    sMk = measureSingleRank(mk, o);
    if (!sMk.ran)
      failures.push_back("(a) mkernel: " + sMk.error);
    else if (!sMk.correct)
      failures.push_back("(a) mkernel 1-rank AllReduce result wrong");
    if (haveReal) {
      setPhase("(a) one-rank measurements, real NCCL");
      sReal = measureSingleRank(real, o);
    }
    printSingle(sMk, haveReal ? &sReal : nullptr);
  }

  Shared sh;
  bool sharedOk = false;
  std::string sharedErr;
  BoundResult bound;
  std::vector<Row> rows;
  if (o.shared || o.sweep) {
    setPhase("(b) ncclCommInitAll of the ranks sharing the GPU");
    sharedOk = setupShared(sh, mk, o, &sharedErr);
    if (!sharedOk) {
      printf("# FAIL %s\n", sharedErr.c_str());
      failures.push_back(sharedErr);
    }
  }
  if (sharedOk && o.shared) {
    setPhase("(b) 256 MiB AllReduce vs HBM bound");
    printf(
        "#\n# (b) %d ranks sharing GPU %d (mkernel; one thread, ncclGroupStart/End), float "
        "AllReduce of %zu bytes; buffers: %s\n",
        sh.n, o.device, o.bigBytes, regName(sh.reg));
    printBoundModel(sh.n);
    bound = measureBound(sh, o);
    printf("#   cudaMemcpy D2D: %.1f GB/s read+written (%.1f GB/s copied)\n", bound.copyRW / 1e9,
           bound.copyRW / 2e9);
    printf("#   bound: %.1f us, busbw %.1f GB/s (staged bound: busbw %.1f GB/s)\n",
           bound.boundTimeUs, bound.boundBusbw, bound.naiveBusbw);
    if (!bound.measured.error.empty())
      printf("#   measured: FAIL %s\n", bound.measured.error.c_str());
    else
      printf("#   measured: %.1f us, algbw %.1f GB/s, busbw %.1f GB/s, #wrong %llu\n",
             bound.measured.timeUs, bound.measured.algbw, bound.measured.busbw,
             bound.measured.wrong);
    printf("#   achieved/bound = %.1f%% (target >= 60%%: %s); vs staged bound %.1f%%\n",
           100 * bound.ratio, bound.ratio >= 0.6 ? "MET" : "NOT MET", 100 * bound.naiveRatio);
    if (!bound.measured.error.empty())
      failures.push_back("(b) big AllReduce failed: " + bound.measured.error);
    if (bound.measured.wrong) failures.push_back("(b) big AllReduce produced wrong values");
  }
  if (sharedOk && o.sweep) {
    for (const std::string& name : benchargs::splitList(o.colls)) {
      int c = -1;
      for (int k = 0; k < 5; ++k)
        if (name == kCollNames[k]) c = k;
      if (c < 0) {
        printf("# unknown collective '%s' skipped\n", name.c_str());
        continue;
      }
      std::string title = std::string(kCollNames[c]) + ", " + std::to_string(sh.n) +
                          " ranks sharing GPU " + std::to_string(o.device) + " (mkernel; " +
                          regName(sh.reg) + ")";
      printRowHeader(title.c_str());
      for (size_t bytes = o.minBytes; bytes <= o.maxBytes; bytes *= o.stepFactor) {
        static std::string phase;
        phase = "sweep " + name + " " + std::to_string(bytes) + " bytes";
        setPhase(phase.c_str());
        Row r = timeColl(sh, static_cast<Coll>(c), bytes, itersFor(o, bytes), o.warmup);
        if (r.count == 0) continue;
        printRow(r);
        rows.push_back(r);
        if (r.wrong) failures.push_back("sweep " + name + " " + std::to_string(bytes) + " B wrong");
        if (!r.error.empty()) {
          failures.push_back("sweep " + name + " " + std::to_string(bytes) + " B: " + r.error);
          break;  // the rest of this collective would fail the same way
        }
      }
    }
  }
  if (sharedOk) teardownShared(sh);

  // JSON
  Json j;
  j.beginObject();
  j.str("benchmark", "coll_bench").str("command", cmd).str("git_commit", commit);
  j.boolean("git_dirty", dirty).str("date", date);
  j.beginObject("device");
  j.integer("index", o.device).str("name", prop.name).integer("sm_count", prop.multiProcessorCount);
  j.integer("memory_bytes", static_cast<long long>(prop.totalGlobalMem));
  j.str("compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor));
  j.endObject();
  if (o.single) {
    j.beginObject("single_rank_allreduce_8B");
    jsonSingle(j, "mkernel", sMk);
    if (haveReal) {
      jsonSingle(j, "nccl", sReal);
      j.beginObject("ratio_mkernel_over_nccl");
      j.num("latency_call_median", sMk.callMed / sReal.callMed);
      j.num("latency_device_median", sMk.gpuMed / sReal.gpuMed);
      j.num("back_to_back_per_op", sMk.b2bUs / sReal.b2bUs);
      j.num("graph_per_op", sMk.graphUs / sReal.graphUs);
      j.num("host_per_call", sMk.hostUs / sReal.hostUs);
      j.endObject();
    } else {
      j.str("nccl_unavailable", realErr.empty() ? "disabled" : realErr);
    }
    j.endObject();
  }
  if (o.shared || o.sweep) {
    j.beginObject("shared_gpu");
    j.integer("ranks", o.ranks).boolean("setup_ok", sharedOk).str("setup_error", sharedErr);
    j.integer("reg", o.reg).str("buffers", regName(o.reg));
    // Launches planned zero-copy (coll/zc_plan.h), per collective, over the whole run.
    j.beginObject("zero_copy_launches");
    for (mk::CollType t :
         {mk::CollType::kAllReduce, mk::CollType::kAllGather, mk::CollType::kReduceScatter,
          mk::CollType::kBroadcast, mk::CollType::kReduce})
      j.integer(mk::collName(t), static_cast<long long>(mk::zcTakenCount(t)));
    j.endObject();
    if (sharedOk && o.shared) {
      j.integer("allreduce_bytes", static_cast<long long>(o.bigBytes));
      j.num("memcpy_d2d_rw_GBps", bound.copyRW / 1e9);
      j.str("bound_model",
            "2 B bytes read+written per rank through HBM (inputs read once, outputs written once)");
      j.num("bound_bytes_per_rank", bound.minPerRank).num("bound_time_us", bound.boundTimeUs);
      j.num("bound_busbw_GBps", bound.boundBusbw).num("staged_bound_busbw_GBps", bound.naiveBusbw);
      j.num("time_us", bound.measured.timeUs).num("algbw_GBps", bound.measured.algbw);
      j.num("busbw_GBps", bound.measured.busbw);
      j.integer("wrong", static_cast<long long>(bound.measured.wrong));
      j.num("achieved_over_bound", bound.ratio).num("achieved_over_staged_bound", bound.naiveRatio);
    }
    j.beginArray("sweep");
    for (const Row& r : rows) jsonRow(j, r);
    j.endArray();
    j.endObject();
  }
  j.beginArray("failures");
  for (const std::string& f : failures) j.str(nullptr, f);
  j.endArray();
  j.endObject();

  std::string out = o.out;
  if (out.empty()) {
    std::string dir = srcDir + "/results";
    if (!makeDirs(dir)) dir = ".";
    out = dir + "/coll_" + timeStamp("%Y-%m-%d_%H%M%S") + ".json";
  } else {
    makeDirs(dirName(out));
  }
  FILE* f = fopen(out.c_str(), "w");
  if (f != nullptr) {
    fprintf(f, "%s\n", j.text().c_str());
    fclose(f);
    printf("#\n# results written to %s\n", out.c_str());
  } else {
    printf("#\n# FAIL could not write %s\n", out.c_str());
    failures.push_back("could not write " + out);
  }
  for (const std::string& fl : failures) printf("# FAIL %s\n", fl.c_str());
  printf("coll_bench: %s\n", failures.empty() ? "OK" : "FAIL");
  alarm(0);
  return failures.empty() ? 0 : 1;
}
