// Host helpers shared by the MoE GPU tests (test_moe_dispatch.cu, test_moe_ffn.cu,
// test_moe_procs.cu): bf16/fp16 bit patterns, the value an output element holds, a CUDA check
// for functions that return an error string, and the two problems: MoeProblem
// (ncclMoeDispatchGemm: every rank's routing, the expected packed layout and a double-precision
// reference of y) and FfnProblem (ncclMoeDispatchFfnCombine: dispatch, GEMM1, SwiGLU, GEMM2 and
// combine computed on the host with the stored precisions). A problem draws every rank's inputs
// from one seed, so a process that drives one rank draws the same as its peers and checks its own
// rank (only that rank's device buffers are then used).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "base/param.h"
#include "common/parallel.h"
#include "common/test_util.h"
#include "gpu/test_fused_util.cuh"
#include "mkernel/fused.h"

#define MOE_CUDA(x)                                                                \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) return std::string(#x) + ": " + cudaGetErrorString(e_); \
  } while (0)

namespace moetest {

inline uint16_t toBits(float v, ncclDataType_t t) {
  uint16_t b;
  if (t == ncclBfloat16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    memcpy(&b, &h, 2);
  } else {
    const __half h = __float2half_rn(v);
    memcpy(&b, &h, 2);
  }
  return b;
}

inline float fromBits(uint16_t b, ncclDataType_t t) {
  if (t == ncclBfloat16) {
    __nv_bfloat16 h;
    memcpy(&h, &b, 2);
    return __bfloat162float(h);
  }
  __half h;
  memcpy(&h, &b, 2);
  return __half2float(h);
}

// v rounded to t (bf16 or fp16) and back.
inline float roundTo(double v, ncclDataType_t t) {
  return fromBits(toBits((float)v, t), t);
}

// Element i of an output array of type t (fp32, bf16 or fp16) copied to the host as bytes.
inline float outValue(const std::vector<uint8_t>& y, size_t i, ncclDataType_t t) {
  if (t == ncclFloat32) {
    float v;
    memcpy(&v, y.data() + i * 4, 4);
    return v;
  }
  uint16_t b;
  memcpy(&b, y.data() + i * 2, 2);
  return fromBits(b, t);
}

// ---- ncclMoeDispatchGemm: problems of test_moe_dispatch.cu and test_moe_procs.cu ----------

using fusedtest::esOf;

// kOneRank: all of a token's slots name experts of one rank (random per token; experts may
// repeat): the AllToAll path then sends the token once with k slots' metadata. kRailSpill:
// rank 0 has maxT tokens, slot 0 of token t on rank 1 + t % (n - 1) (expert t % epr), its
// other slots -1; the other ranks at most 8 tokens, uniform: at an exact-fit bound rank 0's
// tokens for a remote node exceed a pair buffer (the node dedup's spill rule, moe_node.h).
enum Routing { kUniform, kHotExpert, kSomeEmpty, kOneRank, kRailSpill };

// kRailSpill's expert of rank 0's slot j of token t (-1: unused).
inline int railSpillExpert(int n, int epr, int t, int j) {
  return j == 0 && n > 1 ? (1 + t % (n - 1)) * epr + t % epr : -1;
}

struct MoeCase {
  int n, epr, k, H, N;
  ncclDataType_t in, out;
  int layout;
  Routing routing;
  int maxT;
};

inline std::string caseName(const MoeCase& c) {
  return "n" + std::to_string(c.n) + "_epr" + std::to_string(c.epr) + "_k" + std::to_string(c.k) +
         "_H" + std::to_string(c.H) + "_N" + std::to_string(c.N) +
         (c.in == ncclBfloat16 ? "_bf16" : "_f16") + "_out" + std::to_string((int)c.out) +
         (c.layout == ncclFusedLayoutKN ? "_KN" : "_NK") + "_r" + std::to_string((int)c.routing);
}

// One rank's inputs and outputs (host copies of what the inputs hold) and device buffers.
struct RankData {
  int T = 0;
  std::vector<uint16_t> x;   // [T, H]
  std::vector<int32_t> idx;  // [T, k]
  std::vector<float> wts;    // [T, k]
  std::vector<uint16_t> w1;  // [epr][N][H] or [epr][H][N]
  void *dx = nullptr, *dw1 = nullptr, *dxr = nullptr, *dy = nullptr;
  int32_t *didx = nullptr, *dcnt = nullptr, *doff = nullptr, *dsrc = nullptr;
  float *dwts = nullptr, *drw = nullptr;
  size_t maxRows = 0;
  ~RankData() {
    for (void* p : {dx, dw1, dxr, dy, (void*)didx, (void*)dcnt, (void*)doff, (void*)dsrc,
                    (void*)dwts, (void*)drw})
      if (p) cudaFree(p);
  }
};

// A row of the expected layout: (source rank, token, slot).
struct Src {
  int r, t, j;
};

class MoeProblem {
 public:
  explicit MoeProblem(const MoeCase& c) : c_(c), ranks_(c.n) {}
  // Calls pass NULL topkWeights and rowWeight (allowed: the weights only feed rowWeight).
  bool noWeights = false;
  int algo = ncclFusedAuto;  // ncclMoeConfig_t::algo of the calls
  int commSms = -1;          // ncclMoeConfig_t::commSms of the calls
  RankData& rank(int r) { return ranks_[r]; }
  MoeCase& c() { return c_; }
  size_t need(int r) const { return need_[r]; }  // rows rank r's layout spans

  // Fresh routing (and, with `weights`, fresh tokens and expert weights), uploaded; the
  // expected layout of every rank; outputs poisoned. slack: rows beyond the need per rank
  // (negative on rank `tight`: that rank's bound is exceeded); fixedRows > 0: every rank's
  // bound (buffers kept, as a captured graph needs).
  std::string draw(uint64_t seed, bool weights, int slack, int tight = -1, size_t fixedRows = 0) {
    std::mt19937_64 rng(seed);
    const int E = c_.n * c_.epr;
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int r = 0; r < c_.n; ++r) {
      RankData& d = ranks_[r];
      if (weights) {
        d.T = (int)(rng() % (c_.maxT + 1));
        if (r == 0 && d.T == 0) d.T = 1;
        if (c_.routing == kRailSpill) d.T = r == 0 ? c_.maxT : d.T % 9;
        d.x.resize((size_t)d.T * c_.H);
        for (auto& v : d.x) v = toBits(u(rng), c_.in);
        d.w1.resize((size_t)c_.epr * c_.N * c_.H);
        for (auto& v : d.w1) v = toBits(u(rng) * 0.25f, c_.in);
      }
      d.idx.assign((size_t)d.T * c_.k, -1);
      d.wts.resize(d.idx.size());
      const int hot = (int)(rng() % E);
      for (int t = 0; t < d.T; ++t) {
        const int owner = c_.routing == kOneRank ? (int)(rng() % c_.n) : 0;
        for (int j = 0; j < c_.k; ++j) {
          int e = -1;
          const uint64_t roll = rng() % 16;
          if (c_.routing == kRailSpill && r == 0) {
            e = railSpillExpert(c_.n, c_.epr, t, j);
          } else if (roll == 0) {
            e = -1;  // unused slot
          } else if (c_.routing == kHotExpert && roll < 12) {
            e = hot;
          } else if (c_.routing == kSomeEmpty) {
            e = (int)(rng() % E) & ~1;  // odd experts stay empty
          } else if (c_.routing == kOneRank) {
            e = owner * c_.epr + (int)(rng() % c_.epr);
          } else {
            e = (int)(rng() % E);
          }
          d.idx[(size_t)t * c_.k + j] = e;
          d.wts[(size_t)t * c_.k + j] = u(rng);
        }
      }
    }
    // Expected layout of every destination.
    expect_.assign(c_.n, {});
    need_.assign(c_.n, 0);
    for (int dst = 0; dst < c_.n; ++dst) {
      std::vector<std::vector<Src>>& ex = expect_[dst];
      ex.assign(c_.epr, {});
      for (int le = 0; le < c_.epr; ++le)
        for (int src = 0; src < c_.n; ++src) {
          const RankData& s = ranks_[src];
          for (int i = 0; i < s.T * c_.k; ++i)
            if (s.idx[i] == dst * c_.epr + le) ex[le].push_back({src, i / c_.k, i % c_.k});
        }
      for (int le = 0; le < c_.epr; ++le) need_[dst] += (ex[le].size() + 127) / 128 * 128;
    }
    for (int r = 0; r < c_.n; ++r) {
      const int64_t want = (int64_t)need_[r] + (r == tight ? -1 : slack);
      const size_t rows = fixedRows > 0 ? fixedRows : (size_t)std::max<int64_t>(want, 1);
      if (rows < need_[r] && r != tight) return "fixedRows below the need of the routing";
      std::string e = upload(ranks_[r], rows, weights);
      if (!e.empty()) return e;
    }
    return "";
  }

  ncclResult_t call(int r, ncclComm_t comm, cudaStream_t s) {
    RankData& d = ranks_[r];
    ncclMoeConfig_t cfg = NCCL_MOE_CONFIG_INITIALIZER;
    cfg.wLayout = c_.layout;
    cfg.outType = c_.out;
    cfg.algo = algo;
    cfg.commSms = commSms;
    ncclMoeRecv_t recv{d.dxr, d.dy, d.dcnt, d.doff, d.dsrc, noWeights ? nullptr : d.drw, d.maxRows};
    return ncclMoeDispatchGemm(d.dx, d.didx, noWeights ? nullptr : d.dwts, d.dw1, &recv, d.T, c_.H,
                               c_.N, c_.n * c_.epr, c_.k, c_.in, &cfg, comm, s);
  }

  // Every output of rank r against the expected layout and a double-precision product.
  std::string check(int r) {
    RankData& d = ranks_[r];
    const int epr = c_.epr;
    std::vector<int32_t> cnt(epr), off(epr + 1), src(d.maxRows * 3);
    std::vector<float> rw(d.maxRows);
    std::vector<uint16_t> xr(d.maxRows * c_.H);
    std::vector<uint8_t> y(d.maxRows * c_.N * fusedtest::esOf(c_.out));
    MOE_CUDA(cudaMemcpy(cnt.data(), d.dcnt, epr * 4, cudaMemcpyDeviceToHost));
    MOE_CUDA(cudaMemcpy(off.data(), d.doff, (epr + 1) * 4, cudaMemcpyDeviceToHost));
    MOE_CUDA(cudaMemcpy(src.data(), d.dsrc, src.size() * 4, cudaMemcpyDeviceToHost));
    MOE_CUDA(cudaMemcpy(rw.data(), d.drw, rw.size() * 4, cudaMemcpyDeviceToHost));
    MOE_CUDA(cudaMemcpy(xr.data(), d.dxr, xr.size() * 2, cudaMemcpyDeviceToHost));
    MOE_CUDA(cudaMemcpy(y.data(), d.dy, y.size(), cudaMemcpyDeviceToHost));
    const std::string who = "rank " + std::to_string(r) + ": ";
    // The rows of y to check against the product once the layout is known to be right.
    struct YRow {
      int64_t rr;
      int le;
      const uint16_t* x;  // the token's row [H]
    };
    std::vector<YRow> yRows;
    int64_t row = 0;
    for (int le = 0; le < epr; ++le) {
      const std::vector<Src>& ex = expect_[r][le];
      if (cnt[le] != (int)ex.size() || off[le] != row)
        return who + "expert " + std::to_string(le) + ": count " + std::to_string(cnt[le]) +
               " offset " + std::to_string(off[le]) + ", expected " + std::to_string(ex.size()) +
               " at " + std::to_string(row);
      for (size_t i = 0; i < ex.size(); ++i) {
        const int64_t rr = row + (int64_t)i;
        const Src& s = ex[i];
        if (src[rr * 3] != s.r || src[rr * 3 + 1] != s.t || src[rr * 3 + 2] != s.j)
          return who + "row " + std::to_string(rr) + ": source (" + std::to_string(src[rr * 3]) +
                 "," + std::to_string(src[rr * 3 + 1]) + "," + std::to_string(src[rr * 3 + 2]) +
                 "), expected (" + std::to_string(s.r) + "," + std::to_string(s.t) + "," +
                 std::to_string(s.j) + ")";
        const RankData& sd = ranks_[s.r];
        if (!noWeights && rw[rr] != sd.wts[(size_t)s.t * c_.k + s.j])
          return who + "row " + std::to_string(rr) + ": weight differs";
        if (memcmp(&xr[rr * c_.H], &sd.x[(size_t)s.t * c_.H], c_.H * 2) != 0)
          return who + "row " + std::to_string(rr) + ": token row differs";
        yRows.push_back({rr, le, &sd.x[(size_t)s.t * c_.H]});
      }
      const int64_t pad = row + (int64_t)(ex.size() + 127) / 128 * 128;
      for (int64_t rr = row + (int64_t)ex.size(); rr < pad; ++rr)
        if (src[rr * 3] != -1 || src[rr * 3 + 1] != -1 || src[rr * 3 + 2] != -1)
          return who + "padding row " + std::to_string(rr) + " has a source";
      row = pad;
    }
    if (off[epr] != row)
      return who + "rows spanned " + std::to_string(off[epr]) + ", expected " + std::to_string(row);
    return checkY(yRows, d.w1, y, who);
  }

  // y against the double-precision product, rows spread over the host's cores (serially this
  // reference set the MoE suites' run time at 8 ranks). Reports the failing row of lowest index.
  template <typename Row>
  std::string checkY(const std::vector<Row>& rows, const std::vector<uint16_t>& w1,
                     const std::vector<uint8_t>& y, const std::string& who) const {
    const int N = c_.N, H = c_.H;
    // The weights as doubles, [epr][N][H] whatever the layout.
    std::vector<double> w((size_t)c_.epr * N * H);
    for (int le = 0; le < c_.epr; ++le)
      for (int col = 0; col < N; ++col)
        for (int h = 0; h < H; ++h) {
          const size_t wi = c_.layout == ncclFusedLayoutNK ? ((size_t)le * N + col) * H + h
                                                           : ((size_t)le * H + h) * N + col;
          w[((size_t)le * N + col) * H + h] = (double)fromBits(w1[wi], c_.in);
        }
    std::vector<std::string> errs(rows.size());
    mktest::parallelFor(rows.size(), [&](size_t i) {
      const Row& q = rows[i];
      std::vector<double> x(H);
      for (int h = 0; h < H; ++h) x[h] = (double)fromBits(q.x[h], c_.in);
      for (int col = 0; col < N; ++col) {
        const double* wr = &w[((size_t)q.le * N + col) * H];
        double ref = 0;
        for (int h = 0; h < H; ++h) ref += x[h] * wr[h];
        const double got = outValue(y, (size_t)q.rr * N + col, c_.out);
        const double tol =
            c_.out == ncclFloat32 ? 1e-3 + 1e-4 * std::fabs(ref) : 2e-2 + 1e-2 * std::fabs(ref);
        if (!(std::fabs(got - ref) <= tol)) {
          errs[i] = who + "y[" + std::to_string(q.rr) + "][" + std::to_string(col) +
                    "] = " + std::to_string(got) + ", expected " + std::to_string(ref);
          return;
        }
      }
    });
    for (const std::string& e : errs)
      if (!e.empty()) return e;
    return "";
  }

 private:
  std::string upload(RankData& d, size_t rows, bool weights) {
    const int epr = c_.epr;
    if (weights || rows != d.maxRows) {
      for (void** p : {&d.dxr, &d.dy, (void**)&d.dsrc, (void**)&d.drw})
        if (*p) {
          cudaFree(*p);
          *p = nullptr;
        }
      d.maxRows = rows;
      MOE_CUDA(cudaMalloc(&d.dxr, rows * c_.H * 2));
      MOE_CUDA(cudaMalloc(&d.dy, rows * c_.N * fusedtest::esOf(c_.out)));
      MOE_CUDA(cudaMalloc(&d.dsrc, rows * 3 * 4));
      MOE_CUDA(cudaMalloc(&d.drw, rows * 4));
    }
    if (weights) {
      for (void** p :
           {&d.dx, &d.dw1, (void**)&d.didx, (void**)&d.dwts, (void**)&d.dcnt, (void**)&d.doff})
        if (*p) {
          cudaFree(*p);
          *p = nullptr;
        }
      MOE_CUDA(cudaMalloc(&d.dx, std::max<size_t>(d.x.size(), 8) * 2));
      MOE_CUDA(cudaMalloc(&d.dw1, d.w1.size() * 2));
      MOE_CUDA(cudaMalloc(&d.didx, std::max<size_t>(d.idx.size(), 1) * 4));
      MOE_CUDA(cudaMalloc(&d.dwts, std::max<size_t>(d.idx.size(), 1) * 4));
      MOE_CUDA(cudaMalloc(&d.dcnt, epr * 4));
      MOE_CUDA(cudaMalloc(&d.doff, (epr + 1) * 4));
      MOE_CUDA(mktest::syncMemcpy(d.dx, d.x.data(), d.x.size() * 2, cudaMemcpyHostToDevice));
      MOE_CUDA(mktest::syncMemcpy(d.dw1, d.w1.data(), d.w1.size() * 2, cudaMemcpyHostToDevice));
    }
    MOE_CUDA(mktest::syncMemcpy(d.didx, d.idx.data(), d.idx.size() * 4, cudaMemcpyHostToDevice));
    MOE_CUDA(mktest::syncMemcpy(d.dwts, d.wts.data(), d.wts.size() * 4, cudaMemcpyHostToDevice));
    // Poison every output. Every upload and poison waits for the device (syncMemcpy/Memset):
    // the calls run on non-blocking streams, which do not wait for the legacy stream. A poisoned
    // count landing after the dispatch wrote it would send the kernels out of bounds: the
    // likely cause (unconfirmed) of session 51's crashes with ranks as time-sliced processes.
    MOE_CUDA(mktest::syncMemset(d.dxr, 0xa5, rows * c_.H * 2));
    MOE_CUDA(mktest::syncMemset(d.dy, 0xa5, rows * c_.N * fusedtest::esOf(c_.out)));
    MOE_CUDA(mktest::syncMemset(d.dsrc, 0x5a, rows * 3 * 4));
    MOE_CUDA(mktest::syncMemset(d.drw, 0x5a, rows * 4));
    MOE_CUDA(mktest::syncMemset(d.dcnt, 0x5a, epr * 4));
    MOE_CUDA(mktest::syncMemset(d.doff, 0x5a, (epr + 1) * 4));
    return "";
  }

  MoeCase c_;
  std::vector<RankData> ranks_;
  std::vector<std::vector<std::vector<Src>>> expect_;  // [dst][expert] rows in order
  std::vector<size_t> need_;
};

// ---- ncclMoeDispatchFfnCombine: problems of test_moe_ffn.cu and test_moe_procs.cu -----------

struct FfnCase {
  int n, epr, k, H, I;
  ncclDataType_t in, out;
  int layout;
  Routing routing;
  int minT, maxT;
};

inline std::string caseName(const FfnCase& c) {
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
  int algo = ncclFusedAuto;  // the config's algo (ncclFusedFused: the fused layer kernel)
  int commSms = -1;          // the config's commSms
  int fusedRank = -1;        // this rank alone passes ncclFusedFused (a caller's mistake, tested)

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
      if (o.reshape && c_.routing == kRailSpill) d.T = r == 0 ? c_.maxT : d.T % 9;
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
        const int owner = c_.routing == kOneRank ? (int)(rng() % c_.n) : 0;
        for (int j = 0; j < k; ++j) {
          int e = -1;
          const uint64_t roll = rng() % 16;
          if (c_.routing == kRailSpill && r == 0) {
            e = railSpillExpert(c_.n, epr, t, j);
          } else if (!none && roll != 0) {
            if (c_.routing == kHotExpert && roll < 12)
              e = hot;
            else if (c_.routing == kSomeEmpty)
              e = (int)(rng() % E) & ~1;  // odd experts stay empty
            else if (c_.routing == kOneRank)
              e = owner * c_.epr + (int)(rng() % c_.epr);
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
    cfg.algo = r == fusedRank ? ncclFusedFused : algo;
    cfg.commSms = commSms;
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
    // The combine takes each expert output rounded to inType (as the reference's `out` is): a
    // GEMM2 sum on the other side of a rounding boundary from the reference's ends one step of
    // inType (rIn relative, or fp16's subnormal step) away.
    const double stepIn = c_.in == ncclFloat16 ? 1.0 / (1 << 24) : 0;
    std::vector<double> xd(H), out(H), absOut(H), ref(H), absRef(H), outRef(H);
    const size_t rowBytes = (size_t)H * esOf(c_.out);
    for (int t = 0; t < d.T; ++t) {
      const uint8_t* yr = y.data() + (size_t)t * rowBytes;
      if (mayBeUntouched && std::all_of(yr, yr + rowBytes, [](uint8_t b) { return b == 0xff; }))
        continue;
      std::fill(ref.begin(), ref.end(), 0.0);
      std::fill(absRef.begin(), absRef.end(), 0.0);
      std::fill(outRef.begin(), outRef.end(), 0.0);
      for (int h = 0; h < H; ++h) xd[h] = fromBits(d.x[(size_t)t * H + h], c_.in);
      std::string slots;
      int used = 0;    // slots that contribute
      float wOne = 0;  // the weight of the last of them
      for (int j = 0; j < c_.k; ++j) {
        const int e = d.idx[(size_t)t * c_.k + j];
        slots += " " + std::to_string(e);
        if (e < 0 || e >= E || e / epr == lostOwner) continue;
        expert(e / epr, e % epr, xd.data(), out.data(), absOut.data());
        const double w = d.wts[(size_t)t * c_.k + j];
        ++used;
        wOne = (float)w;
        for (int c = 0; c < H; ++c) {
          ref[c] += w * out[c];
          absRef[c] += std::fabs(w) * absOut[c];
          outRef[c] += std::fabs(w) * (rIn * std::fabs(out[c]) + stepIn);
        }
      }
      for (int c = 0; c < H; ++c) {
        const double got = outValue(y, (size_t)t * H + c, c_.out);
        const double tol =
            rIn * absRef[c] + outRef[c] + uOut * std::fabs(ref[c]) + (absRef[c] > 0 ? atol : 0);
        if (!(std::fabs(got - ref[c]) <= tol))
          return who + "y[" + std::to_string(t) + "][" + std::to_string(c) +
                 "] = " + std::to_string(got) + ", expected " + std::to_string(ref[c]) + " +- " +
                 std::to_string(tol) + " (experts of the token's slots:" + slots + ")";
        // Exactly: with one slot and y in fp32, y = fp32(w * v) for an inType value v (the
        // combine takes the expert output rounded to inType; w * v is exact in double, and
        // y / w lies far closer to v than half a step of inType). The tolerance above cannot
        // tell a path that skipped the rounding; this can (an fp32 value lies on an inType one
        // about once in 2^13 to 2^16).
        if (used == 1 && wOne != 0 && c_.out == ncclFloat32) {
          const double v = roundTo(got / wOne, c_.in);
          if ((float)((double)wOne * v) != (float)got)
            return who + "y[" + std::to_string(t) + "][" + std::to_string(c) +
                   "] = " + std::to_string(got) + " is not the weight " + std::to_string(wOne) +
                   " times an inType value: the expert output was not rounded to inType";
        }
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
    // With w1 in the NK layout GEMM1 applies SwiGLU to its fp32 accumulators (no rounded h;
    // MKERNEL_MOE_SWIGLU_EPILOGUE), otherwise a SwiGLU kernel reads h stored in inType.
    const bool roundH = c_.layout != ncclFusedLayoutNK || MK_PARAM_INT(MoeSwigluEpilogue) == 0;
    for (int n = 0; n < 2 * I; ++n) {
      const double* w = &o.w1f[((size_t)le * 2 * I + n) * H];
      double s = 0;
      for (int k = 0; k < H; ++k) s += x[k] * w[k];
      h[n] = roundH ? roundTo(s, c_.in) : (float)s;
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
      // buf->out is fp32; every combine takes it rounded to inType (combine_dev.cuh).
      out[c] = roundTo(s, c_.in);
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

 public:
  // Rank r's y poisoned again (NaN), for a second run on the same inputs.
  std::string poisonY(int r) {
    Rank& d = ranks_[r];
    MOE_CUDA(mktest::syncMemset(d.dy.p, 0xff, (size_t)d.T * c_.H * esOf(c_.out) + kSlack));
    return "";
  }
  // Rank r's y bytes (the slack after it included: never written).
  std::string readY(int r, std::vector<uint8_t>* y) {
    Rank& d = ranks_[r];
    y->assign((size_t)d.T * c_.H * esOf(c_.out) + kSlack, 0);
    MOE_CUDA(cudaMemcpy(y->data(), d.dy.p, y->size(), cudaMemcpyDeviceToHost));
    return "";
  }

 private:
  FfnCase c_;
  std::vector<Rank> ranks_;
  std::vector<std::vector<int>> cnt_;  // [rank][local expert] rows expected
  std::vector<size_t> need_;           // rows each rank's layout spans
  int64_t badSlot_ = -1;
};

}  // namespace moetest
