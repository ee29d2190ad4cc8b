// One reduction toolkit for collectives and fused roles: the dtype x op dispatch of a
// run-time (ncclDataType_t, RedKind) to the templates of prims.cuh (Num<DT> traits,
// combine<RED>, reduceRange<DT, RED>), written once.
//
//   dispatchDtype(dtype, [&](auto dt) { using N = Num<decltype(dt)::kDt>; ... })
//   dispatchRed(red, [&](auto r) { reduceRange<DT, decltype(r)::kRed>(...); })
//
// Both work on the host (kernel selection) and on the device (a role that reduces bf16 or
// fp32 tiles picks its combine once, outside its element loop). The reduction order is
// the callers' (reduceRange: sources in the order given), so every rank that reduces the
// same sources gets the same bits.
#pragma once
#include <nccl.h>

#include "device/prims.cuh"

namespace mk {
namespace dev {

template <int DT>
struct DtTag {
  static constexpr int kDt = DT;
};
template <int RED>
struct RedTag {
  static constexpr int kRed = RED;
};

// f(RedTag<RED>{}) for the RedKind `red` (an unknown kind reduces as a sum: the host checked).
// (nv_exec_check_disable: F may be a host-only lambda when the caller is host code.)
#pragma nv_exec_check_disable
template <class F>
__host__ __device__ __forceinline__ auto dispatchRed(int red, F&& f) {
  switch (red) {
    case kRedProd:
      return f(RedTag<kRedProd>{});
    case kRedMax:
      return f(RedTag<kRedMax>{});
    case kRedMin:
      return f(RedTag<kRedMin>{});
    default:
      return f(RedTag<kRedSum>{});
  }
}

// f(DtTag<DT>{}) for every dtype of the collectives; `otherwise()` for an unknown one.
#pragma nv_exec_check_disable
template <class F, class G>
__host__ __device__ __forceinline__ auto dispatchDtype(int dtype, F&& f, G&& otherwise) {
  switch (dtype) {
    case ncclInt8:
      return f(DtTag<ncclInt8>{});
    case ncclUint8:
      return f(DtTag<ncclUint8>{});
    case ncclInt32:
      return f(DtTag<ncclInt32>{});
    case ncclUint32:
      return f(DtTag<ncclUint32>{});
    case ncclInt64:
      return f(DtTag<ncclInt64>{});
    case ncclUint64:
      return f(DtTag<ncclUint64>{});
    case ncclFloat16:
      return f(DtTag<ncclFloat16>{});
    case ncclFloat32:
      return f(DtTag<ncclFloat32>{});
    case ncclFloat64:
      return f(DtTag<ncclFloat64>{});
    case ncclBfloat16:
      return f(DtTag<ncclBfloat16>{});
    case ncclFloat8e4m3:
      return f(DtTag<ncclFloat8e4m3>{});
    case ncclFloat8e5m2:
      return f(DtTag<ncclFloat8e5m2>{});
    default:
      return otherwise();
  }
}

// dsts[0..ndst)[i] = the reduction (kind `red`, cfg) of srcs[0..nsrc)[i] in source order,
// for i < n elements of type DT, by all nt threads (tid) of the caller's group.
template <int DT>
__device__ __forceinline__ void reduceRangeAny(int red, const void* const* srcs, int nsrc,
                                               const uint64_t* pmScal, void* const* dsts, int ndst,
                                               uint64_t n, const RedCfg& cfg, int tid, int nt) {
  dispatchRed(red, [&](auto r) {
    reduceRange<DT, decltype(r)::kRed>(srcs, nsrc, pmScal, dsts, ndst, n, cfg, tid, nt);
  });
}

}  // namespace dev
}  // namespace mk
