// Host reference of ncclRingAttention (include/mkernel/fused.h, "Ring attention") for the
// RingAttn* GPU tests, written from the header's contract alone (no library code), and the
// device buffers of one call on the ranks a thread or process drives.
//
// Reference: for every (batch b, query row s of rank r, query head h) the global position of
// the row (contiguous: r*S + s; zigzag, C = S/2: s < C ? r*C + s : (2n-1-r)*C + s - C), the
// scores scale * q.k_j in fp64 against the keys of every rank's slice (causal: only the keys
// whose position <= the query's; key/value head h / (hq/hkv)), softmax in fp64 and
// out = sum_j p_j v_j, lse = log(sum_j exp(scale * q.k_j)). The inputs are bf16/fp16 values,
// so their products are exact in fp64: the reference is the exact attention of the inputs.
//
// Tolerance of out, element d of a row, p_j the exact probabilities, A = sum_j p_j |v_jd|,
// u the unit roundoff of inType (2^-8 bf16, 2^-11 fp16):
//     |got - ref| <= (2u + g) A + 2u |ref| + fSub + fOut
//  - P rounded to inType before P.V (the contract): the kernel's probabilities are taken
//    against a running maximum, so they are <= 1 and each moves by at most u times itself when
//    rounded: the numerator moves by at most u A. Counted twice (2u A) as margin for the
//    approximations below (|out| for |ref|, exp2.approx's few ulps of fp32).
//  - The row sum: fp32 sum of the probabilities; if it summed the rounded ones it would be off
//    by up to u relative: u |ref|. out rounded once to inType: u |ref|.
//  - g, the fp32 work, as worst cases: a score accumulated over D products in fp32 is off by
//    at most e = D 2^-24 scale |q||k| (Cauchy-Schwarz bounds sum |q_i k_i|), which moves p_j
//    by the factor exp(+-e) in the numerator and the denominator: 2 e_max; the P.V and row-sum
//    accumulations and the online rescalings over nKeys keys: 3 nKeys 2^-24; exp2: 2^-20.
//  - fSub (fp16 only): a probability below 2^-14 is a subnormal, rounded to within 2^-25
//    absolute (relative to the running maximum, which is at most the row's): at most
//    2^-25 sum_j |v_jd| / L with L = sum_j exp(s_j - max) >= 1. fOut: half the spacing of
//    fp16's subnormals (2^-25) where out itself is that small; 0 for bf16.
// The bound is a worst case (about 2u A, e.g. 0.6 % of A for bf16), loose enough to let a
// kernel that drops one key of a long row pass. So a second, statistical check covers the
// whole call: roundings to nearest are zero-mean with variance at most (u x)^2 / 3, so the
// sum over every element of (got - ref)^2 must stay below 9 times the sum of the variances
// of the roundings that the bound counts (P: sum_j p_j^2 v_jd^2, out and row sum: 2 ref^2),
// plus (2^-24 A)^2 per element: the RMS error within 3 times its expected worst.
// lse: |got - ref| <= 1e-3 + 2 e_max + 2^-21 |ref| (fp32 max and log of an fp32 sum of the
// unrounded probabilities; the header says the softmax runs in fp32).
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include "common/parallel.h"
#include "common/test_util.h"
#include "gpu/test_moe_util.h"  // MOE_CUDA, bf16/fp16 bits
#include "mkernel/fused.h"

namespace attntest {

using moetest::fromBits;
using moetest::toBits;

struct Shape {
  int n = 1;  // ranks
  int B = 1, S = 1, Hq = 1, Hkv = 1, D = 64;
  ncclDataType_t in = ncclBfloat16;
  bool causal = false;
  int layout = ncclRingAttnContiguous;
  float scale = 0.0f;  // the config's: <= 0 means 1/sqrt(D)
  int algo = ncclFusedAuto;
  bool lse = true;  // false: lse passed as NULL
  size_t qElems() const { return (size_t)B * S * Hq * D; }
  size_t kvElems() const { return (size_t)B * S * Hkv * D; }
  size_t lseElems() const { return (size_t)B * Hq * S; }
  double scaleUsed() const { return scale > 0 ? (double)scale : 1.0 / std::sqrt((double)D); }
  // Host work of the reference for every rank: scores and P.V over the attended keys.
  double flops() const {
    const double seq = (double)n * S;
    return 4.0 * B * Hq * D * seq * seq * (causal ? 0.5 : 1.0);
  }
};

inline std::string name(const Shape& c) {
  static const char* algos[] = {"auto", "fused", "seq"};
  char b[200];
  snprintf(b, sizeof(b), "n%d_B%d_S%d_hq%d_hkv%d_D%d_%s%s%s%s%s_%s", c.n, c.B, c.S, c.Hq, c.Hkv,
           c.D, c.in == ncclFloat16 ? "f16" : "bf16", c.causal ? "_causal" : "",
           c.layout == ncclRingAttnZigzag ? "_zigzag" : "", c.lse ? "" : "_noLse",
           c.scale > 0 ? ("_scale" + std::to_string(c.scale)).c_str() : "", algos[c.algo % 3]);
  return b;
}

// Smaller batch, then fewer heads (down to two key/value heads, which a wrong GQA mapping
// needs to show), then a shorter slice (kept even for zigzag), then one key/value head, until
// the reference costs at most `budget` flops: the whole RingAttn* suite stays within a minute.
inline void shrink(Shape* c, double budget) {
  auto fewerHeads = [c] {
    const int g = c->Hq / c->Hkv;
    c->Hkv--;
    c->Hq = g * c->Hkv;
  };
  while (c->flops() > budget) {
    if (c->B > 1)
      c->B--;
    else if (c->Hkv > 2)
      fewerHeads();
    else if (c->S > 2)
      c->S = std::max(2, c->S * 3 / 4) & ~1;
    else if (c->Hkv > 1)
      fewerHeads();
    else
      break;
  }
}

// Global position of row s of rank r's slice: the header's layouts, written out here again.
inline int64_t position(const Shape& c, int r, int s) {
  if (c.layout != ncclRingAttnZigzag) return (int64_t)r * c.S + s;
  const int C = c.S / 2;
  return s < C ? (int64_t)r * C + s : (int64_t)(2 * c.n - 1 - r) * C + (s - C);
}

using mktest::parallelFor;

// What a check saw, for the log: the worst element against its bound and the RMS error
// against the statistical check's expectation (a ratio of 1 is the failing line of each).
struct Stats {
  double worstOut = 0, worstLse = 0, rms = 0;
  void merge(const Stats& o) {
    worstOut = std::max(worstOut, o.worstOut);
    worstLse = std::max(worstLse, o.worstLse);
    rms = std::max(rms, o.rms);
  }
  std::string str() const {
    char b[160];
    snprintf(b, sizeof(b), "worst |err|/bound: out %.3f lse %.3f; rms/limit %.3f", worstOut,
             worstLse, rms);
    return b;
  }
};

// Every rank's inputs (a process regenerates its peers' from the shared seed) and the
// reference check of one rank's outputs.
class Reference {
 public:
  explicit Reference(const Shape& c) : c_(c), q_(c.n), k_(c.n), v_(c.n) {}
  const Shape& c() const { return c_; }
  const std::vector<uint16_t>& q(int r) const { return q_[r]; }
  const std::vector<uint16_t>& k(int r) const { return k_[r]; }
  const std::vector<uint16_t>& v(int r) const { return v_[r]; }

  // Normal inputs of unit variance: with the default scale the scores have unit variance
  // (softmax neither uniform nor one-hot); a function of (seed, rank) only.
  void draw(uint64_t seed) {
    for (int r = 0; r < c_.n; ++r) {
      std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 977 * (uint64_t)r + 1);
      std::normal_distribution<float> nd(0.f, 1.f);
      auto fill = [&](std::vector<uint16_t>& x, size_t count) {
        x.resize(count);
        for (auto& e : x) e = toBits(nd(rng), c_.in);
      };
      fill(q_[r], c_.qElems());
      fill(k_[r], c_.kvElems());
      fill(v_[r], c_.kvElems());
    }
    prepared_ = false;
  }

  // Rank r's out (bits of inType) and lse (nullptr: not requested) against the reference;
  // "" or the first failures. *st (may be nullptr) gets the margins.
  std::string check(int r, const std::vector<uint16_t>& out, const float* lse,
                    Stats* st = nullptr) {
    prepare();
    const Shape& c = c_;
    const int S = c.S, Hq = c.Hq, D = c.D, g = c.Hq / c.Hkv;
    const double u = c.in == ncclBfloat16 ? 1.0 / 256 : 1.0 / 2048;
    const double scale = c.scaleUsed(), t24 = 1.0 / (1 << 24);
    const bool f16 = c.in == ncclFloat16;
    struct Part {
      size_t bad = 0;
      std::string first;  // its first failure
      double sumSq = 0, sumVar = 0;
      Stats st;
    };
    std::vector<Part> parts((size_t)B() * S);
    parallelFor((size_t)B() * S, [&](size_t unit) {
      Part& pt = parts[unit];
      const int b = (int)(unit / S), s = (int)(unit % S);
      const int64_t qpos = position(c, r, s);
      std::vector<double> w, ref(D), absRef(D), p2(D), sumAbs(D);
      std::vector<const double*> vrow;
      for (int h = 0; h < Hq; ++h) {
        const int hk = h / g;
        const double* qrow = &qd_[r][(((size_t)b * S + s) * Hq + h) * D];
        double qn = 0;
        for (int d = 0; d < D; ++d) qn += qrow[d] * qrow[d];
        qn = std::sqrt(qn);
        w.clear();
        vrow.clear();
        double m = -std::numeric_limits<double>::infinity(), eMax = 0;
        for (int rk = 0; rk < c.n; ++rk)
          for (int sk = 0; sk < S; ++sk) {
            if (c.causal && kpos_[rk][sk] > qpos) continue;
            const size_t row = ((size_t)b * S + sk) * c.Hkv + hk;
            const double* krow = &kd_[rk][row * D];
            double a0 = 0, a1 = 0, a2 = 0, a3 = 0;  // four chains: D is a multiple of 4
            for (int d = 0; d < D; d += 4) {
              a0 += qrow[d] * krow[d];
              a1 += qrow[d + 1] * krow[d + 1];
              a2 += qrow[d + 2] * krow[d + 2];
              a3 += qrow[d + 3] * krow[d + 3];
            }
            const double sc = scale * ((a0 + a1) + (a2 + a3));
            w.push_back(sc);
            vrow.push_back(&vd_[rk][row * D]);
            m = std::max(m, sc);
            eMax = std::max(eMax, D * t24 * scale * qn * kn_[rk][row]);
          }
        double L = 0;
        for (double& x : w) L += (x = std::exp(x - m));
        std::fill(ref.begin(), ref.end(), 0.0);
        std::fill(absRef.begin(), absRef.end(), 0.0);
        std::fill(p2.begin(), p2.end(), 0.0);
        std::fill(sumAbs.begin(), sumAbs.end(), 0.0);
        for (size_t j = 0; j < w.size(); ++j) {
          const double p = w[j] / L, pp = p * p;
          const double* vr = vrow[j];
          for (int d = 0; d < D; ++d) {
            const double x = vr[d], ax = std::fabs(x);
            ref[d] += p * x;
            absRef[d] += p * ax;
            p2[d] += pp * x * x;
          }
          if (f16)
            for (int d = 0; d < D; ++d) sumAbs[d] += std::fabs(vr[d]);
        }
        const double gfp = 2 * eMax + 3.0 * w.size() * t24 + 1.0 / (1 << 20);
        const size_t base = (((size_t)b * S + s) * Hq + h) * D;
        for (int d = 0; d < D; ++d) {
          const double got = fromBits(out[base + d], c.in);
          const double fSub = f16 ? sumAbs[d] / L / (1 << 25) : 0;
          const double fOut = f16 ? 1.0 / (1 << 25) : 0;
          const double tol = (2 * u + gfp) * absRef[d] + 2 * u * std::fabs(ref[d]) + fSub + fOut;
          const double err = std::fabs(got - ref[d]);
          pt.st.worstOut = std::max(pt.st.worstOut, err / tol);
          if (!(err <= tol)) fail(pt, "out", b, s, qpos, h, d, got, ref[d], tol);
          const double ta = t24 * absRef[d];
          pt.sumSq += std::isfinite(err) ? err * err : 1e300;
          pt.sumVar += u * u / 3 * (p2[d] + 2 * ref[d] * ref[d]) + ta * ta;
        }
        if (lse) {
          const double want = m + std::log(L);
          const size_t i = ((size_t)b * Hq + h) * S + s;
          const double got = lse[i];
          const double tol = 1e-3 + 2 * eMax + std::fabs(want) / (1 << 21);
          const double err = std::fabs(got - want);
          pt.st.worstLse = std::max(pt.st.worstLse, err / tol);
          if (!(err <= tol)) fail(pt, "lse", b, s, qpos, h, -1, got, want, tol);
        }
      }
    });
    Part all;
    for (const Part& pt : parts) {
      all.bad += pt.bad;
      all.sumSq += pt.sumSq;
      all.sumVar += pt.sumVar;
      all.st.merge(pt.st);
      if (pt.bad && all.first.empty()) all.first = pt.first;  // units in (b, s) order
    }
    all.st.rms = std::sqrt(all.sumSq / (9 * all.sumVar));
    if (st) st->merge(all.st);
    const std::string who = "rank " + std::to_string(r) + " (" + name(c) + "): ";
    if (all.bad)
      return who + std::to_string(all.bad) + " elements outside the bound, first: " + all.first;
    if (!(all.sumSq <= 9 * all.sumVar)) {
      char b[240];
      snprintf(b, sizeof(b),
               "RMS error %.3g is %.2f times the expected worst %.3g of the roundings: every "
               "element is inside its bound, but the errors are too large on the whole "
               "(a key or a rounding step too many or missing?)",
               std::sqrt(all.sumSq / c.qElems()), std::sqrt(all.sumSq / all.sumVar),
               std::sqrt(all.sumVar / c.qElems()));
      return who + b;
    }
    return "";
  }

 private:
  int B() const { return c_.B; }

  // Inputs as doubles, the keys' norms and every rank's key positions (once per draw).
  void prepare() {
    if (prepared_) return;
    const Shape& c = c_;
    qd_.assign(c.n, {});
    kd_.assign(c.n, {});
    vd_.assign(c.n, {});
    kn_.assign(c.n, {});
    kpos_.assign(c.n, {});
    for (int r = 0; r < c.n; ++r) {
      auto conv = [&](const std::vector<uint16_t>& x, std::vector<double>& y) {
        y.resize(x.size());
        for (size_t i = 0; i < x.size(); ++i) y[i] = fromBits(x[i], c.in);
      };
      conv(q_[r], qd_[r]);
      conv(k_[r], kd_[r]);
      conv(v_[r], vd_[r]);
      const size_t rows = (size_t)c.B * c.S * c.Hkv;
      kn_[r].resize(rows);
      for (size_t i = 0; i < rows; ++i) {
        double a = 0;
        for (int d = 0; d < c.D; ++d) a += kd_[r][i * c.D + d] * kd_[r][i * c.D + d];
        kn_[r][i] = std::sqrt(a);
      }
      kpos_[r].resize(c.S);
      for (int s = 0; s < c.S; ++s) kpos_[r][s] = position(c, r, s);
    }
    prepared_ = true;
  }

  template <typename P>
  static void fail(P& pt, const char* what, int b, int s, int64_t pos, int h, int d, double got,
                   double want, double tol) {
    if (pt.bad++ == 0) {
      char m[240];
      snprintf(m, sizeof(m), "%s[b=%d s=%d (position %lld) h=%d%s%s] = %.6g, expected %.6g +- %.3g",
               what, b, s, (long long)pos, h, d >= 0 ? " d=" : "",
               d >= 0 ? std::to_string(d).c_str() : "", got, want, tol);
      pt.first = m;
    }
  }

  Shape c_;
  std::vector<std::vector<uint16_t>> q_, k_, v_;
  std::vector<std::vector<double>> qd_, kd_, vd_, kn_;
  std::vector<std::vector<int64_t>> kpos_;
  bool prepared_ = false;
};

// ---- device side ----------------------------------------------------------------------------
constexpr size_t kSlack = 64;  // poisoned bytes after out and lse: never written

struct DevBuf {
  void* p = nullptr;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  cudaError_t alloc(size_t bytes) { return cudaMalloc(&p, std::max<size_t>(bytes, 16)); }
};

// One call on the ranks this thread or process owns (owned < 0: every rank, ranks that are
// threads; else that rank only): the reference of every rank, the owned ranks' device
// buffers, allocated once so that a captured graph keeps reading them.
class Problem {
 public:
  explicit Problem(const Shape& c, int owned = -1) : ref_(c), bufs_(c.n) {
    for (int r = 0; r < c.n && err.empty(); ++r) {
      if (!owns(r, owned)) continue;
      Bufs& d = bufs_[r];
      if (d.q.alloc(c.qElems() * 2) != cudaSuccess || d.k.alloc(c.kvElems() * 2) != cudaSuccess ||
          d.v.alloc(c.kvElems() * 2) != cudaSuccess ||
          d.out.alloc(c.qElems() * 2 + kSlack) != cudaSuccess ||
          d.lse.alloc(c.lseElems() * 4 + kSlack) != cudaSuccess)
        err = "cudaMalloc failed";
      d.owned = true;
    }
  }
  std::string err;
  const Shape& c() const { return ref_.c(); }
  Reference& ref() { return ref_; }

  // Fresh inputs for every rank, uploaded into the owned ranks' buffers (the same buffers
  // each time), outputs and the bytes after them poisoned (0xff: NaN in bf16, fp16, fp32).
  std::string draw(uint64_t seed) {
    if (!err.empty()) return err;
    ref_.draw(seed);
    const Shape& c = ref_.c();
    for (int r = 0; r < c.n; ++r) {
      Bufs& d = bufs_[r];
      if (!d.owned) continue;
      MOE_CUDA(mktest::syncMemcpy(d.q.p, ref_.q(r).data(), c.qElems() * 2, cudaMemcpyHostToDevice));
      MOE_CUDA(
          mktest::syncMemcpy(d.k.p, ref_.k(r).data(), c.kvElems() * 2, cudaMemcpyHostToDevice));
      MOE_CUDA(
          mktest::syncMemcpy(d.v.p, ref_.v(r).data(), c.kvElems() * 2, cudaMemcpyHostToDevice));
      MOE_CUDA(mktest::syncMemset(d.out.p, 0xff, c.qElems() * 2 + kSlack));
      MOE_CUDA(mktest::syncMemset(d.lse.p, 0xff, c.lseElems() * 4 + kSlack));
    }
    return "";
  }

  ncclRingAttnConfig_t config() const {
    ncclRingAttnConfig_t cfg = NCCL_RING_ATTN_CONFIG_INITIALIZER;
    cfg.causal = c().causal ? 1 : 0;
    cfg.scale = c().scale;
    cfg.seqLayout = c().layout;
    cfg.algo = c().algo;
    return cfg;
  }

  ncclResult_t call(int r, ncclComm_t comm, cudaStream_t s) const {
    const Shape& c = ref_.c();
    const Bufs& d = bufs_[r];
    const ncclRingAttnConfig_t cfg = config();
    return ncclRingAttention(d.q.p, d.k.p, d.v.p, d.out.p, c.lse ? (float*)d.lse.p : nullptr, c.B,
                             c.S, c.Hq, c.Hkv, c.D, c.in, &cfg, comm, s);
  }

  // Rank r's outputs (after its stream is idle): the slack intact, lse untouched when NULL,
  // every element of out and lse against the reference.
  std::string check(int r, Stats* st = nullptr) {
    const Shape& c = ref_.c();
    const Bufs& d = bufs_[r];
    std::vector<uint16_t> out(c.qElems() + kSlack / 2);
    std::vector<float> lse(c.lseElems() + kSlack / 4);
    MOE_CUDA(mktest::syncMemcpy(out.data(), d.out.p, out.size() * 2, cudaMemcpyDeviceToHost));
    MOE_CUDA(mktest::syncMemcpy(lse.data(), d.lse.p, lse.size() * 4, cudaMemcpyDeviceToHost));
    const std::string who = "rank " + std::to_string(r) + ": ";
    for (size_t i = c.qElems(); i < out.size(); ++i)
      if (out[i] != 0xffff) return who + "bytes after out were written";
    const uint8_t* lb = reinterpret_cast<const uint8_t*>(lse.data());
    for (size_t i = (c.lse ? c.lseElems() * 4 : 0); i < lse.size() * 4; ++i)
      if (lb[i] != 0xff)
        return who + (c.lse ? "bytes after lse were written" : "lse written although NULL");
    return ref_.check(r, out, c.lse ? lse.data() : nullptr, st);
  }

  // Device pointers of rank r (for argument tests).
  void* q(int r) const { return bufs_[r].q.p; }
  void* k(int r) const { return bufs_[r].k.p; }
  void* v(int r) const { return bufs_[r].v.p; }
  void* out(int r) const { return bufs_[r].out.p; }
  float* lse(int r) const { return (float*)bufs_[r].lse.p; }

 private:
  static bool owns(int r, int owned) { return owned < 0 || owned == r; }
  struct Bufs {
    DevBuf q, k, v, out, lse;
    bool owned = false;
  };
  Reference ref_;
  std::vector<Bufs> bufs_;
};

}  // namespace attntest
