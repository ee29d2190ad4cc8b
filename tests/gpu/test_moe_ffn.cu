// ncclMoeDispatchFfnCombine (include/mkernel/fused.h) on ranks sharing GPU 0, one thread per
// rank. Each case draws fresh tokens, expert weights and routing (uniform, one hot expert,
// experts left empty, -1 slots, tokens with every slot -1), token counts that are not tile
// multiples, poisons every output and buffer with NaN, and checks every rank's counts and
// offsets and EVERY element of its y against a host reference written here, independently of
// the library: per routed slot, h = x W1^T in fp64 rounded to inType (the implementation
// stores h in inType), act = silu(gate) * up in fp32 from the rounded h, rounded to inType,
// out = act W2^T in fp64, and y[t] = sum_j w[t][j] out_j. Also: graph capture replayed with new
// routing and inputs, a receiver's bound exceeded and a bad expert id (both reported through
// ncclCommGetAsyncError while the peers complete with correct results), and the API's
// argument rules.
//
// Tolerance per element: |got - ref| <= rIn * absRef + uOut * |ref| (+ fp16's subnormal step),
// absRef = sum_j |w_j| sum_i |act_i W2_ci|. rIn is one ulp of inType relative (2^-7 bf16, 2^-10
// fp16): the library accumulates in fp32, so a stored h or act element may round to the
// neighbour of the reference's (rarely: only near a rounding boundary); even if every one did,
// the error stays below rIn * absRef. uOut covers the final rounding to outType. A token whose
// slots are all -1 (absRef = 0) must be exactly 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "common/test_util.h"
#include "gpu/test_fused_util.cuh"
#include "gpu/test_moe_util.h"
#include "gpu/test_thread_team.h"
#include "mkernel/fused.h"

namespace {

using fusedtest::esOf;
using fusedtest::waitRank;
using moetest::fromBits;
using moetest::outValue;
using moetest::roundTo;
using moetest::toBits;

enum Routing { kUniform, kHotExpert, kSomeEmpty };

struct FfnCase {
  int n, epr, k, H, I;
  ncclDataType_t in, out;
  int layout;
  Routing routing;
  int minT, maxT;
};

std::string caseName(const FfnCase& c) {
  return "n" + std::to_string(c.n) + "_epr" + std::to_string(c.epr) + "_k" + std::to_string(c.k) +
         "_H" + std::to_string(c.H) + "_I" + std::to_string(c.I) + "_" + fusedtest::typeName(c.in) +
         "_to_" + fusedtest::typeName(c.out) + (c.layout == ncclFusedLayoutKN ? "_KN" : "_NK") +
         "_r" + std::to_string((int)c.routing);
}

struct Dev {
  void* p = nullptr;
  Dev() = default;
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() {
    if (p) cudaFree(p);
  }
  cudaError_t alloc(size_t bytes) {
    if (p) cudaFree(p);
    p = nullptr;
    return cudaMalloc(&p, std::max<size_t>(bytes, 16));
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

constexpr size_t kSlack = 64;  // poisoned bytes after y: never written

// One rank: host copies of its inputs (bits as stored) and its device buffers.
struct Rank {
  int T = 0;
  std::vector<uint16_t> x, w1, w2;
  std::vector<int32_t> idx;
  std::vector<float> wts;
  std::vector<double> w1f, w2f;  // the weights as [epr][2I][H] and [epr][H][I], any layout
  Dev dx, didx, dwts, dw1, dw2, dy, dxr, dh, dact, dout, dcnt, doff;
  size_t maxRows = 0;
};

struct DrawOpts {
  bool reshape = true;   // new token counts and buffers; else same counts and input buffers
  int slack = 0;         // rows beyond each rank's need
  int tight = -1;        // this rank's bound is one row short of its need
  size_t fixedRows = 0;  // every rank's bound (a captured graph keeps its buffers)
  int badRank = -1;      // this rank gets one topkIdx entry of E + 5
  int emptyRank = -1;    // this rank has no tokens
};

class FfnProblem {
 public:
  explicit FfnProblem(const FfnCase& c) : c_(c), ranks_(c.n) {}
  FfnCase& c() { return c_; }
  Rank& rank(int r) { return ranks_[r]; }
  size_t need(int r) const { return need_[r]; }
  int64_t badSlot() const { return badSlot_; }
  int experts() const { return c_.n * c_.epr; }

  // Fresh inputs and routing for every rank, uploaded; the expected layout; outputs and every
  // buffer poisoned (NaN in the float ones).
  std::string draw(uint64_t seed, const DrawOpts& o) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const int E = experts(), H = c_.H, I = c_.I, epr = c_.epr, k = c_.k;
    // |gate| and |up| of about 1, outputs of about 1: silu's curve matters, nothing saturates.
    const float a1 = 3.f / std::sqrt((float)H), a2 = 2.f / std::sqrt((float)I);
    const bool nk = c_.layout == ncclFusedLayoutNK;
    for (int r = 0; r < c_.n; ++r) {
      Rank& d = ranks_[r];
      if (o.reshape) d.T = r == o.emptyRank ? 0 : c_.minT + (int)(rng() % (c_.maxT - c_.minT + 1));
      d.x.resize((size_t)d.T * H);
      for (auto& v : d.x) v = toBits(u(rng), c_.in);
      d.w1.resize((size_t)epr * 2 * I * H);
      for (auto& v : d.w1) v = toBits(u(rng) * a1, c_.in);
      d.w2.resize((size_t)epr * H * I);
      for (auto& v : d.w2) v = toBits(u(rng) * a2, c_.in);
      d.w1f.resize(d.w1.size());
      d.w2f.resize(d.w2.size());
      for (int le = 0; le < epr; ++le) {
        for (int n = 0; n < 2 * I; ++n)
          for (int h = 0; h < H; ++h)
            d.w1f[((size_t)le * 2 * I + n) * H + h] = fromBits(
                d.w1[nk ? ((size_t)le * 2 * I + n) * H + h : ((size_t)le * H + h) * 2 * I + n],
                c_.in);
        for (int c = 0; c < H; ++c)
          for (int i = 0; i < I; ++i)
            d.w2f[((size_t)le * H + c) * I + i] = fromBits(
                d.w2[nk ? ((size_t)le * H + c) * I + i : ((size_t)le * I + i) * H + c], c_.in);
      }
      d.idx.assign((size_t)d.T * k, -1);
      d.wts.resize(d.idx.size());
      const int hot = (int)(rng() % E);
      for (int t = 0; t < d.T; ++t) {
        const bool none = rng() % 10 == 0;  // every slot -1: y[t] must be exactly 0
        for (int j = 0; j < k; ++j) {
          int e = -1;
          const uint64_t roll = rng() % 16;
          if (!none && roll != 0) {
            if (c_.routing == kHotExpert && roll < 12)
              e = hot;
            else if (c_.routing == kSomeEmpty)
              e = (int)(rng() % E) & ~1;  // odd experts stay empty
            else
              e = (int)(rng() % E);
          }
          d.idx[(size_t)t * k + j] = e;
          d.wts[(size_t)t * k + j] = u(rng);
        }
      }
    }
    badSlot_ = -1;
    if (o.badRank >= 0) {
      Rank& d = ranks_[o.badRank];
      if (d.T == 0) return "the bad-id rank has no tokens";
      badSlot_ = (int64_t)(rng() % ((uint64_t)d.T * k));
      d.idx[badSlot_] = E + 5;
    }
    // Expected layout: rows per local expert from every source, padded to 128-row tiles.
    cnt_.assign(c_.n, std::vector<int>(epr, 0));
    need_.assign(c_.n, 0);
    for (const Rank& s : ranks_)
      for (int32_t e : s.idx)
        if (e >= 0 && e < E) cnt_[e / epr][e % epr]++;
    for (int d = 0; d < c_.n; ++d)
      for (int le = 0; le < epr; ++le)
        need_[d] +=
            (cnt_[d][le] + NCCL_MOE_ROW_ALIGN - 1) / NCCL_MOE_ROW_ALIGN * NCCL_MOE_ROW_ALIGN;
    for (int r = 0; r < c_.n; ++r) {
      const int64_t want = (int64_t)need_[r] + (r == o.tight ? -1 : o.slack);
      const size_t rows = o.fixedRows > 0 ? o.fixedRows : (size_t)std::max<int64_t>(want, 1);
      if (rows < need_[r] && r != o.tight) return "fixedRows below the need of the routing";
      const std::string e = upload(ranks_[r], rows, o.reshape);
      if (!e.empty()) return e;
    }
    return "";
  }

  ncclResult_t call(int r, ncclComm_t comm, cudaStream_t s) {
    Rank& d = ranks_[r];
    ncclMoeConfig_t cfg = NCCL_MOE_CONFIG_INITIALIZER;
    cfg.wLayout = c_.layout;
    cfg.outType = c_.out;
    const ncclMoeFfnBuffers_t b = buffers(r);
    return ncclMoeDispatchFfnCombine(d.dx.p, d.didx.as<int>(), d.dwts.as<float>(), d.dw1.p, d.dw2.p,
                                     d.dy.p, &b, d.T, c_.H, c_.I, experts(), c_.k, c_.in, &cfg,
                                     comm, s);
  }

  ncclMoeFfnBuffers_t buffers(int r) {
    Rank& d = ranks_[r];
    return ncclMoeFfnBuffers_t{d.dxr.p,          d.dh.p,           d.dact.p, d.dout.as<float>(),
                               d.dcnt.as<int>(), d.doff.as<int>(), d.maxRows};
  }

  // Rank r's counts, offsets and every element of its y. lostOwner: the slots routed to this
  // rank's experts contribute nothing (it overflowed), and if it is r, r's counts are 0.
  // mayBeUntouched: a row of y may also still hold its poison (a rank whose comm failed).
  std::string check(int r, int lostOwner = -1, bool mayBeUntouched = false) {
    Rank& d = ranks_[r];
    const int epr = c_.epr, H = c_.H, E = experts();
    std::vector<int32_t> cnt(epr), off(epr + 1);
    const size_t yBytes = (size_t)d.T * H * esOf(c_.out);
    std::vector<uint8_t> y(yBytes + kSlack);
    MOE_CUDA(cudaMemcpy(cnt.data(), d.dcnt.p, epr * 4, cudaMemcpyDeviceToHost));
    MOE_CUDA(cudaMemcpy(off.data(), d.doff.p, (epr + 1) * 4, cudaMemcpyDeviceToHost));
    MOE_CUDA(cudaMemcpy(y.data(), d.dy.p, y.size(), cudaMemcpyDeviceToHost));
    const std::string who = "rank " + std::to_string(r) + ": ";
    const bool lost = r == lostOwner;
    int64_t row = 0;
    for (int le = 0; le <= epr; ++le) {
      const int wantCnt = le < epr && !lost ? cnt_[r][le] : 0;
      const int64_t wantOff = lost ? 0 : row;
      if ((le < epr && cnt[le] != wantCnt) || off[le] != wantOff)
        return who + "expert " + std::to_string(le) + ": count " +
               (le < epr ? std::to_string(cnt[le]) : "-") + " offset " + std::to_string(off[le]) +
               ", expected " + std::to_string(wantCnt) + " at " + std::to_string(wantOff);
      if (le < epr)
        row += (cnt_[r][le] + NCCL_MOE_ROW_ALIGN - 1) / NCCL_MOE_ROW_ALIGN * NCCL_MOE_ROW_ALIGN;
    }
    for (size_t i = yBytes; i < y.size(); ++i)
      if (y[i] != 0xff) return who + "a byte after y was written";
    const double rIn = c_.in == ncclBfloat16 ? 1.0 / 128 : 1.0 / 1024;
    const double uOut = c_.out == ncclBfloat16  ? 1.0 / 256
                        : c_.out == ncclFloat16 ? 1.0 / 2048
                                                : 1.0 / (1 << 23);
    const double atol = c_.out == ncclFloat16 ? 1.0 / (1 << 24) : 0;
    std::vector<double> xd(H), out(H), absOut(H), ref(H), absRef(H);
    const size_t rowBytes = (size_t)H * esOf(c_.out);
    for (int t = 0; t < d.T; ++t) {
      const uint8_t* yr = y.data() + (size_t)t * rowBytes;
      if (mayBeUntouched && std::all_of(yr, yr + rowBytes, [](uint8_t b) { return b == 0xff; }))
        continue;
      std::fill(ref.begin(), ref.end(), 0.0);
      std::fill(absRef.begin(), absRef.end(), 0.0);
      for (int h = 0; h < H; ++h) xd[h] = fromBits(d.x[(size_t)t * H + h], c_.in);
      std::string slots;
      for (int j = 0; j < c_.k; ++j) {
        const int e = d.idx[(size_t)t * c_.k + j];
        slots += " " + std::to_string(e);
        if (e < 0 || e >= E || e / epr == lostOwner) continue;
        expert(e / epr, e % epr, xd.data(), out.data(), absOut.data());
        const double w = d.wts[(size_t)t * c_.k + j];
        for (int c = 0; c < H; ++c) {
          ref[c] += w * out[c];
          absRef[c] += std::fabs(w) * absOut[c];
        }
      }
      for (int c = 0; c < H; ++c) {
        const double got = outValue(y, (size_t)t * H + c, c_.out);
        const double tol = rIn * absRef[c] + uOut * std::fabs(ref[c]) + (absRef[c] > 0 ? atol : 0);
        if (!(std::fabs(got - ref[c]) <= tol))
          return who + "y[" + std::to_string(t) + "][" + std::to_string(c) +
                 "] = " + std::to_string(got) + ", expected " + std::to_string(ref[c]) + " +- " +
                 std::to_string(tol) + " (experts of the token's slots:" + slots + ")";
      }
    }
    return "";
  }

 private:
  // Local expert `le` of rank `owner` applied to one token row, as the header specifies it.
  void expert(int owner, int le, const double* x, double* out, double* absOut) const {
    const Rank& o = ranks_[owner];
    const int H = c_.H, I = c_.I;
    std::vector<float> h(2 * I);
    std::vector<double> act(I);
    for (int n = 0; n < 2 * I; ++n) {
      const double* w = &o.w1f[((size_t)le * 2 * I + n) * H];
      double s = 0;
      for (int k = 0; k < H; ++k) s += x[k] * w[k];
      h[n] = roundTo(s, c_.in);
    }
    for (int i = 0; i < I; ++i) {
      const float g = h[i];
      const float silu = g / (1.0f + std::exp(-g));
      act[i] = roundTo(silu * h[I + i], c_.in);
    }
    for (int c = 0; c < H; ++c) {
      const double* w = &o.w2f[((size_t)le * H + c) * I];
      double s = 0, a = 0;
      for (int i = 0; i < I; ++i) {
        s += act[i] * w[i];
        a += std::fabs(act[i] * w[i]);
      }
      out[c] = (float)s;  // buf->out is fp32
      absOut[c] = a;
    }
  }

  std::string upload(Rank& d, size_t rows, bool reshape) {
    const int H = c_.H, I = c_.I, epr = c_.epr;
    const size_t yBytes = (size_t)d.T * H * esOf(c_.out) + kSlack;
    if (reshape) {
      MOE_CUDA(d.dx.alloc(d.x.size() * 2));
      MOE_CUDA(d.didx.alloc(d.idx.size() * 4));
      MOE_CUDA(d.dwts.alloc(d.idx.size() * 4));
      MOE_CUDA(d.dw1.alloc(d.w1.size() * 2));
      MOE_CUDA(d.dw2.alloc(d.w2.size() * 2));
      MOE_CUDA(d.dy.alloc(yBytes));
      MOE_CUDA(d.dcnt.alloc(epr * 4));
      MOE_CUDA(d.doff.alloc((epr + 1) * 4));
    }
    if (reshape || rows != d.maxRows) {
      d.maxRows = rows;
      MOE_CUDA(d.dxr.alloc(rows * H * 2));
      MOE_CUDA(d.dh.alloc(rows * 2 * I * 2));
      MOE_CUDA(d.dact.alloc(rows * I * 2));
      MOE_CUDA(d.dout.alloc(rows * H * 4));
    }
    auto h2d = [](void* dst, const void* src, size_t bytes) {
      return bytes ? mktest::syncMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) : cudaSuccess;
    };
    MOE_CUDA(h2d(d.dx.p, d.x.data(), d.x.size() * 2));
    MOE_CUDA(h2d(d.didx.p, d.idx.data(), d.idx.size() * 4));
    MOE_CUDA(h2d(d.dwts.p, d.wts.data(), d.wts.size() * 4));
    MOE_CUDA(h2d(d.dw1.p, d.w1.data(), d.w1.size() * 2));
    MOE_CUDA(h2d(d.dw2.p, d.w2.data(), d.w2.size() * 2));
    // 0xff bytes: NaN in bf16, fp16 and fp32.
    MOE_CUDA(mktest::syncMemset(d.dy.p, 0xff, yBytes));
    MOE_CUDA(mktest::syncMemset(d.dxr.p, 0xff, rows * H * 2));
    MOE_CUDA(mktest::syncMemset(d.dh.p, 0xff, rows * 2 * I * 2));
    MOE_CUDA(mktest::syncMemset(d.dact.p, 0xff, rows * I * 2));
    MOE_CUDA(mktest::syncMemset(d.dout.p, 0xff, rows * H * 4));
    MOE_CUDA(mktest::syncMemset(d.dcnt.p, 0x5a, epr * 4));
    MOE_CUDA(mktest::syncMemset(d.doff.p, 0x5a, (epr + 1) * 4));
    return "";
  }

  FfnCase c_;
  std::vector<Rank> ranks_;
  std::vector<std::vector<int>> cnt_;  // [rank][local expert] rows expected
  std::vector<size_t> need_;           // rows each rank's layout spans
  int64_t badSlot_ = -1;
};

// Bounded wait for a stream whose comm may have failed (its kernels end within the timeout).
std::string drain(cudaStream_t s, double timeoutS = 60) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return "";
    if (e != cudaErrorNotReady) return std::string("cudaStreamQuery: ") + cudaGetErrorString(e);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeoutS)
      return "stream still busy after " + std::to_string((int)timeoutS) + " s";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string callAndWait(gputest::Team& t, FfnProblem& p, int r) {
  const ncclResult_t res = p.call(r, t.comms[r], t.streams[r]);
  if (res != ncclSuccess)
    return "rank " + std::to_string(r) + ": " + ncclGetErrorString(res) + ": " +
           ncclGetLastError(t.comms[r]);
  return waitRank(r, t.comms[r], t.streams[r]);
}

// One call per rank thread, then every rank checked (in parallel, one rank per thread).
std::string runAndCheck(gputest::Team& t, FfnProblem& p) {
  const std::string err = t.run([&](int r) { return callAndWait(t, p, r); });
  if (!err.empty()) return err;
  return t.run([&](int r) { return p.check(r); });
}

class MoeFfnThreads : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
};

TEST_P(MoeFfnThreads, RandomRoutingEveryElementChecked) {
  const int n = GetParam();
  const uint64_t seed = mktest::testSeed() ^ (0xff17ull * n);
  SCOPED_TRACE("seed " + std::to_string(seed) +
               " (MKTEST_SEED=" + std::to_string(mktest::testSeed()) + " repeats it)");
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  std::mt19937_64 rng(seed);
  const int eprs[] = {1, 3, 8};
  const int ks[] = {1, 2, 6};
  const ncclDataType_t outs[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
  for (int i = 0; i < 6; ++i) {
    FfnCase c;
    c.n = n;
    c.epr = eprs[(i + n) % 3];
    c.k = ks[(i + n / 2) % 3];
    c.H = i % 3 == 2 ? 128 : 64;
    c.I = i < 3 ? 32 : 64;
    c.in = i % 2 ? ncclFloat16 : ncclBfloat16;
    c.out = outs[i % 3];  // with c.in: every (in, out) pair once
    c.layout = (i / 2) % 2 ? ncclFusedLayoutKN : ncclFusedLayoutNK;
    c.routing = (Routing)((i / 2 + n) % 3);
    c.minT = 37;
    c.maxT = 300;
    FfnProblem p(c);
    DrawOpts o;
    o.slack = (int)(rng() % 200);
    o.emptyRank = i == 4 && n > 1 ? n - 1 : -1;
    ASSERT_EQ(p.draw(rng(), o), "") << caseName(c);
    ASSERT_EQ(runAndCheck(t, p), "") << caseName(c);
    // Back to back on the same comm: new routing and inputs in the same input buffers.
    DrawOpts again;
    again.reshape = false;
    ASSERT_EQ(p.draw(rng(), again), "") << caseName(c);
    ASSERT_EQ(runAndCheck(t, p), "") << caseName(c) << " (second call)";
  }
}

INSTANTIATE_TEST_SUITE_P(MoeFfn, MoeFfnThreads, ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// Captured once per rank thread (after an eager call), replayed with new routing, tokens and
// weights written into the same buffers: every replay checked.
TEST(MoeFfnGraph, ReplaysWithNewRouting) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "20000");
  const uint64_t seed = mktest::testSeed() ^ 0x9af;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 4;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  FfnCase c{n, 2, 6, 64, 32, ncclBfloat16, ncclBfloat16, ncclFusedLayoutKN, kUniform, 37, 200};
  FfnProblem p(c);
  std::mt19937_64 rng(seed);
  // Enough for any routing: every slot of every rank on one expert, plus the padding.
  const size_t rows = (size_t)n * c.maxT * c.k + (size_t)c.epr * NCCL_MOE_ROW_ALIGN;
  DrawOpts o;
  o.fixedRows = rows;
  ASSERT_EQ(p.draw(rng(), o), "");
  ASSERT_EQ(runAndCheck(t, p), "") << "eager call";
  std::vector<cudaGraphExec_t> execs(n, nullptr);
  std::string err = t.run([&](int r) -> std::string {
    cudaGraph_t g = nullptr;
    MOE_CUDA(cudaStreamBeginCapture(t.streams[r], cudaStreamCaptureModeThreadLocal));
    const ncclResult_t res = p.call(r, t.comms[r], t.streams[r]);
    const cudaError_t ce = cudaStreamEndCapture(t.streams[r], &g);
    if (res != ncclSuccess) return "capture: " + std::string(ncclGetLastError(t.comms[r]));
    MOE_CUDA(ce);
    MOE_CUDA(cudaGraphInstantiate(&execs[r], g, 0));
    cudaGraphDestroy(g);
    return "";
  });
  for (int rep = 0; rep < 5 && err.empty(); ++rep) {
    p.c().routing = (Routing)(rep % 3);
    DrawOpts again;
    again.reshape = false;
    again.fixedRows = rows;
    err = p.draw(rng(), again);
    if (err.empty())
      err = t.run([&](int r) -> std::string {
        MOE_CUDA(cudaGraphLaunch(execs[r], t.streams[r]));
        return waitRank(r, t.comms[r], t.streams[r]);
      });
    if (err.empty()) err = t.run([&](int r) { return p.check(r); });
    if (!err.empty()) err = "replay " + std::to_string(rep) + ": " + err;
  }
  for (auto x : execs)
    if (x) cudaGraphExecDestroy(x);
  EXPECT_EQ(err, "");
}

// Every rank calls once; the rank `failing` is expected to report an async error, the others
// to complete. The failing rank's call may itself return the error (its comm failed while the
// call was still enqueueing); its peers must not notice anything.
struct Outcome {
  std::vector<ncclResult_t> res;
  std::vector<std::string> errs;
};
std::string runExpectingFailure(gputest::Team& t, FfnProblem& p, int failing, Outcome* o) {
  o->res.assign(t.n, ncclSuccess);
  o->errs.assign(t.n, "");
  const std::string err = t.run([&](int r) -> std::string {
    o->res[r] = p.call(r, t.comms[r], t.streams[r]);
    if (o->res[r] != ncclSuccess && r != failing)
      return "rank " + std::to_string(r) + ": " + ncclGetErrorString(o->res[r]) + ": " +
             ncclGetLastError(t.comms[r]);
    o->errs[r] = waitRank(r, t.comms[r], t.streams[r]);
    return drain(t.streams[r]);  // before its buffers are read
  });
  if (!err.empty()) return err;
  for (int r = 0; r < t.n; ++r)
    if (r != failing && !o->errs[r].empty()) return "peer " + o->errs[r];
  if (o->res[failing] != ncclSuccess && o->res[failing] != ncclInvalidUsage)
    return "failing rank's call returned " + std::string(ncclGetErrorString(o->res[failing]));
  ncclResult_t a = ncclSuccess;
  if (ncclCommGetAsyncError(t.comms[failing], &a) != ncclSuccess || a != ncclInvalidUsage)
    return "failing rank's async error is " + std::string(ncclGetErrorString(a)) +
           ", expected ncclInvalidUsage";
  return "";
}

// Rank 1's bound is one row short: it receives nothing (counts 0), its comm reports the
// overflow naming the op and the rows; its peers complete, their slots routed to rank 1's
// experts contribute zeros and every other slot is correct.
TEST(MoeFfnOverflow, ReportedPeersComplete) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "5000");  // a peer left waiting fails fast
  const uint64_t seed = mktest::testSeed() ^ 0x0f2;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 3, tight = 1;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  FfnCase c{n, 2, 2, 64, 32, ncclBfloat16, ncclFloat32, ncclFusedLayoutNK, kUniform, 37, 120};
  FfnProblem p(c);
  DrawOpts o;
  o.tight = tight;
  ASSERT_EQ(p.draw(seed, o), "");
  ASSERT_GT(p.need(tight), 0u);
  Outcome out;
  ASSERT_EQ(runExpectingFailure(t, p, tight, &out), "");
  const std::string& msg = out.errs[tight];
  EXPECT_NE(msg.find("MoeDispatchFfnCombine"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(p.need(tight)) + " rows"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bound of " + std::to_string(p.need(tight) - 1) + " rows"), std::string::npos)
      << msg;
  for (int r = 0; r < n; ++r) EXPECT_EQ(p.check(r, tight, r == tight), "") << "rank " << r;
}

// One topkIdx entry of rank 2 is E + 5: its comm reports the slot and the id; the slot counts
// as unused everywhere (layouts without it) and contributes nothing; every other slot of every
// rank is correct.
TEST(MoeFfnBadId, ReportedOtherSlotsCorrect) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "5000");
  const uint64_t seed = mktest::testSeed() ^ 0xbad;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 3, bad = 2;
  gputest::Team t(n);
  ASSERT_TRUE(t.ok) << t.why;
  FfnCase c{n, 2, 3, 64, 32, ncclFloat16, ncclBfloat16, ncclFusedLayoutKN, kUniform, 37, 120};
  FfnProblem p(c);
  DrawOpts o;
  o.badRank = bad;
  ASSERT_EQ(p.draw(seed, o), "");
  Outcome out;
  ASSERT_EQ(runExpectingFailure(t, p, bad, &out), "");
  const std::string& msg = out.errs[bad];
  EXPECT_NE(msg.find("topkIdx slot " + std::to_string(p.badSlot()) + " holds expert id " +
                     std::to_string(p.experts() + 5)),
            std::string::npos)
      << msg;
  for (int r = 0; r < n; ++r) EXPECT_EQ(p.check(r, -1, r == bad), "") << "rank " << r;
}

// The rules of the whole layer beyond the dispatch's, refused before any CUDA work.
TEST(MoeFfnArgs, RulesRefusedWithAMessage) {
  MKTEST_REQUIRE_GPU();
  gputest::Team t(2);
  ASSERT_TRUE(t.ok) << t.why;
  FfnCase c{2, 2, 2, 64, 32, ncclBfloat16, ncclBfloat16, ncclFusedLayoutNK, kUniform, 37, 60};
  FfnProblem p(c);
  ASSERT_EQ(p.draw(mktest::testSeed() ^ 0xa56, DrawOpts()), "");
  Rank& d = p.rank(0);
  const ncclMoeFfnBuffers_t good = p.buffers(0);
  ncclComm_t comm = t.comms[0];
  struct Args {
    const float* wts;
    const void* w2;
    void* y;
    ncclMoeFfnBuffers_t buf;
    bool noBuf;
    size_t inter;
  };
  const Args ok{d.dwts.as<float>(), d.dw2.p, d.dy.p, good, false, 32};
  auto refused = [&](Args a, const std::string& what) {
    const ncclResult_t res = ncclMoeDispatchFfnCombine(
        d.dx.p, d.didx.as<int>(), a.wts, d.dw1.p, a.w2, a.y, a.noBuf ? nullptr : &a.buf, d.T, 64,
        a.inter, 4, 2, ncclBfloat16, nullptr, comm, t.streams[0]);
    EXPECT_EQ(res, ncclInvalidArgument) << what;
    const std::string m = ncclGetLastError(comm);
    EXPECT_NE(m.find(what), std::string::npos) << what << ": " << m;
    EXPECT_NE(m.find("ncclMoeDispatchFfnCombine"), std::string::npos) << m;
  };
  Args a = ok;
  a.inter = 36;
  refused(a, "inter=36");
  a.inter = size_t(1) << 30;
  refused(a, "below 2^30");
  const std::string nulls = "buf->act and buf->out must not be NULL";
  a = ok;
  a.w2 = nullptr;
  refused(a, nulls);
  a = ok;
  a.y = nullptr;
  refused(a, nulls);
  a = ok;
  a.buf.act = nullptr;
  refused(a, nulls);
  a = ok;
  a.buf.out = nullptr;
  refused(a, nulls);
  a = ok;
  a.wts = nullptr;
  refused(a, "topkWeights must not be NULL");
  a = ok;
  a.y = static_cast<char*>(d.dy.p) + 8;
  refused(a, "w2, y, buf->act and buf->out must be 16-byte aligned");
  a = ok;
  a.buf.out = d.dout.as<float>() + 1;
  refused(a, "w2, y, buf->act and buf->out must be 16-byte aligned");
  a = ok;
  a.buf.h = nullptr;
  refused(a, "buf->h");
  a = ok;
  a.noBuf = true;
  refused(a, "buf must not be NULL");
  // Nothing ran: the poisoned outputs are untouched.
  int32_t cnt = 0;
  uint32_t y = 0;
  ASSERT_EQ(cudaMemcpy(&cnt, d.dcnt.p, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&y, d.dy.p, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ((uint32_t)cnt, 0x5a5a5a5au);
  EXPECT_EQ(y, 0xffffffffu);
}

}  // namespace
