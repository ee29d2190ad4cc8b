// Data primitives of the collective kernels: dtype traits, CTA-wide copies and the
// n-source reduction. 16-byte accesses wherever every pointer involved shares the same
// alignment; scalar head/tail (copies) or a scalar element loop (reductions) otherwise.
// Loads use ld.global.cg (L2 only): workspace slots are rewritten by peers between two
// reads of the same address, and L1 is not coherent with those writes.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <nccl.h>
#include <type_traits>

#include "coll/launch.h"

namespace mk {
namespace dev {

// ---- dtype traits: U = unsigned storage of the element, Acc = accumulation type --------
// Integers accumulate with wrapping (unsigned) arithmetic; half, bf16 and fp8 accumulate
// in float and are rounded once when a reduction step stores its result.
template <int DT>
struct Num;

template <typename UT, typename ST, typename AccT>
struct IntNum {
  using U = UT;
  using Acc = AccT;
  static constexpr bool kFloat = false;
  __device__ static Acc toAcc(U u) { return (Acc)(ST)u; }
  __device__ static U fromAcc(Acc a) { return (U)a; }
  // ncclAvg on integers: wrap the sum to the element type, then integer division.
  __device__ static U divide(Acc a, int d) { return (U)(ST)((ST)fromAcc(a) / (ST)d); }
};
template <>
struct Num<ncclInt8> : IntNum<uint8_t, int8_t, int32_t> {};
template <>
struct Num<ncclUint8> : IntNum<uint8_t, uint8_t, uint32_t> {};
template <>
struct Num<ncclInt32> : IntNum<uint32_t, int32_t, int32_t> {};
template <>
struct Num<ncclUint32> : IntNum<uint32_t, uint32_t, uint32_t> {};
template <>
struct Num<ncclInt64> : IntNum<unsigned long long, long long, long long> {};
template <>
struct Num<ncclUint64> : IntNum<unsigned long long, unsigned long long, unsigned long long> {};

template <typename UT, typename AccT>
struct FloatNumBase {
  using U = UT;
  using Acc = AccT;
  static constexpr bool kFloat = true;
};
template <>
struct Num<ncclFloat32> : FloatNumBase<uint32_t, float> {
  __device__ static float toAcc(uint32_t u) { return __uint_as_float(u); }
  __device__ static uint32_t fromAcc(float a) { return __float_as_uint(a); }
  __device__ static uint32_t divide(float a, int d) { return fromAcc(a / (float)d); }
};
template <>
struct Num<ncclFloat64> : FloatNumBase<unsigned long long, double> {
  __device__ static double toAcc(unsigned long long u) {
    return __longlong_as_double((long long)u);
  }
  __device__ static unsigned long long fromAcc(double a) {
    return (unsigned long long)__double_as_longlong(a);
  }
  __device__ static unsigned long long divide(double a, int d) { return fromAcc(a / (double)d); }
};
template <>
struct Num<ncclFloat16> : FloatNumBase<uint16_t, float> {
  __device__ static float toAcc(uint16_t u) { return __half2float(__ushort_as_half(u)); }
  __device__ static uint16_t fromAcc(float a) { return __half_as_ushort(__float2half_rn(a)); }
  __device__ static uint16_t divide(float a, int d) { return fromAcc(a / (float)d); }
};
template <>
struct Num<ncclBfloat16> : FloatNumBase<uint16_t, float> {
  __device__ static float toAcc(uint16_t u) { return __bfloat162float(__ushort_as_bfloat16(u)); }
  __device__ static uint16_t fromAcc(float a) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(a));
  }
  __device__ static uint16_t divide(float a, int d) { return fromAcc(a / (float)d); }
};
template <__nv_fp8_interpretation_t K>
struct Fp8Num : FloatNumBase<uint8_t, float> {
  __device__ static float toAcc(uint8_t u) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)u, K)));
  }
  // Round to nearest even, saturating to the largest finite value (as __nv_fp8_e4m3(float)).
  __device__ static uint8_t fromAcc(float a) {
    return (uint8_t)__nv_cvt_float_to_fp8(a, __NV_SATFINITE, K);
  }
  __device__ static uint8_t divide(float a, int d) { return fromAcc(a / (float)d); }
};
template <>
struct Num<ncclFloat8e4m3> : Fp8Num<__NV_E4M3> {};
template <>
struct Num<ncclFloat8e5m2> : Fp8Num<__NV_E5M2> {};

template <int RED, typename A>
__device__ __forceinline__ A combine(A a, A b) {
  if constexpr (std::is_integral<A>::value) {
    using UA = typename std::make_unsigned<A>::type;
    if constexpr (RED == kRedSum) return (A)((UA)a + (UA)b);
    if constexpr (RED == kRedProd) return (A)((UA)a * (UA)b);
    if constexpr (RED == kRedMax) return a > b ? a : b;
    if constexpr (RED == kRedMin) return a < b ? a : b;
  } else {
    if constexpr (RED == kRedSum) return a + b;
    if constexpr (RED == kRedProd) return a * b;
    if constexpr (RED == kRedMax) return fmax(a, b);
    if constexpr (RED == kRedMin) return fmin(a, b);
  }
  return a;
}
template <typename A>
__device__ __forceinline__ A mulWrap(A a, A b) {
  if constexpr (std::is_integral<A>::value) {
    using UA = typename std::make_unsigned<A>::type;
    return (A)((UA)a * (UA)b);
  } else {
    return a * b;
  }
}

// Parameters of one reduction step. PreMulSum: every rank has its own scalar (nccl-tests
// gives each rank a different one), so the scalar goes with the source: a rank's raw input
// enters as round(x * its scalar), rounded to the element type exactly as when that rank
// pre-scales a copy it sends (scaleMulti), so every rank reducing it gets the same bits.
struct RedCfg {
  uint64_t scalarBits;  // PreMulSum scalar of this rank (element bits)
  int premul;           // PreMulSum: sources are multiplied by pmScal[k] (see reduceRange)
  int postDiv;          // ncclAvg: divide the result by this (0: none)
};

__device__ __forceinline__ uint64_t umin64(uint64_t a, uint64_t b) {
  return a < b ? a : b;
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return ((uintptr_t)p & 15) == 0;
}

// ---- copies -----------------------------------------------------------------------------
template <typename V, typename L>
__device__ __forceinline__ void copyBody(char* d, const char* s, uint64_t n, int tid, int nt) {
  constexpr uint64_t W = sizeof(V);
  uint64_t head = (W - ((uintptr_t)d & (W - 1))) & (W - 1);
  if (head > n) head = n;
  for (uint64_t i = tid; i < head; i += nt) d[i] = __ldcg((const char*)s + i);
  d += head;
  s += head;
  n -= head;
  uint64_t nv = n / W;
  const L* sv = (const L*)s;
  L* dv = (L*)d;
  uint64_t i = tid;
  for (; i + 3 * (uint64_t)nt < nv; i += 4 * (uint64_t)nt) {
    L a = __ldcg(sv + i), b = __ldcg(sv + i + nt), c = __ldcg(sv + i + 2 * nt),
      e = __ldcg(sv + i + 3 * nt);
    dv[i] = a;
    dv[i + nt] = b;
    dv[i + 2 * nt] = c;
    dv[i + 3 * nt] = e;
  }
  for (; i < nv; i += nt) dv[i] = __ldcg(sv + i);
  for (uint64_t j = nv * W + tid; j < n; j += nt) d[j] = __ldcg((const char*)s + j);
}

// CTA-wide copy of n bytes between any two addresses (ranges must not overlap).
static __device__ __noinline__ void copyBytes(void* dst, const void* src, uint64_t n, int tid,
                                              int nt) {
  if (n == 0 || dst == src) return;
  uintptr_t diff = (uintptr_t)dst ^ (uintptr_t)src;
  char* d = (char*)dst;
  const char* s = (const char*)src;
  if ((diff & 15) == 0)
    copyBody<uint4, uint4>(d, s, n, tid, nt);
  else if ((diff & 7) == 0)
    copyBody<unsigned long long, unsigned long long>(d, s, n, tid, nt);
  else if ((diff & 3) == 0)
    copyBody<unsigned int, unsigned int>(d, s, n, tid, nt);
  else
    copyBody<char, char>(d, s, n, tid, nt);
}

// One source to nd destinations (a single read of the source when everything is 16-byte
// aligned, e.g. a user buffer going to the slots of several peers).
static __device__ __noinline__ void copyMulti(void* const* dsts, int nd, const void* src,
                                              uint64_t n, int tid, int nt) {
  if (nd <= 0 || n == 0) return;
  bool vec = aligned16(src);
  for (int k = 0; k < nd; k++) vec = vec && aligned16(dsts[k]);
  if (!vec || nd == 1) {
    for (int k = 0; k < nd; k++) copyBytes(dsts[k], src, n, tid, nt);
    return;
  }
  uint64_t nv = n / 16;
  const uint4* sv = (const uint4*)src;
  uint64_t i = tid;
  for (; i + nt < nv; i += 2 * (uint64_t)nt) {
    uint4 a = __ldcg(sv + i), b = __ldcg(sv + i + nt);
    for (int k = 0; k < nd; k++) {
      ((uint4*)dsts[k])[i] = a;
      ((uint4*)dsts[k])[i + nt] = b;
    }
  }
  for (; i < nv; i += nt) {
    uint4 a = __ldcg(sv + i);
    for (int k = 0; k < nd; k++) ((uint4*)dsts[k])[i] = a;
  }
  for (uint64_t j = nv * 16 + tid; j < n; j += nt) {
    char c = __ldcg((const char*)src + j);
    for (int k = 0; k < nd; k++) ((char*)dsts[k])[j] = c;
  }
}

// PreMulSum of one element: x * s, rounded to the element type (see RedCfg).
template <int DT>
__device__ __forceinline__ typename Num<DT>::Acc premul1(typename Num<DT>::Acc x,
                                                         typename Num<DT>::Acc s) {
  return Num<DT>::toAcc(Num<DT>::fromAcc(mulWrap(x, s)));
}

// The element bits of 1 (PreMulSum scalar of a source that is already scaled).
template <int DT>
__device__ __forceinline__ uint64_t oneBits() {
  return (uint64_t)Num<DT>::fromAcc(typename Num<DT>::Acc(1));
}

// dsts[*][i] = round(src[i] * scalar) (PreMulSum: a rank pre-scales its raw input before
// it leaves; the receivers then take it as is).
template <int DT>
static __device__ __noinline__ void scaleMulti(void* const* dsts, int nd, const void* src,
                                               uint64_t n, uint64_t scalarBits, int tid, int nt) {
  using N = Num<DT>;
  using U = typename N::U;
  const typename N::Acc s = N::toAcc((U)scalarBits);
  for (uint64_t i = tid; i < n; i += nt) {
    const U v = N::fromAcc(mulWrap(N::toAcc(__ldcg((const U*)src + i)), s));
    for (int k = 0; k < nd; k++) ((U*)dsts[k])[i] = v;
  }
}

// ---- reduction ----------------------------------------------------------------------------
// dsts[*][i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrc-1][i], for i < n elements,
// reduced in source order (callers pass sources in rank order, so every rank that performs
// the same step gets the same bits). PreMulSum (cfg.premul): source k is multiplied by the
// scalar with bits pmScal[k] (premul1); ncclAvg divides the result. All threads of the CTA
// take part.
template <int DT, int RED>
static __device__ __noinline__ void reduceRangeImpl(const void* const* srcs, int nsrc,
                                                    const uint64_t* pmScal, void* const* dsts,
                                                    int ndst, uint64_t n, const RedCfg& cfg,
                                                    int tid, int nt) {
  using N = Num<DT>;
  using U = typename N::U;
  using Acc = typename N::Acc;
  constexpr int P = 16 / sizeof(U);
  const bool pm = RED == kRedSum && cfg.premul;
  const int div = cfg.postDiv;
  auto scal = [&](int k) -> Acc { return N::toAcc((U)pmScal[k]); };
  auto load1 = [&](int k, uint64_t i) -> Acc {
    Acc x = N::toAcc(__ldcg((const U*)srcs[k] + i));
    return pm ? premul1<DT>(x, scal(k)) : x;
  };
  auto out1 = [&](Acc a) -> U { return div > 0 ? N::divide(a, div) : N::fromAcc(a); };

  bool vec = true;
  for (int k = 0; k < nsrc; k++) vec = vec && aligned16(srcs[k]);
  for (int k = 0; k < ndst; k++) vec = vec && aligned16(dsts[k]);
  uint64_t done = 0;
  if (vec) {
    union Pack {
      uint4 v;
      U e[P];
    };
    const uint64_t np = n / P;
    uint64_t i = tid;
    // Two packs per thread per iteration: twice the loads in flight.
    for (; i + nt < np; i += 2 * (uint64_t)nt) {
      Acc acc0[P], acc1[P];
      Pack a, b;
      a.v = __ldcg((const uint4*)srcs[0] + i);
      b.v = __ldcg((const uint4*)srcs[0] + i + nt);
      const Acc s0 = pm ? scal(0) : Acc(1);
#pragma unroll
      for (int e = 0; e < P; e++) {
        acc0[e] = N::toAcc(a.e[e]);
        acc1[e] = N::toAcc(b.e[e]);
        if (pm) {
          acc0[e] = premul1<DT>(acc0[e], s0);
          acc1[e] = premul1<DT>(acc1[e], s0);
        }
      }
      for (int k = 1; k < nsrc; k++) {
        a.v = __ldcg((const uint4*)srcs[k] + i);
        b.v = __ldcg((const uint4*)srcs[k] + i + nt);
        const Acc sk = pm ? scal(k) : Acc(1);
#pragma unroll
        for (int e = 0; e < P; e++) {
          Acc x = N::toAcc(a.e[e]), y = N::toAcc(b.e[e]);
          if (pm) {
            x = premul1<DT>(x, sk);
            y = premul1<DT>(y, sk);
          }
          acc0[e] = combine<RED>(acc0[e], x);
          acc1[e] = combine<RED>(acc1[e], y);
        }
      }
#pragma unroll
      for (int e = 0; e < P; e++) {
        a.e[e] = out1(acc0[e]);
        b.e[e] = out1(acc1[e]);
      }
      for (int k = 0; k < ndst; k++) {
        ((uint4*)dsts[k])[i] = a.v;
        ((uint4*)dsts[k])[i + nt] = b.v;
      }
    }
    for (; i < np; i += nt) {
      Acc acc[P];
      Pack a;
      a.v = __ldcg((const uint4*)srcs[0] + i);
      const Acc s0 = pm ? scal(0) : Acc(1);
#pragma unroll
      for (int e = 0; e < P; e++) {
        acc[e] = N::toAcc(a.e[e]);
        if (pm) acc[e] = premul1<DT>(acc[e], s0);
      }
      for (int k = 1; k < nsrc; k++) {
        a.v = __ldcg((const uint4*)srcs[k] + i);
        const Acc sk = pm ? scal(k) : Acc(1);
#pragma unroll
        for (int e = 0; e < P; e++) {
          Acc x = N::toAcc(a.e[e]);
          acc[e] = combine<RED>(acc[e], pm ? premul1<DT>(x, sk) : x);
        }
      }
#pragma unroll
      for (int e = 0; e < P; e++) a.e[e] = out1(acc[e]);
      for (int k = 0; k < ndst; k++) ((uint4*)dsts[k])[i] = a.v;
    }
    done = np * P;
  }
  for (uint64_t i = done + tid; i < n; i += nt) {
    Acc acc = load1(0, i);
    for (int k = 1; k < nsrc; k++) acc = combine<RED>(acc, load1(k, i));
    U r = out1(acc);
    for (int k = 0; k < ndst; k++) ((U*)dsts[k])[i] = r;
  }
}

template <int DT, int RED>
static __device__ __forceinline__ void reduceRange(const void* const* srcs, int nsrc,
                                                   const uint64_t* pmScal, void* const* dsts,
                                                   int ndst, uint64_t n, const RedCfg& cfg, int tid,
                                                   int nt) {
  reduceRangeImpl<DT, RED>(srcs, nsrc, pmScal, dsts, ndst, n, cfg, tid, nt);
}

}  // namespace dev
}  // namespace mk
