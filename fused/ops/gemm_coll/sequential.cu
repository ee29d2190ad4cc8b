// The sequential path of the GEMM + collective operators: mkernel's GEMM engine, then
// mkernel's collective, then the bias, all on the caller's stream. It is the fallback the
// cost model picks when fusing would not pay, the path for layouts the fused kernels do not
// cover, and the baseline the benchmarks compare the fused kernels with.
#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "base/checks.h"
#include "base/scratch.h"
#include "coll/coll.h"
#include "comm/comm.h"
#include "fused/core/fused_comm.h"
#include "fused/core/elem.cuh"
#include "fused/gemm/gemm.h"
#include "fused/ops/gemm_coll/gemm_coll.h"
#include "fused/ops/gemm_coll/gemm_coll_util.h"

namespace mk {
namespace fused {

namespace {

// C[rows, N] += bias[N], one rounding (the bias is added once, to the final result).
template <typename T>
__global__ void addBiasKernel(T* C, const T* bias, size_t rows, size_t N) {
  const size_t total = rows * N;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    C[i] = fromF<T>(toF(C[i]) + toF(bias[i % N]));
  }
}

}  // namespace

ncclResult_t addBias(void* C, const void* bias, size_t rows, size_t N, ncclDataType_t t,
                     int smCount, cudaStream_t stream) {
  if (bias == nullptr || rows == 0) return ncclSuccess;
  const int threads = 256;
  const size_t want = (rows * N + threads - 1) / threads;
  const int blocks = (int)(want < (size_t)smCount * 8 ? want : (size_t)smCount * 8);
  switch (t) {
    case ncclBfloat16:
      addBiasKernel<<<blocks, threads, 0, stream>>>(
          static_cast<__nv_bfloat16*>(C), static_cast<const __nv_bfloat16*>(bias), rows, N);
      break;
    case ncclFloat16:
      addBiasKernel<<<blocks, threads, 0, stream>>>(static_cast<__half*>(C),
                                                    static_cast<const __half*>(bias), rows, N);
      break;
    case ncclFloat32:
      addBiasKernel<<<blocks, threads, 0, stream>>>(static_cast<float*>(C),
                                                    static_cast<const float*>(bias), rows, N);
      break;
    default:
      MK_WARN("bias: unsupported type %d", (int)t);
      return ncclInvalidArgument;
  }
  CUDACHECK(cudaGetLastError());
  return ncclSuccess;
}

gemm::GemmArgs gemmArgsOf(const GemmCollCall& c, const void* A, void* D, size_t rows,
                          int smBudget) {
  gemm::GemmArgs g;
  g.M = (int32_t)rows;
  g.N = (int32_t)c.N;
  g.K = (int32_t)c.K;
  g.A = A;
  g.B = c.B;
  g.bLayout = c.cfg.bLayout == ncclFusedLayoutKN ? gemm::BLayout::kKN : gemm::BLayout::kNK;
  g.abType = gemmType(c.inType);
  g.D = D;
  g.dType = gemmType(c.cfg.outType);
  g.smBudget = smBudget;
  return g;
}

// A kernel of this rank that waits for a peer (the collective, the fused kernel) must not be
// running while a later kernel of the same call is still to be loaded: with lazy module
// loading the load can wait for the device, and the peer may be driven by this very thread.
// So every kernel a call launches is loaded before its first launch.
ncclResult_t preloadBias(const GemmCollCall& c) {
  if (c.cfg.bias == nullptr) return ncclSuccess;
  cudaFuncAttributes attr;
  switch (c.cfg.outType) {
    case ncclBfloat16:
      CUDACHECK(cudaFuncGetAttributes(&attr, addBiasKernel<__nv_bfloat16>));
      break;
    case ncclFloat16:
      CUDACHECK(cudaFuncGetAttributes(&attr, addBiasKernel<__half>));
      break;
    default:
      CUDACHECK(cudaFuncGetAttributes(&attr, addBiasKernel<float>));
      break;
  }
  return ncclSuccess;
}

ncclResult_t gemmCollSequential(const GemmCollCall& c, int smBudget) {
  ncclComm* comm = c.comm;
  NCCLCHECK(gemm::preload(gemmArgsOf(c, c.A, c.C, c.M, smBudget)));
  NCCLCHECK(preloadBias(c));
  const int n = comm->nRanks;
  const size_t in = fusedTypeSize(c.inType), out = fusedTypeSize(c.cfg.outType);
  cudaStream_t s = c.stream;
  ncclResult_t res = ncclSuccess;
  void* tmp = nullptr;
  CollArgs coll{};
  coll.op = ncclSum;
  coll.root = -1;
  coll.comm = comm;
  coll.stream = s;
  switch (c.op) {
    case GemmColl::kAllReduce: {
      coll.type = CollType::kAllReduce;
      coll.sendbuff = c.C;
      coll.recvbuff = c.C;
      coll.count = c.M * c.N;
      coll.dtype = c.cfg.outType;
      // Checked before the GEMM writes C: a refused call leaves the caller's output alone.
      NCCLCHECK(collCheckArgs(coll, gemmCollName(c.op)));
      NCCLCHECK(gemm::launch(gemmArgsOf(c, c.A, c.C, c.M, smBudget), s));
      NCCLCHECK(collEnqueue(coll));
      NCCLCHECK(addBias(c.C, c.cfg.bias, c.M, c.N, c.cfg.outType, comm->smCount, s));
      return ncclSuccess;
    }
    case GemmColl::kReduceScatter: {
      // The full local product is staged in stream-ordered memory: capturable (a graph
      // memory node) and recycled by the pool between eager calls.
      NCCLCHECK(scratchAlloc(&tmp, c.M * c.N * out, comm->cudaDev, s));
      NCCLCHECKGOTO(gemm::launch(gemmArgsOf(c, c.A, tmp, c.M, smBudget), s), res, fail);
      coll.type = CollType::kReduceScatter;
      coll.sendbuff = tmp;
      coll.recvbuff = c.C;
      coll.count = c.M / n * c.N;
      coll.dtype = c.cfg.outType;
      NCCLCHECKGOTO(collCheckArgs(coll, gemmCollName(c.op)), res, fail);
      NCCLCHECKGOTO(collEnqueue(coll), res, fail);
      NCCLCHECKGOTO(addBias(c.C, c.cfg.bias, c.M / n, c.N, c.cfg.outType, comm->smCount, s), res,
                    fail);
      break;
    }
    case GemmColl::kAllGather: {
      void* G = c.Agathered;
      if (G == nullptr) {
        NCCLCHECK(scratchAlloc(&tmp, c.M * c.K * in, comm->cudaDev, s));
        G = tmp;
      }
      coll.type = CollType::kAllGather;
      coll.sendbuff = c.A;
      coll.recvbuff = G;
      coll.count = c.M / n * c.K;
      coll.dtype = c.inType;
      NCCLCHECKGOTO(collCheckArgs(coll, gemmCollName(c.op)), res, fail);
      NCCLCHECKGOTO(collEnqueue(coll), res, fail);
      NCCLCHECKGOTO(gemm::launch(gemmArgsOf(c, G, c.C, c.M, smBudget), s), res, fail);
      NCCLCHECKGOTO(addBias(c.C, c.cfg.bias, c.M, c.N, c.cfg.outType, comm->smCount, s), res, fail);
      break;
    }
  }
fail:
  return fusedFreeScratch(tmp, s, res, gemmCollName(c.op));
}

}  // namespace fused
}  // namespace mk
