// Small pieces shared by the sequential and fused paths of the GEMM + collective operators.
#pragma once
#include <cstddef>
#include <nccl.h>

#include "comm/comm.h"
#include "fused/core/fused_comm.h"
#include "fused/gemm/gemm.h"
#include "fused/ops/gemm_coll/gemm_coll.h"

namespace mk {
namespace fused {

inline gemm::DType gemmType(ncclDataType_t t) {
  return t == ncclFloat16 ? gemm::DType::kF16
                          : (t == ncclFloat32 ? gemm::DType::kF32 : gemm::DType::kBF16);
}

// GEMM engine arguments for rows x N of the call's product, A and D given, on at most
// smBudget SMs (FusedComm::smBudget: the device's SMs shared by the ranks on it).
gemm::GemmArgs gemmArgsOf(const GemmCollCall& c, const void* A, void* D, size_t rows, int smBudget);

// Runs the fused kernel when the comm's layout has one (*ran = true); *ran = false leaves
// the call to the sequential path. The caller has run gemmCollPreload for `c` first.
ncclResult_t gemmCollFused(const GemmCollCall& c, const FusedComm& f, bool* ran);
// Loads the fused kernel (and bias kernel) `c` would launch. Called before the call's host
// rendezvous: with lazy module loading, a first launch can block behind running kernels, and
// the peers' kernels of this very call, launched by faster threads, spin until this rank's
// kernel runs (the suspected cause of one 20 s timeout of 8 thread-per-rank AllGatherGemm
// calls on the H200: the waiting ranks named a rank whose kernel never started).
ncclResult_t gemmCollPreload(const GemmCollCall& c);

// Loads the bias kernel of the call's output type (nothing without a bias) before any kernel
// of the call is launched: see sequential.cu.
ncclResult_t preloadBias(const GemmCollCall& c);

// C[rows, N] += bias[N] in type t (nothing when bias is null).
ncclResult_t addBias(void* C, const void* bias, size_t rows, size_t N, ncclDataType_t t,
                     int smCount, cudaStream_t stream);

}  // namespace fused
}  // namespace mk
