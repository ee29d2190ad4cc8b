// The MoE AllToAll path's GPU test cases shared by test_moe_procs.cu (ranks in processes) and
// test_moe_vnodes.cu (ranks on virtual nodes): who drives the ranks (Driver), every case of
// both calls (runCases), graph capture and replay (runGraphs), and the byte-for-byte
// comparison of two runs of the same draws (Snapshots). See test_moe_procs.cu's top comment.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gpu/test_fused_util.cuh"
#include "gpu/test_moe_util.h"
#include "gpu/test_thread_team.h"
#include "mkernel/fused.h"

namespace moecases {

using namespace moetest;  // NOLINT: the problem classes and their cases

constexpr ncclDataType_t kBf = ncclBfloat16, kF16 = ncclFloat16, kF32 = ncclFloat32;
constexpr int kNK = ncclFusedLayoutNK, kKN = ncclFusedLayoutKN;

// The cases of a comm of n ranks (the same list in every process and in the vnode tests).
inline std::vector<MoeCase> dispatchCases(int n) {
  // n, E/n, k, H, N, in, out, w1 layout, routing, most tokens of a rank
  return {{n, 1, 3, 64, 128, kBf, kBf, kNK, kUniform, 200},
          {n, 2, 1, 136, 200, kF16, kF32, kKN, kHotExpert, 300},
          {n, 3, 4, 64, 136, kBf, kF16, kNK, kSomeEmpty, 150},
          {n, 4, 2, 136, 128, kF16, kF16, kKN, kHotExpert, 250},
          // Every token's slots on one rank (sent once with k entries); the largest k.
          {n, 2, 16, 64, 128, kBf, kBf, kNK, kOneRank, 90}};
}
inline std::vector<FfnCase> ffnCases(int n) {
  // n, E/n, k, H, I, in, out, weights' layout, routing, fewest and most tokens of a rank
  return {{n, 1, 2, 64, 32, kBf, kBf, kNK, kUniform, 37, 300},
          {n, 2, 4, 128, 64, kF16, kF32, kKN, kHotExpert, 37, 300},
          {n, 3, 1, 64, 32, kF16, kF32, kNK, kSomeEmpty, 1, 200},
          {n, 4, 3, 64, 64, kBf, kF16, kKN, kHotExpert, 37, 260},
          {n, 3, 8, 64, 32, kBf, kBf, kNK, kOneRank, 37, 120}};
}
// A bound every routing of the case fits: every slot of every rank on one expert + padding.
inline size_t anyRouting(int n, int maxT, int k, int epr) {
  return (size_t)n * maxT * k + (size_t)epr * NCCL_MOE_ROW_ALIGN;
}

// Every output of a checked call, per rank, kept in one run (the reference, e.g. the MoE
// node dedup's mode 0) and compared byte for byte in another run of the same draws (mode 1):
// counts, offsets, rowSource, rowWeight, the received rows, y (poisoned padding included: it
// must stay as the reference left it).
struct Section {
  std::string name;
  std::vector<uint8_t> bytes;
};
using Outputs = std::vector<Section>;

inline std::string d2h(std::vector<uint8_t>* to, const void* from, size_t bytes) {
  to->resize(bytes);
  if (bytes > 0 && from != nullptr)
    MOE_CUDA(cudaMemcpy(to->data(), from, bytes, cudaMemcpyDeviceToHost));
  return "";
}

inline Outputs outputs(MoeProblem& p, int r) {
  const RankData& d = p.rank(r);
  const MoeCase& c = p.c();
  Outputs o{{"counts", {}},    {"offsets", {}}, {"rowSource", {}},
            {"rowWeight", {}}, {"xRecv", {}},   {"y", {}}};
  std::string e = d2h(&o[0].bytes, d.dcnt, (size_t)c.epr * 4);
  if (e.empty()) e = d2h(&o[1].bytes, d.doff, (size_t)(c.epr + 1) * 4);
  if (e.empty()) e = d2h(&o[2].bytes, d.dsrc, d.maxRows * 12);
  if (e.empty()) e = d2h(&o[3].bytes, d.drw, d.maxRows * 4);
  if (e.empty()) e = d2h(&o[4].bytes, d.dxr, d.maxRows * c.H * 2);
  if (e.empty()) e = d2h(&o[5].bytes, d.dy, d.maxRows * c.N * fusedtest::esOf(c.out));
  if (!e.empty()) o = {{"copy failed: " + e, {}}};
  return o;
}

inline Outputs outputs(FfnProblem& p, int r) {
  Rank& d = p.rank(r);
  const FfnCase& c = p.c();
  Outputs o{{"counts", {}}, {"offsets", {}}, {"xRecv", {}}, {"y", {}}};
  std::string e = d2h(&o[0].bytes, d.dcnt.p, (size_t)c.epr * 4);
  if (e.empty()) e = d2h(&o[1].bytes, d.doff.p, (size_t)(c.epr + 1) * 4);
  if (e.empty()) e = d2h(&o[2].bytes, d.dxr.p, d.maxRows * c.H * 2);
  if (e.empty()) e = d2h(&o[3].bytes, d.dy.p, (size_t)d.T * c.H * fusedtest::esOf(c.out) + kSlack);
  if (!e.empty()) o = {{"copy failed: " + e, {}}};
  return o;
}

class Snapshots {
 public:
  explicit Snapshots(int n) : kept_(n), next_(n, 0) {}
  // From now on compare with what was kept (each rank from its first call again).
  void compare() {
    comparing_ = true;
    next_.assign(next_.size(), 0);
  }
  bool comparing() const { return comparing_; }
  // Rank r's next checked call (called by r's thread only).
  std::string take(int r, Outputs o) {
    if (!comparing_) {
      kept_[r].push_back(std::move(o));
      return "";
    }
    const size_t i = next_[r]++;
    const std::string who = "rank " + std::to_string(r) + " call " + std::to_string(i) + ": ";
    if (i >= kept_[r].size()) return who + "no reference call";
    const Outputs& ref = kept_[r][i];
    if (ref.size() != o.size()) return who + "sections differ";
    for (size_t s = 0; s < o.size(); ++s) {
      if (o[s].name != ref[s].name || o[s].bytes.size() != ref[s].bytes.size())
        return who + o[s].name + ": size " + std::to_string(o[s].bytes.size()) +
               " vs the reference's " + std::to_string(ref[s].bytes.size());
      for (size_t b = 0; b < o[s].bytes.size(); ++b)
        if (o[s].bytes[b] != ref[s].bytes[b])
          return who + o[s].name + " byte " + std::to_string(b) + " is " +
                 std::to_string(o[s].bytes[b]) + ", the reference run's " +
                 std::to_string(ref[s].bytes[b]);
    }
    return "";
  }

 private:
  bool comparing_ = false;
  std::vector<std::vector<Outputs>> kept_;  // [rank][checked call]
  std::vector<size_t> next_;
};

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
std::string runChecked(Driver& d, const std::vector<P*>& ps, Snapshots* snap = nullptr) {
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
  for (size_t i = 0; i < ps.size() && e.empty() && snap != nullptr; ++i)
    e = d.each([&](int r) { return snap->take(r, outputs(*ps[i], r)); });
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

// A draw in which rank `tight` needs the most rows, drawn again at one bound for every rank
// (as the AllToAll path needs): one row short of that rank's need, which every other rank
// fits. draw(seed, rows, tight rank or -1).
template <class P>
std::string drawTight(P& p, int n, int tight, size_t any, uint64_t seed,
                      const std::function<std::string(uint64_t, size_t, int)>& draw) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    const std::string e = draw(seed + attempt, any, -1);
    if (!e.empty()) return e;
    size_t others = 0;
    for (int r = 0; r < n; ++r)
      if (r != tight) others = std::max(others, p.need(r));
    if (p.need(tight) > others) return draw(seed + attempt, p.need(tight) - 1, tight);
  }
  return "no draw of 64 gives rank " + std::to_string(tight) + " the most rows";
}

// Every case of both calls (see the top of the file); `log` gets a line per case passed.
// Aborts the comms on a failure (before the buffers go) and returns it. algo: the config algo
// of every call (ncclFusedFused: the fused kernels where the layout has them); ffn false: the
// ncclMoeDispatchGemm calls only; commSms: the config's commSms of every call.
inline std::string runCases(Driver& d, uint64_t seed, const std::function<void(std::string)>& log,
                            Snapshots* snap = nullptr, int algo = ncclFusedAuto, bool ffn = true,
                            int commSms = -1) {
  const int n = d.n;
  std::mt19937_64 rng(seed);
  std::string e;
  int i = 0;
  for (const MoeCase& c : dispatchCases(n)) {
    const size_t any = anyRouting(n, c.maxT, c.k, c.epr);
    const int slack = i++ == 0 ? -1 : (int)(rng() % 200);
    MoeProblem a(c), b(c);
    a.algo = b.algo = algo;
    a.commSms = b.commSms = commSms;
    b.noWeights = i == 2;  // NULL topkWeights and rowWeight (the review's crash case)
    bool fresh = true;     // new tokens and weights, or only new routing
    auto drawA = [&](uint64_t sd, size_t rows) { return a.draw(sd, fresh, 0, -1, rows); };
    auto drawB = [&](uint64_t sd, size_t rows) { return b.draw(sd, true, 0, -1, rows); };
    e = drawShared<MoeProblem>(a, n, any, rng(), slack, drawA);
    if (e.empty()) e = drawShared<MoeProblem>(b, n, any, rng(), slack, drawB);
    if (e.empty()) e = runChecked<MoeProblem>(d, {&a, &b}, snap);
    fresh = false;
    if (e.empty()) e = drawShared<MoeProblem>(a, n, any, rng(), 0, drawA);  // exact fit
    if (e.empty()) e = runChecked<MoeProblem>(d, {&a}, snap);
    if (!e.empty()) {
      d.abortAll();
      return "ncclMoeDispatchGemm " + caseName(c) + ": " + e;
    }
    log("ncclMoeDispatchGemm " + caseName(c) + ": 3 calls checked");
  }
  i = 0;
  for (const FfnCase& c : ffnCases(n)) {
    if (!ffn) break;
    const size_t any = anyRouting(n, c.maxT, c.k, c.epr);
    const int slack = i == 0 ? -1 : (int)(rng() % 200);
    DrawOpts o;
    o.emptyRank = i++ == 3 && n > 1 ? n - 1 : -1;
    FfnProblem a(c), b(c);
    a.algo = b.algo = algo;
    a.commSms = b.commSms = commSms;
    auto drawWith = [&](FfnProblem& p, uint64_t sd, size_t rows) {
      o.fixedRows = rows;
      return p.draw(sd, o);
    };
    auto drawA = [&](uint64_t sd, size_t rows) { return drawWith(a, sd, rows); };
    auto drawB = [&](uint64_t sd, size_t rows) { return drawWith(b, sd, rows); };
    e = drawShared<FfnProblem>(a, n, any, rng(), slack, drawA);
    if (e.empty()) e = drawShared<FfnProblem>(b, n, any, rng(), slack, drawB);
    if (e.empty()) e = runChecked<FfnProblem>(d, {&a, &b}, snap);
    o.reshape = false;  // new routing, tokens and weights in the same input buffers
    if (e.empty()) e = drawShared<FfnProblem>(a, n, any, rng(), 0, drawA);  // exact fit
    if (e.empty()) e = runChecked<FfnProblem>(d, {&a}, snap);
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

// Both calls captured and replayed 3 times with new routing (algo, ffn: as runCases; the
// layer's weights in the [K,N] layout, or [N,K] with ncclFusedFused: the fused layer's).
inline std::string runGraphs(Driver& d, uint64_t seed, int algo = ncclFusedAuto, bool ffn = true) {
  const int n = d.n;
  std::mt19937_64 rng(seed);
  MoeCase mc{n, 2, 4, 64, 128, kBf, kBf, kNK, kUniform, 100};
  const size_t mRows = anyRouting(n, mc.maxT, mc.k, mc.epr);
  std::string e;
  {
    MoeProblem p(mc);
    p.algo = algo;
    e = p.draw(rng(), true, 0, -1, mRows);
    if (e.empty())
      e = graphReplays<MoeProblem>(
          d, p, [&](int) { return p.draw(rng(), false, 0, -1, mRows); }, 3);
    if (!e.empty()) return "ncclMoeDispatchGemm graph: " + e;
  }
  if (!ffn) return "";
  FfnCase fc{n, 2, 3, 64, 32, kBf, kBf, algo == ncclFusedFused ? kNK : kKN, kUniform, 37, 200};
  DrawOpts o;
  o.fixedRows = anyRouting(n, fc.maxT, fc.k, fc.epr);
  FfnProblem p(fc);
  p.algo = algo;
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

}  // namespace moecases
