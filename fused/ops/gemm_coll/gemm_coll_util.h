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

// SMs one rank may hold with a persistent grid: the device's SMs shared evenly by the ranks
// of this comm on that device (DESIGN.md §3), so every local rank's kernel can be resident
// at once and none waits for a peer whose kernel cannot start.
inline int rankSmBudget(const ncclComm* comm) {
  const int share = comm->topo.ranksOnMyDevice > 0 ? comm->topo.ranksOnMyDevice : 1;
  const int b = comm->smCount / share;
  return b > 0 ? b : 1;
}

// GEMM engine arguments for rows x N of the call's product, A and D given.
gemm::GemmArgs gemmArgsOf(const GemmCollCall& c, const void* A, void* D, size_t rows);

// Runs the fused kernel when the comm's layout has one (*ran = true); *ran = false leaves
// the call to the sequential path.
ncclResult_t gemmCollFused(const GemmCollCall& c, const FusedComm& f, bool* ran);

// Loads the GEMM variant and the bias kernel the call uses (see sequential.cu).
ncclResult_t preloadKernels(const GemmCollCall& c);

// C[rows, N] += bias[N] in type t (nothing when bias is null).
ncclResult_t addBias(void* C, const void* bias, size_t rows, size_t N, ncclDataType_t t,
                     int smCount, cudaStream_t stream);

}  // namespace fused
}  // namespace mk
