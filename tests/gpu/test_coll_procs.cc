// Collectives with the ranks as separate PROCESSES sharing GPU 0 (test_coll_reduce.cc,
// test_coll_copy.cc and test_coll_p2p.cc run them as threads of one process). Each parent
// test starts N children (this binary running only CollProcsChild.Run, exec'd: fork after
// CUDA initialisation is not allowed); each child is one rank (ncclCommInitRank) and runs
// the same deterministic list of cases. Every child derives every rank's input from the
// shared seed, so it computes the reference of its own output locally: reductions within
// the rounding bound of test_coll_util (integers exact, every rank its own PreMulSum
// scalar), copies byte for byte; outputs are poisoned first and the bytes after an
// out-of-place output must stay poisoned; AllReduce results must be bit-identical on every
// rank (hashes exchanged with an AllGather). A child prints one line per failing case and
// exits non-zero. Without CUDA MPS the processes' kernels are time-sliced (a flag round trip
// can take milliseconds): correct, only slower, hence few, well-chosen cases.
//
// Coverage across N = 2, 3, 4, 8: every (dtype, op) pair of the reductions once (AllReduce,
// Reduce, ReduceScatter in turn), every copy collective (AllGather, Broadcast, AlltoAll,
// Gather, Scatter, Send/Recv ring) at counts 0/1/7/1023/1M+3 with rotating dtypes, in and out
// of place, AllReduce forced to oneshot/twoshot/ring, 200 random back-to-back small
// collectives checked at the end; 64M-float AllReduce once (N=4); registered (cudaMalloc and
// ncclMemAlloc) send/receive buffers with AllReduce of 16M+5 and 64M floats and every other
// collective from 4 MiB (N=4); windows with every collective, in and out of place (N=4).
// Cases marked zc fail when the zero-copy path did not run (coll/zc_plan.h counters).
#include <cstdint>
#include <utility>
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "coll/zc_plan.h"
#include "common/test_util.h"
#include "gpu/test_coll_procs_cases.h"
#include "gpu/test_coll_util.h"
#include "gpu/test_proc_util.h"

using namespace colltest;
using namespace procstest;

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kSlack = 64;  // poisoned bytes after every out-of-place output

// ---- one child: one rank ----------------------------------------------------------------
// Device memory from cudaMalloc or ncclMemAlloc.
struct Mem {
  void* p = nullptr;
  size_t bytes = 0;
  bool fromNccl = false;
  Mem() = default;
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;
  ~Mem() {
    if (p) fromNccl ? (void)ncclMemFree(p) : (void)cudaFree(p);
  }
  std::string alloc(size_t b, bool nccl) {
    bytes = b;
    fromNccl = nccl;
    if (nccl) {
      ncclResult_t r = ncclMemAlloc(&p, b);
      if (r != ncclSuccess) {
        p = nullptr;
        return "ncclMemAlloc(" + std::to_string(b) + ") failed: " + ncclGetErrorString(r);
      }
    } else if (cudaMalloc(&p, b) != cudaSuccess) {
      p = nullptr;
      cudaGetLastError();
      return "cudaMalloc(" + std::to_string(b) + ") failed";
    }
    return "";
  }
  char* at(size_t off) const { return (char*)p + off; }
};

struct Ctx {
  int n = 0, me = 0;
  uint64_t seed = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int cases = 0, failures = 0;
  bool broken = false;  // a call failed or timed out: the ranks no longer agree, stop
};

std::string firstLine(const std::string& e) {
  size_t b = e.find_first_not_of("\n ");
  if (b == std::string::npos) return e;
  size_t end = e.find('\n', b);
  return e.substr(b, end == std::string::npos ? std::string::npos : end - b);
}

void report(Ctx& x, const std::string& name, const std::string& what) {
  x.failures++;
  std::string line = "[CollProcs n=" + std::to_string(x.n) + " rank " + std::to_string(x.me) +
                     "] FAIL " + name + ": " + firstLine(what) + "\n";
  fputs(line.c_str(), stderr);
}

// Waits (polling, bounded) for the rank's stream; "" or why not.
std::string waitDone(Ctx& x, double timeoutS) {
  auto t0 = Clock::now();
  for (;;) {
    cudaError_t e = cudaStreamQuery(x.stream);
    if (e == cudaSuccess) return "";
    if (e != cudaErrorNotReady) return std::string("CUDA error ") + cudaGetErrorString(e);
    ncclResult_t a = ncclSuccess;
    if (ncclCommGetAsyncError(x.comm, &a) == ncclSuccess && a != ncclSuccess && a != ncclInProgress)
      return std::string("async error ") + ncclGetErrorString(a) + ": " + ncclGetLastError(x.comm);
    if (std::chrono::duration<double>(Clock::now() - t0).count() > timeoutS)
      return "timed out after " + std::to_string((int)timeoutS) +
             " s (deadlock, lost message, or a rank that gave up)";
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

uint64_t nameSeed(uint64_t seed, const std::string& name) {
  uint64_t h = seed;
  for (char ch : name) h = (h ^ (uint8_t)ch) * 1099511628211ull;
  return h;
}

// One collective of one rank: every rank's inputs (those this rank needs), its buffers.
struct Prepared {
  Case c;
  std::string name;
  uint64_t seed = 0;
  size_t es = 0, sendN = 0, recvN = 0;
  std::vector<HostBuf> in;  // in[q]: rank q's input (empty where not needed here)
  std::vector<uint64_t> scalars;
  Mem sendM, recvM, scalarM;  // in place: sendM only
  const void* sp = nullptr;
  void* rp = nullptr;
  std::vector<void*> handles;  // ncclCommRegister handles
  std::vector<ncclWindow_t> windows;
};

bool needInput(const Case& c, int q, int me, int n) {
  if (isRed(c.k)) return true;
  if (c.k == K::kBroadcast || c.k == K::kScatter) return q == c.root || q == me;
  if (c.k == K::kSendRecv) return q == me || q == (me + n - 1) % n;
  return true;
}

// Allocates (and registers) the buffers.
std::string allocate(Ctx& x, Prepared& p) {
  const Case& c = p.c;
  p.es = dtInfo(c.dt).size;
  p.sendN = sendElems(c, x.n);
  p.recvN = recvElems(c, x.n);
  const bool nccl = c.reg == kRegMemAlloc || c.reg == kRegWindow;
  const size_t B = c.count * p.es;
  std::string e;
  if (c.inplace) {
    e = p.sendM.alloc(std::max(p.sendN, p.recvN) * p.es + kSlack, nccl);
    if (!e.empty()) return e;
    char* b = p.sendM.at(0);
    switch (c.k) {
      case K::kAllGather:
      case K::kGather:
        p.rp = b;
        p.sp = b + x.me * B;
        break;
      case K::kReduceScatter:
      case K::kScatter:
        p.sp = b;
        p.rp = b + x.me * B;
        break;
      default:
        p.sp = p.rp = b;
    }
  } else {
    e = p.sendM.alloc(p.sendN * p.es + kSlack, nccl);
    if (e.empty()) e = p.recvM.alloc(p.recvN * p.es + kSlack, nccl);
    if (!e.empty()) return e;
    p.sp = p.sendM.p;
    p.rp = p.recvM.p;
  }
  if (c.op == Op::kPreMulDev) {
    e = p.scalarM.alloc(16, false);
    if (!e.empty()) return e;
  }
  if (c.reg == kRegWindow) {
    for (Mem* m : {&p.sendM, &p.recvM}) {
      if (!m->p) continue;
      ncclWindow_t w = nullptr;
      ncclResult_t r = ncclCommWindowRegister(x.comm, m->p, m->bytes, &w, NCCL_WIN_COLL_SYMMETRIC);
      if (r != ncclSuccess || w == nullptr)
        return std::string("ncclCommWindowRegister failed: ") + ncclGetErrorString(r) + ": " +
               ncclGetLastError(x.comm);
      p.windows.push_back(w);
    }
  } else if (c.reg != kNoReg) {
    for (Mem* m : {&p.sendM, &p.recvM}) {
      if (!m->p) continue;
      void* h = nullptr;
      ncclResult_t r = ncclCommRegister(x.comm, m->p, m->bytes, &h);
      if (r != ncclSuccess)
        return std::string("ncclCommRegister failed: ") + ncclGetErrorString(r) + ": " +
               ncclGetLastError(x.comm);
      p.handles.push_back(h);
    }
  }
  return "";
}

// Fresh inputs (rep-th call on these buffers), poisoned outputs, uploads.
std::string load(Ctx& x, Prepared& p, int rep) {
  const Case& c = p.c;
  const int n = x.n;
  p.seed = nameSeed(x.seed, p.name) + 0x9e3779b97f4a7c15ull * rep;
  p.in.assign(n, HostBuf());
  p.scalars.assign(n, 0);
  for (int q = 0; q < n; q++) {
    if (!needInput(c, q, x.me, n)) continue;
    if (isRed(c.k)) {
      fillRandom(p.in[q], c.dt, c.op, p.sendN, p.seed + 1000003ull * q);
      if (c.op == Op::kPreMulDev || c.op == Op::kPreMulHost)
        p.scalars[q] = scalarFor(c.dt, p.seed + 7919ull * q);
    } else {
      // Copies move any bit pattern: random bytes.
      fillRandom(p.in[q], ncclUint8, Op::kSum, p.sendN * p.es, p.seed + 7919ull * q);
      p.in[q].size = p.es;
    }
  }
  Mem& out = c.inplace ? p.sendM : p.recvM;
  if (mktest::syncMemset(out.p, 0xCD, out.bytes) != cudaSuccess) return "cudaMemset failed";
  // In place, Broadcast and Scatter have no input on other ranks than the root: their
  // buffers stay poisoned.
  bool upload1 = !(c.inplace && (c.k == K::kBroadcast || c.k == K::kScatter) && x.me != c.root);
  if (upload1) upload((void*)p.sp, p.in[x.me], 0, p.sendN);
  if (c.op == Op::kPreMulDev && mktest::syncMemcpy(p.scalarM.p, &p.scalars[x.me], p.es,
                                                   cudaMemcpyHostToDevice) != cudaSuccess)
    return "scalar upload failed";
  return "";
}

ncclResult_t issue(Ctx& x, Prepared& p) {
  const Case& c = p.c;
  const int n = x.n;
  ncclComm_t comm = x.comm;
  cudaStream_t s = x.stream;
  if (isRed(c.k)) {
    ncclRedOp_t op = ncclSum;
    bool premul = false;
    switch (c.op) {
      case Op::kSum:
        op = ncclSum;
        break;
      case Op::kProd:
        op = ncclProd;
        break;
      case Op::kMax:
        op = ncclMax;
        break;
      case Op::kMin:
        op = ncclMin;
        break;
      case Op::kAvg:
        op = ncclAvg;
        break;
      case Op::kPreMulDev: {
        ncclResult_t r = ncclRedOpCreatePreMulSum(&op, p.scalarM.p, c.dt, ncclScalarDevice, comm);
        if (r != ncclSuccess) return r;
        premul = true;
        break;
      }
      case Op::kPreMulHost: {
        uint64_t local = p.scalars[x.me];
        ncclResult_t r = ncclRedOpCreatePreMulSum(&op, &local, c.dt, ncclScalarHostImmediate, comm);
        if (r != ncclSuccess) return r;
        premul = true;
        break;
      }
    }
    ncclResult_t r;
    if (c.k == K::kAllReduce)
      r = ncclAllReduce(p.sp, p.rp, c.count, c.dt, op, comm, s);
    else if (c.k == K::kReduce)
      r = ncclReduce(p.sp, p.rp, c.count, c.dt, op, c.root, comm, s);
    else
      r = ncclReduceScatter(p.sp, p.rp, c.count, c.dt, op, comm, s);
    // Destroying the op right after the call must not affect the running operation.
    if (premul) {
      ncclResult_t d = ncclRedOpDestroy(op, comm);
      if (r == ncclSuccess) r = d;
    }
    return r;
  }
  switch (c.k) {
    case K::kAllGather:
      return ncclAllGather(p.sp, p.rp, c.count, c.dt, comm, s);
    case K::kBroadcast:
      return ncclBroadcast(p.sp, p.rp, c.count, c.dt, c.root, comm, s);
    case K::kAlltoAll:
      return ncclAlltoAll(p.sp, p.rp, c.count, c.dt, comm, s);
    case K::kGather:
      return ncclGather(p.sp, p.rp, c.count, c.dt, c.root, comm, s);
    case K::kScatter:
      return ncclScatter(p.sp, p.rp, c.count, c.dt, c.root, comm, s);
    case K::kSendRecv: {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      ncclResult_t a = ncclSend(p.sp, c.count, c.dt, (x.me + 1) % n, comm, s);
      ncclResult_t b = ncclRecv(p.rp, c.count, c.dt, (x.me + n - 1) % n, comm, s);
      r = ncclGroupEnd();
      return a != ncclSuccess ? a : b != ncclSuccess ? b : r;
    }
    default:
      return ncclInternalError;
  }
}

// Compares this rank's output with the local reference; "" or the first failure. *got
// keeps the output (AllReduce: hashed for the bit-identity check).
std::string check(Ctx& x, Prepared& p, HostBuf* got) {
  const Case& c = p.c;
  const int n = x.n, me = x.me;
  if ((c.k == K::kReduce || c.k == K::kGather) && me != c.root) return "";
  const size_t es = p.es, B = c.count * es, outBytes = p.recvN * es;
  const size_t tail = c.inplace ? 0 : kSlack;
  download(*got, p.rp, outBytes + tail, 1);
  got->size = es;
  if (got->bytes.size() != outBytes + tail) return "download failed";
  std::string e;
  std::vector<const HostBuf*> inPtr(n);
  for (int q = 0; q < n; q++) inPtr[q] = &p.in[q];
  switch (c.k) {
    case K::kAllReduce:
    case K::kReduce:
      e = checkReduction(c.dt, c.op, inPtr, 0, *got, c.count, p.scalars);
      break;
    case K::kReduceScatter:
      e = checkReduction(c.dt, c.op, inPtr, (size_t)me * c.count, *got, c.count, p.scalars);
      break;
    case K::kAllGather:
    case K::kGather:
      for (int q = 0; q < n && e.empty(); q++)
        e = checkBytes(*got, q * B, p.in[q], 0, B,
                       ("block from rank " + std::to_string(q)).c_str());
      break;
    case K::kBroadcast:
      e = checkBytes(*got, 0, p.in[c.root], 0, B, "broadcast data");
      break;
    case K::kAlltoAll:
      for (int q = 0; q < n && e.empty(); q++)
        e = checkBytes(*got, q * B, p.in[q], me * B, B,
                       ("block from rank " + std::to_string(q)).c_str());
      break;
    case K::kScatter:
      e = checkBytes(*got, 0, p.in[c.root], me * B, B, "scattered block");
      break;
    case K::kSendRecv:
      e = checkBytes(*got, 0, p.in[(me + n - 1) % n], 0, B, "message from the previous rank");
      break;
  }
  for (size_t i = outBytes; i < outBytes + tail && e.empty(); i++)
    if (got->bytes[i] != 0xCD) {
      char b[96];
      snprintf(b, sizeof(b), "byte %zu after the output was overwritten (got 0x%02x want 0xcd)",
               i - outBytes, got->bytes[i]);
      e = b;
    }
  if (!e.empty()) e += " (seed " + std::to_string(x.seed) + ")";
  return e;
}

std::string releaseRegs(Ctx& x, Prepared& p) {
  std::string e;
  for (void* h : p.handles) {
    ncclResult_t r = ncclCommDeregister(x.comm, h);
    if (r != ncclSuccess && e.empty())
      e = std::string("ncclCommDeregister failed: ") + ncclGetErrorString(r);
  }
  p.handles.clear();
  for (ncclWindow_t w : p.windows) {
    ncclResult_t r = ncclCommWindowDeregister(x.comm, w);
    if (r != ncclSuccess && e.empty())
      e = std::string("ncclCommWindowDeregister failed: ") + ncclGetErrorString(r);
  }
  p.windows.clear();
  return e;
}

mk::CollType collTypeOf(K k) {
  switch (k) {
    case K::kAllReduce:
      return mk::CollType::kAllReduce;
    case K::kReduce:
      return mk::CollType::kReduce;
    case K::kReduceScatter:
      return mk::CollType::kReduceScatter;
    case K::kAllGather:
      return mk::CollType::kAllGather;
    case K::kBroadcast:
      return mk::CollType::kBroadcast;
    case K::kAlltoAll:
      return mk::CollType::kAlltoAll;
    case K::kGather:
      return mk::CollType::kGather;
    case K::kScatter:
      return mk::CollType::kScatter;
    default:
      return mk::CollType::kSend;
  }
}

uint64_t fnv(const HostBuf& h, size_t bytes) {
  uint64_t v = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; i++) v = (v ^ h.bytes[i]) * 1099511628211ull;
  return v;
}

// 1-element AllReduce: when it completes here, every rank finished its earlier work.
std::string barrier(Ctx& x) {
  Mem m;
  std::string e = m.alloc(16, false);
  if (!e.empty()) return e;
  ncclResult_t r = ncclAllReduce(m.p, m.p, 1, ncclInt32, ncclSum, x.comm, x.stream);
  if (r != ncclSuccess) return std::string("barrier AllReduce: ") + ncclGetErrorString(r);
  return waitDone(x, 60);
}

// All ranks' AllReduce outputs must be bit-identical: the hashes are AllGathered.
void checkIdentical(Ctx& x, const std::string& name, uint64_t mine) {
  Mem s, r;
  std::string e = s.alloc(8, false);
  if (e.empty()) e = r.alloc(8 * x.n, false);
  if (e.empty() && mktest::syncMemcpy(s.p, &mine, 8, cudaMemcpyHostToDevice) != cudaSuccess)
    e = "hash upload failed";
  if (e.empty()) {
    ncclResult_t res = ncclAllGather(s.p, r.p, 1, ncclUint64, x.comm, x.stream);
    if (res != ncclSuccess)
      e = std::string("hash AllGather: ") + ncclGetErrorString(res);
    else
      e = waitDone(x, 60);
  }
  if (!e.empty()) {
    x.broken = true;
    report(x, name + " (bit-identity check)", e);
    return;
  }
  std::vector<uint64_t> all(x.n);
  mktest::syncMemcpy(all.data(), r.p, 8 * x.n, cudaMemcpyDeviceToHost);
  for (int q = 0; q < x.n; q++)
    if (all[q] != mine) {
      report(x, name,
             "result is not bit-identical to rank " + std::to_string(q) + "'s (hash " +
                 std::to_string(mine) + " vs " + std::to_string(all[q]) + ")");
      return;
    }
}

double timeoutFor(const Prepared& p) {
  size_t bytes = std::max(p.sendN, p.recvN) * p.es;
  return bytes >= (32u << 20) ? 150 : 60;
}

void runOne(Ctx& x, const Case& c, int idx) {
  if (x.broken) return;
  std::optional<AlgoScope> algo;
  if (c.algo) algo.emplace(c.algo);
  Prepared p;
  p.c = c;
  p.name = "#" + std::to_string(idx) + " " + caseName(c);
  x.cases++;
  std::string e = allocate(x, p);
  for (int rep = 0; rep < c.reps && e.empty(); rep++) {
    e = load(x, p, rep);
    if (!e.empty()) break;
    const uint64_t zc0 = mk::zcTakenCount(collTypeOf(c.k));
    ncclResult_t r = issue(x, p);
    if (r != ncclSuccess) {
      e = std::string("call failed: ") + ncclGetErrorString(r) + ": " + ncclGetLastError(x.comm);
      break;
    }
    if (c.zc && mk::zcTakenCount(collTypeOf(c.k)) == zc0)
      report(x, p.name, "the zero-copy path was not taken");
    e = waitDone(x, timeoutFor(p));
    if (!e.empty()) break;
    HostBuf got;
    std::string bad = check(x, p, &got);
    const std::string nm = c.reps > 1 ? p.name + " call " + std::to_string(rep) : p.name;
    if (!bad.empty()) report(x, nm, bad);
    if (c.k == K::kAllReduce && c.count > 0) checkIdentical(x, nm, fnv(got, c.count * p.es));
    if (x.broken) return;
  }
  if (!e.empty()) {
    x.broken = true;
    report(x, p.name, e);
    return;
  }
  if (!p.handles.empty() || !p.windows.empty()) {
    // Peers may still read these buffers until everyone is done; nobody frees a buffer
    // that another rank still has mapped.
    e = barrier(x);
    if (e.empty()) e = releaseRegs(x, p);
    if (e.empty()) e = barrier(x);
    if (!e.empty()) {
      x.broken = true;
      report(x, p.name + " (deregistration)", e);
    }
  }
}

// 200 random small collectives issued back to back, one wait, then every output checked.
void runRandom(Ctx& x, int count) {
  if (x.broken) return;
  std::mt19937_64 rng(x.seed ^ 0xb2b0c0ffeeull);  // the same draws on every rank
  std::vector<std::unique_ptr<Prepared>> ps;
  for (int i = 0; i < count; i++) {
    uint64_t d[7];
    for (uint64_t& v : d) v = rng();
    Case c{};
    c.k = (K)(d[0] % 9);
    c.dt = kAllTypes[d[1] % 12];
    c.op = isRed(c.k) ? kAllOps[d[2] % 7] : Op::kSum;
    c.count = d[3] % 8 == 0 ? 0 : 1 + d[4] % 3000;
    c.inplace = c.k != K::kSendRecv && d[5] % 2;
    c.root = (int)(d[6] % x.n);
    auto p = std::make_unique<Prepared>();
    p->c = c;
    p->name = "random #" + std::to_string(i) + " " + caseName(c);
    std::string e = allocate(x, *p);
    if (e.empty()) e = load(x, *p, 0);
    if (!e.empty()) {
      x.broken = true;
      report(x, p->name, e);
      return;
    }
    ps.push_back(std::move(p));
  }
  for (auto& p : ps) {
    x.cases++;
    ncclResult_t r = issue(x, *p);
    if (r != ncclSuccess) {
      x.broken = true;
      report(
          x, p->name,
          std::string("call failed: ") + ncclGetErrorString(r) + ": " + ncclGetLastError(x.comm));
      return;
    }
  }
  std::string e = waitDone(x, 120);
  if (!e.empty()) {
    x.broken = true;
    report(x, "random back-to-back batch", e);
    return;
  }
  for (auto& p : ps) {
    HostBuf got;
    std::string bad = check(x, *p, &got);
    if (!bad.empty()) report(x, p->name, bad);
  }
}

// Body of CollProcsChild.Run: "plan n rank seed" in MKTEST_CP_CHILD, the id in MKTEST_CP_ID.
// Returns the number of failures (each printed on its own line).
int childMain(const char* spec) {
  char plan[32] = {};
  Ctx x;
  if (!gputest::parseChildSpec(spec, "[CollProcs] bad MKTEST_CP_CHILD", plan, &x.n, &x.me, &x.seed))
    return 1;
  const char* hex = getenv("MKTEST_CP_ID");
  ncclUniqueId id;
  if (!hex || strlen(hex) != 2 * sizeof(id.internal)) {
    fprintf(stderr, "[CollProcs] bad MKTEST_CP_ID\n");
    return 1;
  }
  for (size_t i = 0; i < sizeof(id.internal); i++) {
    unsigned v = 0;
    sscanf(hex + 2 * i, "%2x", &v);
    id.internal[i] = (char)v;
  }
  const std::string who = "[CollProcs n=" + std::to_string(x.n) + " rank " + std::to_string(x.me) +
                          " plan " + plan + "]";
  if (cudaSetDevice(0) != cudaSuccess) {
    fprintf(stderr, "%s cudaSetDevice(0) failed\n", who.c_str());
    return 1;
  }
  auto t0 = Clock::now();
  ncclResult_t r = ncclCommInitRank(&x.comm, x.n, id, x.me);
  if (r != ncclSuccess) {
    fprintf(stderr, "%s ncclCommInitRank failed: %s: %s\n", who.c_str(), ncclGetErrorString(r),
            ncclGetLastError(nullptr));
    return 1;
  }
  if (cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking) != cudaSuccess) {
    fprintf(stderr, "%s cudaStreamCreate failed\n", who.c_str());
    ncclCommAbort(x.comm);
    return 1;
  }
  const std::string pl = plan;
  std::vector<Case> cases = pl == "main"   ? mainPlan(x.n)
                            : pl == "huge" ? hugePlan()
                            : pl == "win"  ? winPlan()
                                           : regPlan();
  if (pl != "main" && pl != "huge" && pl != "reg" && pl != "win") {
    fprintf(stderr, "%s unknown plan\n", who.c_str());
    x.failures++;
    cases.clear();
  }
  for (size_t i = 0; i < cases.size() && !x.broken; i++) runOne(x, cases[i], (int)i);
  if (pl == "main") runRandom(x, 200);
  // Nobody tears down while a peer may still be finishing the last operation.
  if (!x.broken) {
    std::string e = barrier(x);
    if (!e.empty()) {
      x.broken = true;
      report(x, "final barrier", e);
    }
  }
  if (x.broken)
    ncclCommAbort(x.comm);
  else if (ncclCommDestroy(x.comm) != ncclSuccess)
    report(x, "ncclCommDestroy", ncclGetLastError(nullptr));
  cudaStreamDestroy(x.stream);
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  fprintf(stderr, "%s %d cases, %d failed%s, %.1f s\n", who.c_str(), x.cases, x.failures,
          x.broken ? " (stopped early)" : "", s);
  return x.failures;
}

// Parent side: N children of `plan`, all exited 0 within the bound.
std::string runProcs(const char* plan, int n, int timeoutS = 240) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return "ncclGetUniqueId failed";
  std::string hex;
  for (size_t i = 0; i < sizeof(id.internal); i++) {
    char b[3];
    snprintf(b, sizeof(b), "%02x", (unsigned char)id.internal[i]);
    hex += b;
  }
  const uint64_t seed = mktest::testSeed();
  auto t0 = Clock::now();
  std::vector<pid_t> pids;
  std::string err;
  for (int r = 0; r < n; r++) {
    char spec[160];
    snprintf(spec, sizeof(spec), "MKTEST_CP_CHILD=%s %d %d %llu", plan, n, r,
             (unsigned long long)seed);
    pid_t pid = mktest::spawnSelf("CollProcsChild.Run",
                                  {spec, "MKTEST_CP_ID=" + hex, "MKERNEL_BOOTSTRAP_TIMEOUT_S=60"});
    if (pid < 0) {
      err = "fork of child " + std::to_string(r) + " failed; ";
      break;
    }
    pids.push_back(pid);
  }
  err += mktest::waitChildren(pids, timeoutS);
  mk::bootstrapRootsWait(5000);
  fprintf(stderr, "[CollProcs] plan %s, %d processes: %.1f s\n", plan, n,
          std::chrono::duration<double>(Clock::now() - t0).count());
  return err;
}

TEST(CollProcsChild, Run) {
  const char* spec = getenv("MKTEST_CP_CHILD");
  if (!spec) GTEST_SKIP() << "helper of the CollProcs tests (runs only in their children)";
  EXPECT_EQ(childMain(spec), 0) << "failing cases are listed above";
}

TEST(CollProcs, TwoProcs) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(runProcs("main", 2), "");
}

TEST(CollProcs, ThreeProcs) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(runProcs("main", 3), "");
}

TEST(CollProcs, FourProcs) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(runProcs("main", 4), "");
}

TEST(CollProcs, EightProcs) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(runProcs("main", 8), "");
}

// 64M floats, automatic algorithm.
TEST(CollProcs, AllReduce64MFourProcs) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(runProcs("huge", 4), "");
}

// Send and receive buffers registered with ncclCommRegister (cudaMalloc, then ncclMemAlloc)
// by every rank: AllReduce of 16M+5 and 64M floats over the registered-buffer path.
TEST(CollProcs, RegisteredBuffersFourProcs) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(runProcs("reg", 4), "");
}

// Windows (ncclCommWindowRegister): every peer's window mapped once at registration (cuMem
// fds), then every collective zero-copy with the ranks' window offsets exchanged on the
// device, in and out of place; each child checks that the zero-copy path ran.
TEST(CollProcs, WindowsFourProcs) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(runProcs("win", 4), "");
}

}  // namespace
