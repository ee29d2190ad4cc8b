// ncclMoeDispatchGemm and ncclMoeDispatchFfnCombine (include/mkernel/fused.h) on the layouts
// other than "every rank in one process on one GPU": ranks that are PROCESSES sharing GPU 0 and
// ranks on virtual nodes. The problems and host references are the thread tests' (MoeProblem,
// FfnProblem in test_moe_util.h): every rank's counts, offsets, rowSource, rowWeight, received
// rows and every element of y (dispatch), every element of y (whole layer).
//   MoeProcs.TwoProcesses / FourProcesses   this binary re-spawned once per rank (only
//       MoeProcsChild.Run, which skips elsewhere; fork after CUDA initialisation is not
//       allowed), ncclCommInitRank from a unique id the parent hands over. Each process draws
//       every rank's inputs from the shared seed (the same draws everywhere) and checks its own
//       rank. Per case of each call: two problems called back to back on the stream (no host
//       wait between), then the first again with new routing in the same buffers. Routing
//       uniform, one hot expert, odd experts empty, -1 slots (FFN: tokens with every slot -1, a
//       rank without tokens; every slot of a token on one rank), T not a multiple of 128,
//       E/n 1..4, k 1..4, 8 and 16, bf16/fp16 in, every
//       out type, NK and KN weights. Every rank passes the same maxRows (the AllToAll path needs
//       it, fused.h): the first case a bound any routing fits, the others the largest need plus
//       random slack, the third call of each case exactly the largest need.
//   MoeVnodes.TwoByTwo / TwoByFour          the same cases, 4 and 8 ranks on GPU 0 over 2
//       virtual nodes (MKERNEL_EMULATE_NODES, socket backend on loopback), one thread per rank.
//   MoeProcsOverflow.ThreeProcesses         rank 1 needs the most rows and the shared maxRows is
//       one row short of its need, once per call (two comms): its comm reports ncclInvalidUsage
//       naming the call and the rows; the other processes' results are complete and correct
//       (FFN: slots routed to rank 1's experts contribute nothing), their comms report nothing.
//   MoeProcsGraph.ThreeProcesses / Vnodes2x2  each call captured once per rank (after an eager
//       call) and replayed with new routing (FFN: new tokens and weights too), every replay
//       checked.
// Without CUDA MPS the processes' kernels are time-sliced: correct, only slower
// (scripts/gpu_check.sh's procs stage starts MPS). Waits on the device end after 20 s.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "common/test_util.h"
#include "gpu/test_devcomm_util.h"
#include "gpu/test_fused_util.cuh"
#include "gpu/test_moe_util.h"
#include "gpu/test_proc_util.h"
#include "gpu/test_thread_team.h"
#include "mkernel/fused.h"

namespace {

using namespace moetest;  // NOLINT: the problem classes and their cases
using gputest::Clock;
using gputest::since;

constexpr ncclDataType_t kBf = ncclBfloat16, kF16 = ncclFloat16, kF32 = ncclFloat32;
constexpr int kNK = ncclFusedLayoutNK, kKN = ncclFusedLayoutKN;

// The cases of a comm of n ranks (the same list in every process and in the vnode tests).
std::vector<MoeCase> dispatchCases(int n) {
  // n, E/n, k, H, N, in, out, w1 layout, routing, most tokens of a rank
  return {{n, 1, 3, 64, 128, kBf, kBf, kNK, kUniform, 200},
          {n, 2, 1, 136, 200, kF16, kF32, kKN, kHotExpert, 300},
          {n, 3, 4, 64, 136, kBf, kF16, kNK, kSomeEmpty, 150},
          {n, 4, 2, 136, 128, kF16, kF16, kKN, kHotExpert, 250},
          // Every token's slots on one rank (sent once with k entries); the largest k.
          {n, 2, 16, 64, 128, kBf, kBf, kNK, kOneRank, 90}};
}
std::vector<FfnCase> ffnCases(int n) {
  // n, E/n, k, H, I, in, out, weights' layout, routing, fewest and most tokens of a rank
  return {{n, 1, 2, 64, 32, kBf, kBf, kNK, kUniform, 37, 300},
          {n, 2, 4, 128, 64, kF16, kF32, kKN, kHotExpert, 37, 300},
          {n, 3, 1, 64, 32, kF16, kBf, kNK, kSomeEmpty, 1, 200},
          {n, 4, 3, 64, 64, kBf, kF16, kKN, kHotExpert, 37, 260},
          {n, 3, 8, 64, 32, kBf, kBf, kNK, kOneRank, 37, 120}};
}
// A bound every routing of the case fits: every slot of every rank on one expert + padding.
size_t anyRouting(int n, int maxT, int k, int epr) {
  return (size_t)n * maxT * k + (size_t)epr * NCCL_MOE_ROW_ALIGN;
}

// Who drives the ranks of a comm: one process holding one rank, or a team of threads holding
// all of them (virtual nodes, ranks of one process).
class Driver {
 public:
  explicit Driver(int n) : n(n) {}
  virtual ~Driver() = default;
  // f(r) for every rank held here; "" or the failures.
  virtual std::string each(const std::function<std::string(int)>& f) = 0;
  virtual ncclComm_t comm(int r) = 0;
  virtual cudaStream_t stream(int r) = 0;
  // Returns once every rank of the comm has completed its calls so far (buffers may then be
  // rewritten or freed: peers may read a rank's buffers until their own calls complete).
  virtual std::string barrier() = 0;
  // After a failure, before the problems' buffers are freed: kernels may wait for peers.
  virtual void abortAll() = 0;
  const int n;
};

class TeamDriver : public Driver {
 public:
  explicit TeamDriver(gputest::Team& t) : Driver(t.n), t_(t) {}
  std::string each(const std::function<std::string(int)>& f) override { return t_.run(f); }
  ncclComm_t comm(int r) override { return t_.comms[r]; }
  cudaStream_t stream(int r) override { return t_.streams[r]; }
  std::string barrier() override { return ""; }  // each() returned after every rank's wait
  void abortAll() override {
    for (int r = 0; r < n; ++r)
      if (t_.comms[r]) {
        ncclCommAbort(t_.comms[r]);
        t_.forget(r);
      }
  }

 private:
  gputest::Team& t_;
};

class ProcDriver : public Driver {
 public:
  ProcDriver(int n, int me, ncclComm_t c, cudaStream_t s) : Driver(n), me(me), c_(c), s_(s) {}
  ~ProcDriver() override {
    if (dbuf_) cudaFree(dbuf_);
  }
  std::string each(const std::function<std::string(int)>& f) override { return f(me); }
  ncclComm_t comm(int) override { return c_; }
  cudaStream_t stream(int) override { return s_; }
  // A one-element AllReduce: it completes on a rank only once every rank has entered it, and
  // every rank enters it after its earlier calls (stream order).
  std::string barrier() override {
    if (!c_) return "comm aborted";
    if (!dbuf_ && cudaMalloc(&dbuf_, 16) != cudaSuccess) return "cudaMalloc failed";
    const ncclResult_t r = ncclAllReduce(dbuf_, dbuf_, 1, ncclInt32, ncclSum, c_, s_);
    if (r != ncclSuccess) return std::string("barrier AllReduce: ") + ncclGetLastError(c_);
    const std::string e = fusedtest::waitRank(me, c_, s_, 120);
    return e.empty() ? "" : "barrier: " + e;
  }
  void abortAll() override {
    if (c_) ncclCommAbort(c_);
    c_ = nullptr;
  }
  // The comm when it is still healthy (to be destroyed), else nullptr (aborted).
  ncclComm_t healthy() const { return c_; }
  const int me;

 private:
  ncclComm_t c_;
  cudaStream_t s_;
  void* dbuf_ = nullptr;
};

template <class P>
std::string enqueue(Driver& d, int r, P& p) {
  return fusedtest::callError(r, d.comm(r), p.call(r, d.comm(r), d.stream(r)));
}

// Every problem called back to back on each rank's stream, one wait, a barrier, every
// problem checked on every rank held here.
template <class P>
std::string runChecked(Driver& d, const std::vector<P*>& ps) {
  std::string e = d.each([&](int r) -> std::string {
    for (P* p : ps) {
      const std::string q = enqueue(d, r, *p);
      if (!q.empty()) return q;
    }
    return fusedtest::waitRank(r, d.comm(r), d.stream(r), 120);
  });
  if (e.empty()) e = d.barrier();
  for (size_t i = 0; i < ps.size() && e.empty(); ++i) {
    e = d.each([&](int r) { return ps[i]->check(r); });
    if (!e.empty() && ps.size() > 1) e = "call " + std::to_string(i) + " of the pair: " + e;
  }
  return e;
}

// The most rows any rank's layout spans.
template <class P>
size_t mostRows(P& p, int n) {
  size_t most = 1;
  for (int r = 0; r < n; ++r) most = std::max(most, p.need(r));
  return most;
}

// draw(seed, rows) at one bound shared by every rank (the AllToAll path needs the same maxRows
// on every rank: fused.h): `any` (a bound any routing fits) when slack < 0, else the largest
// need of the draw plus slack (the same seed drawn twice: the first draw finds the needs).
template <class P>
std::string drawShared(P& p, int n, size_t any, uint64_t seed, int slack,
                       const std::function<std::string(uint64_t, size_t)>& draw) {
  std::string e = draw(seed, any);
  if (e.empty() && slack >= 0) e = draw(seed, mostRows(p, n) + slack);
  return e;
}

// Every case of both calls (see the top of the file); `log` gets a line per case passed.
// Aborts the comms on a failure (before the buffers go) and returns it.
std::string runCases(Driver& d, uint64_t seed, const std::function<void(std::string)>& log) {
  const int n = d.n;
  std::mt19937_64 rng(seed);
  std::string e;
  int i = 0;
  for (const MoeCase& c : dispatchCases(n)) {
    const size_t any = anyRouting(n, c.maxT, c.k, c.epr);
    const int slack = i++ == 0 ? -1 : (int)(rng() % 200);
    MoeProblem a(c), b(c);
    b.noWeights = i == 2;  // NULL topkWeights and rowWeight (the review's crash case)
    bool fresh = true;     // new tokens and weights, or only new routing
    auto drawA = [&](uint64_t sd, size_t rows) { return a.draw(sd, fresh, 0, -1, rows); };
    auto drawB = [&](uint64_t sd, size_t rows) { return b.draw(sd, true, 0, -1, rows); };
    e = drawShared<MoeProblem>(a, n, any, rng(), slack, drawA);
    if (e.empty()) e = drawShared<MoeProblem>(b, n, any, rng(), slack, drawB);
    if (e.empty()) e = runChecked<MoeProblem>(d, {&a, &b});
    fresh = false;
    if (e.empty()) e = drawShared<MoeProblem>(a, n, any, rng(), 0, drawA);  // exact fit
    if (e.empty()) e = runChecked<MoeProblem>(d, {&a});
    if (!e.empty()) {
      d.abortAll();
      return "ncclMoeDispatchGemm " + caseName(c) + ": " + e;
    }
    log("ncclMoeDispatchGemm " + caseName(c) + ": 3 calls checked");
  }
  i = 0;
  for (const FfnCase& c : ffnCases(n)) {
    const size_t any = anyRouting(n, c.maxT, c.k, c.epr);
    const int slack = i == 0 ? -1 : (int)(rng() % 200);
    DrawOpts o;
    o.emptyRank = i++ == 3 && n > 1 ? n - 1 : -1;
    FfnProblem a(c), b(c);
    auto drawWith = [&](FfnProblem& p, uint64_t sd, size_t rows) {
      o.fixedRows = rows;
      return p.draw(sd, o);
    };
    auto drawA = [&](uint64_t sd, size_t rows) { return drawWith(a, sd, rows); };
    auto drawB = [&](uint64_t sd, size_t rows) { return drawWith(b, sd, rows); };
    e = drawShared<FfnProblem>(a, n, any, rng(), slack, drawA);
    if (e.empty()) e = drawShared<FfnProblem>(b, n, any, rng(), slack, drawB);
    if (e.empty()) e = runChecked<FfnProblem>(d, {&a, &b});
    o.reshape = false;  // new routing, tokens and weights in the same input buffers
    if (e.empty()) e = drawShared<FfnProblem>(a, n, any, rng(), 0, drawA);  // exact fit
    if (e.empty()) e = runChecked<FfnProblem>(d, {&a});
    if (!e.empty()) {
      d.abortAll();
      return "ncclMoeDispatchFfnCombine " + caseName(c) + ": " + e;
    }
    log("ncclMoeDispatchFfnCombine " + caseName(c) + ": 3 calls checked");
  }
  return "";
}

// One eager call, a capture per rank, `reps` replays each after redraw(rep) (new routing in
// the same buffers), every replay checked.
template <class P>
std::string graphReplays(Driver& d, P& p, const std::function<std::string(int)>& redraw, int reps) {
  std::string e = runChecked<P>(d, {&p});
  if (!e.empty()) return "eager call: " + e;
  std::vector<cudaGraphExec_t> execs(d.n, nullptr);
  e = d.each([&](int r) -> std::string {
    cudaGraph_t g = nullptr;
    MOE_CUDA(cudaStreamBeginCapture(d.stream(r), cudaStreamCaptureModeThreadLocal));
    const std::string q = enqueue(d, r, p);
    const cudaError_t ce = cudaStreamEndCapture(d.stream(r), &g);
    if (!q.empty()) return "capture: " + q;
    MOE_CUDA(ce);
    const cudaError_t ie = cudaGraphInstantiate(&execs[r], g, 0);
    cudaGraphDestroy(g);
    MOE_CUDA(ie);
    return "";
  });
  for (int rep = 0; rep < reps && e.empty(); ++rep) {
    e = redraw(rep);
    if (e.empty())
      e = d.each([&](int r) -> std::string {
        MOE_CUDA(cudaGraphLaunch(execs[r], d.stream(r)));
        return fusedtest::waitRank(r, d.comm(r), d.stream(r), 120);
      });
    if (e.empty()) e = d.barrier();
    if (e.empty()) e = d.each([&](int r) { return p.check(r); });
    if (!e.empty()) e = "replay " + std::to_string(rep) + ": " + e;
  }
  if (!e.empty()) d.abortAll();  // before the graphs and buffers go
  for (auto x : execs)
    if (x) cudaGraphExecDestroy(x);
  return e;
}

// Both calls captured and replayed 3 times with new routing.
std::string runGraphs(Driver& d, uint64_t seed) {
  const int n = d.n;
  std::mt19937_64 rng(seed);
  MoeCase mc{n, 2, 4, 64, 128, kBf, kBf, kNK, kUniform, 100};
  const size_t mRows = anyRouting(n, mc.maxT, mc.k, mc.epr);
  std::string e;
  {
    MoeProblem p(mc);
    e = p.draw(rng(), true, 0, -1, mRows);
    if (e.empty())
      e = graphReplays<MoeProblem>(
          d, p, [&](int) { return p.draw(rng(), false, 0, -1, mRows); }, 3);
    if (!e.empty()) return "ncclMoeDispatchGemm graph: " + e;
  }
  FfnCase fc{n, 2, 3, 64, 32, kBf, kBf, kKN, kUniform, 37, 200};
  DrawOpts o;
  o.fixedRows = anyRouting(n, fc.maxT, fc.k, fc.epr);
  FfnProblem p(fc);
  e = p.draw(rng(), o);
  if (e.empty())
    e = graphReplays<FfnProblem>(
        d, p,
        [&](int rep) {
          p.c().routing = (Routing)(rep % 3);
          DrawOpts again = o;
          again.reshape = false;
          return p.draw(rng(), again);
        },
        3);
  return e.empty() ? "" : "ncclMoeDispatchFfnCombine graph: " + e;
}

// ---- processes: one child, one rank ---------------------------------------------------------
constexpr int kTight = 1;  // the overflow plan's rank whose bound is one row short

// A barrier that needs no comm (the overflowing rank's comm has failed): every process writes
// dir/<tag>.<rank> and waits, bounded, for its peers' files.
std::string fileBarrier(const std::string& dir, const std::string& tag, int n, int me) {
  gputest::writeNumber(dir + "/" + tag + "." + std::to_string(me), 1);
  const auto t0 = Clock::now();
  for (;;) {
    int seen = 0;
    int64_t v = 0;
    for (int q = 0; q < n; ++q)
      seen += gputest::readNumber(dir + "/" + tag + "." + std::to_string(q), &v);
    if (seen == n) return "";
    if (since(t0) > 90) return "file barrier " + tag + ": peers missing after 90 s";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// One call with rank kTight one row short, on a fresh comm. check(p) checks this rank's
// outputs; `op` is the name the error must carry.
template <class P>
std::string overflowOnce(int n, int me, const ncclUniqueId& id, cudaStream_t s,
                         const std::string& dir, const char* op, P& p,
                         const std::function<std::string(P&)>& check) {
  ncclComm_t comm = nullptr;
  const ncclResult_t ir = ncclCommInitRank(&comm, n, id, me);
  if (ir != ncclSuccess) return std::string("ncclCommInitRank: ") + ncclGetLastError(nullptr);
  const ncclResult_t res = p.call(me, comm, s);
  std::string e;
  if (res != ncclSuccess && !(me == kTight && res == ncclInvalidUsage))
    e = std::string("call returned ") + ncclGetErrorString(res) + ": " + ncclGetLastError(comm);
  if (e.empty() && !gputest::streamCompleted(s, 60)) e = "stream failed or busy after 60 s";
  ncclResult_t a = ncclSuccess;
  // The host poller may report after the stream is done: the overflowing rank waits for it.
  if (e.empty() && me == kTight &&
      gputest::pollAsyncError(comm, Clock::now(), 10, &a) != ncclSuccess)
    e = "ncclCommGetAsyncError failed";
  const std::string b1 = fileBarrier(dir, std::string(op) + "_called", n, me);
  // The peers: after every process's call (nothing may reach them later either).
  if (e.empty() && me != kTight && ncclCommGetAsyncError(comm, &a) != ncclSuccess)
    e = "ncclCommGetAsyncError failed";
  const std::string msg = ncclGetLastError(comm);
  if (e.empty() && me == kTight) {
    if (a != ncclInvalidUsage)
      e = "async error " + std::string(ncclGetErrorString(a)) + ", expected ncclInvalidUsage";
    else if (msg.find(op) == std::string::npos || msg.find("rows") == std::string::npos)
      e = "the error does not name " + std::string(op) + " and the rows: " + msg;
  } else if (e.empty() && a != ncclSuccess) {
    e = "a peer of the overflowing rank reports " + std::string(ncclGetErrorString(a)) + ": " + msg;
  }
  if (e.empty()) e = check(p);
  // Every process done with its checks before any comm goes (a closing peer could disturb
  // a comm still being queried).
  const std::string b2 = fileBarrier(dir, std::string(op) + "_checked", n, me);
  ncclCommAbort(comm);
  if (e.empty()) e = b1.empty() ? b2 : b1;
  return e;
}

// A draw in which rank kTight needs the most rows, drawn again at one bound for every rank
// (as the AllToAll path needs): one row short of kTight's need, which every other rank fits.
// draw(seed, rows, tight rank or -1).
template <class P>
std::string drawTight(P& p, int n, size_t any, uint64_t seed,
                      const std::function<std::string(uint64_t, size_t, int)>& draw) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    const std::string e = draw(seed + attempt, any, -1);
    if (!e.empty()) return e;
    size_t others = 0;
    for (int r = 0; r < n; ++r)
      if (r != kTight) others = std::max(others, p.need(r));
    if (p.need(kTight) > others) return draw(seed + attempt, p.need(kTight) - 1, kTight);
  }
  return "no draw of 64 gives rank 1 the most rows";
}

int overflowPlan(int n, int me, uint64_t seed, const ncclUniqueId ids[2], cudaStream_t s,
                 const std::string& who) {
  const char* dir = getenv("MKTEST_MOE_DIR");
  if (!dir) {
    fprintf(stderr, "%s MKTEST_MOE_DIR not set\n", who.c_str());
    return 1;
  }
  int failures = 0;
  const MoeCase mc{n, 2, 2, 64, 64, kBf, kF32, kNK, kHotExpert, 120};
  MoeProblem mp(mc);
  std::string e = drawTight<MoeProblem>(
      mp, n, anyRouting(n, mc.maxT, mc.k, mc.epr), seed,
      [&](uint64_t sd, size_t rows, int tight) { return mp.draw(sd, true, 0, tight, rows); });
  if (e.empty())
    e = overflowOnce<MoeProblem>(
        n, me, ids[0], s, dir, "MoeDispatchGemm", mp, [&](MoeProblem& p) -> std::string {
          if (me != kTight) return p.check(me);
          std::vector<int32_t> cnt(2, -7);
          MOE_CUDA(cudaMemcpy(cnt.data(), p.rank(me).dcnt, 8, cudaMemcpyDeviceToHost));
          if (cnt[0] != 0 || cnt[1] != 0) return "the overflowing rank received rows";
          return "";
        });
  if (!e.empty()) {
    fprintf(stderr, "%s FAIL ncclMoeDispatchGemm overflow: %s\n", who.c_str(), e.c_str());
    failures++;
  }
  const FfnCase fc{n, 2, 2, 64, 32, kBf, kF32, kNK, kHotExpert, 37, 120};
  FfnProblem fp(fc);
  e = drawTight<FfnProblem>(fp, n, anyRouting(n, fc.maxT, fc.k, fc.epr), seed ^ 0xff,
                            [&](uint64_t sd, size_t rows, int tight) {
                              DrawOpts o;
                              o.fixedRows = rows;
                              o.tight = tight;
                              return fp.draw(sd, o);
                            });
  if (e.empty())
    e = overflowOnce<FfnProblem>(n, me, ids[1], s, dir, "MoeDispatchFfnCombine", fp,
                                 [&](FfnProblem& p) { return p.check(me, kTight, me == kTight); });
  if (!e.empty()) {
    fprintf(stderr, "%s FAIL ncclMoeDispatchFfnCombine overflow: %s\n", who.c_str(), e.c_str());
    failures++;
  }
  return failures;
}

// Body of MoeProcsChild.Run: "plan n rank seed" in MKTEST_MOE_CHILD, the unique id(s) in
// MKTEST_MOE_ID (and MKTEST_MOE_ID2). Returns the number of failures.
int childMain(const char* spec) {
  char plan[32] = {};
  int n = 0, me = 0;
  uint64_t seed = 0;
  if (!gputest::parseChildSpec(spec, "[MoeProcs] bad MKTEST_MOE_CHILD", plan, &n, &me, &seed))
    return 1;
  const std::string pl = plan;
  const std::string who =
      "[MoeProcs " + pl + " n=" + std::to_string(n) + " rank " + std::to_string(me) + "]";
  ncclUniqueId ids[2];
  if (!gputest::hexToId(getenv("MKTEST_MOE_ID"), &ids[0]) ||
      (pl == "overflow" && !gputest::hexToId(getenv("MKTEST_MOE_ID2"), &ids[1]))) {
    fprintf(stderr, "%s bad MKTEST_MOE_ID\n", who.c_str());
    return 1;
  }
  cudaStream_t stream = nullptr;
  if (cudaSetDevice(0) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    fprintf(stderr, "%s cudaSetDevice/cudaStreamCreate failed\n", who.c_str());
    return 1;
  }
  const auto t0 = Clock::now();
  int failures = 0;
  if (pl == "overflow") {
    failures = overflowPlan(n, me, seed, ids, stream, who);
  } else {
    ncclComm_t comm = nullptr;
    const ncclResult_t ir = ncclCommInitRank(&comm, n, ids[0], me);
    if (ir != ncclSuccess) {
      fprintf(stderr, "%s ncclCommInitRank: %s: %s\n", who.c_str(), ncclGetErrorString(ir),
              ncclGetLastError(nullptr));
      return 1;
    }
    ProcDriver d(n, me, comm, stream);
    auto log = [&](const std::string& line) {
      if (me == 0) fprintf(stderr, "%s %s\n", who.c_str(), line.c_str());
    };
    std::string e = pl == "cases"   ? runCases(d, seed, log)
                    : pl == "graph" ? runGraphs(d, seed)
                                    : "unknown plan " + pl;
    if (e.empty()) e = d.barrier();  // nobody tears down while a peer may still finish a call
    if (!e.empty()) {
      fprintf(stderr, "%s FAIL %s\n", who.c_str(), e.c_str());
      failures++;
      d.abortAll();
    }
    if (d.healthy()) ncclCommDestroy(d.healthy());
  }
  cudaStreamDestroy(stream);
  fprintf(stderr, "%s %s, %.1f s\n", who.c_str(), failures ? "FAILED" : "passed", since(t0));
  return failures;
}

TEST(MoeProcsChild, Run) {
  const char* spec = getenv("MKTEST_MOE_CHILD");
  if (!spec) GTEST_SKIP() << "helper of the MoeProcs tests (runs only in their children)";
  EXPECT_EQ(childMain(spec), 0) << "the failure is named above";
}

// ---- parents ----------------------------------------------------------------------------------
// n children running `plan`; "" when all passed. The seed is printed.
std::string spawnPlan(const char* plan, int n, const std::string& dir = "") {
  const unsigned long long seed = mktest::testSeed() ^ (0x30e5ull * n);
  printf("[MoeProcs] %s, %d processes, seed %llu (MKTEST_SEED=%llu repeats it)\n", plan, n, seed,
         (unsigned long long)mktest::testSeed());
  const int comms = std::string(plan) == "overflow" ? 2 : 1;
  ncclUniqueId ids[2];
  for (int i = 0; i < comms; ++i)
    if (ncclGetUniqueId(&ids[i]) != ncclSuccess)
      return std::string("ncclGetUniqueId: ") + ncclGetLastError(nullptr);
  const auto t0 = Clock::now();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    char spec[160];
    snprintf(spec, sizeof(spec), "MKTEST_MOE_CHILD=%s %d %d %llu", plan, n, r, seed);
    std::vector<std::string> env{spec, "MKTEST_MOE_ID=" + gputest::idToHex(ids[0])};
    if (comms == 2) env.push_back("MKTEST_MOE_ID2=" + gputest::idToHex(ids[1]));
    if (!dir.empty()) env.push_back("MKTEST_MOE_DIR=" + dir);
    pids.push_back(mktest::spawnSelf("MoeProcsChild.Run", env));
  }
  std::string err;
  std::vector<pid_t> started;
  for (pid_t p : pids) {
    if (p <= 0) err = "fork failed (its peers fail at their bootstrap); ";
    if (p > 0) started.push_back(p);
  }
  err += mktest::waitChildren(started, 240);
  mk::bootstrapRootsWait(5000);
  printf("[MoeProcs] %s, %d processes: %.1f s\n", plan, n, since(t0));
  return err;
}

class MoeProcsEnv {  // children inherit it
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
  mktest::ScopedEnv boot_{"MKERNEL_BOOTSTRAP_TIMEOUT_S", "60"};
};

TEST(MoeProcs, TwoProcesses) {
  MKTEST_REQUIRE_GPU();
  MoeProcsEnv env;
  EXPECT_EQ(spawnPlan("cases", 2), "") << "the failing case is named above";
}

TEST(MoeProcs, FourProcesses) {
  MKTEST_REQUIRE_GPU();
  MoeProcsEnv env;
  EXPECT_EQ(spawnPlan("cases", 4), "") << "the failing case is named above";
}

TEST(MoeProcsOverflow, ThreeProcesses) {
  MKTEST_REQUIRE_GPU();
  // A peer left waiting fails fast; the overflowing rank's error is recorded by its last kernel.
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "10000");
  mktest::ScopedEnv boot("MKERNEL_BOOTSTRAP_TIMEOUT_S", "60");
  char tmpl[] = "/tmp/mk_moeovf_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, err = spawnPlan("overflow", 3, dir);
  for (const char* op : {"MoeDispatchGemm", "MoeDispatchFfnCombine"})
    for (const char* step : {"_called.", "_checked."})
      for (int r = 0; r < 3; ++r)
        for (const char* tail : {"", ".tmp"})
          unlink((dir + "/" + op + step + std::to_string(r) + tail).c_str());
  rmdir(dir.c_str());
  EXPECT_EQ(err, "") << "the failure is named above";
}

TEST(MoeProcsGraph, ThreeProcesses) {
  MKTEST_REQUIRE_GPU();
  MoeProcsEnv env;
  EXPECT_EQ(spawnPlan("graph", 3), "") << "the failure is named above";
}

// ---- virtual nodes: n ranks on GPU 0 over 2 nodes, one thread per rank ---------------------
struct VnodeTeam {
  // 1 MiB windows (several chunks per AllToAll); waits on the device end after 20 s.
  dctest::TestEnv env{2, 1 << 20, 0, 20000};
  gputest::Team team;
  explicit VnodeTeam(int n) : team(n) {}
};

void runVnodes(int n) {
  VnodeTeam v(n);
  ASSERT_TRUE(v.team.ok) << v.team.why;
  TeamDriver d(v.team);
  const uint64_t seed = mktest::testSeed() ^ (0x7e0dull * n);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::string err = runCases(d, seed, [&](const std::string& line) {
    printf("[MoeVnodes 2x%d] %s\n", n / 2, line.c_str());
  });
  EXPECT_EQ(err, "");
}

TEST(MoeVnodes, TwoByTwo) {
  MKTEST_REQUIRE_GPU();
  runVnodes(4);
}

TEST(MoeVnodes, TwoByFour) {
  MKTEST_REQUIRE_GPU();
  runVnodes(8);
}

TEST(MoeProcsGraph, Vnodes2x2) {
  MKTEST_REQUIRE_GPU();
  VnodeTeam v(4);
  ASSERT_TRUE(v.team.ok) << v.team.why;
  TeamDriver d(v.team);
  const uint64_t seed = mktest::testSeed() ^ 0x96e2;
  SCOPED_TRACE("seed " + std::to_string(seed));
  EXPECT_EQ(runGraphs(d, seed), "");
}

}  // namespace
