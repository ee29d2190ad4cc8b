/* mkernel's fused entry points: a GEMM and a collective in one stream-ordered call.
 *
 * C ABI, NCCL naming (every function also exported as pncclX, like the rest of the API).
 * Matrices are row-major and contiguous; inputs bf16 or fp16, accumulation fp32.
 *
 *   ncclGemmAllReduce      rank r holds A_r [M,K] and B_r; every rank gets
 *                          C = sum_r A_r * B_r (+ bias) [M,N]  (row-parallel linear layer).
 *                          Bit-identical on every rank and from run to run.
 *   ncclAllGatherGemm      M is the total row count (M % nranks == 0); rank r holds rows
 *                          [r*M/n, (r+1)*M/n) of A (Ashard); every rank gets C = A * B [M,N]
 *                          and, when Agathered is not NULL, the gathered A [M,K] there
 *                          (column-parallel linear layer).
 *   ncclGemmReduceScatter  M % nranks == 0; rank r gets rows [r*M/n, (r+1)*M/n) of
 *                          sum_r A_r * B_r (+ bias) in Cshard [M/n, N]: a reduce-scatter over
 *                          every rank of the communicator, across nodes too.
 *
 * B is [N,K] (ncclFusedLayoutNK, the layout of a torch.nn.Linear weight; the default) or
 * [K,N] (ncclFusedLayoutKN). Every size, alignment and type rule is checked before any CUDA
 * call; a refused call returns ncclInvalidArgument and ncclGetLastError names the rule.
 * The rules: inType bf16 or fp16; outType bf16, fp16 or fp32; M, N, K > 0 and each < 2^31;
 * K % 8 == 0 and, for the [K,N] layout, N % 8 == 0 (16-byte rows for the tensor copies);
 * every pointer 16-byte aligned; C does not overlap A or B.
 *
 * Groups: a fused call inside ncclGroupStart/ncclGroupEnd is refused with ncclInvalidUsage
 * (its GEMM cannot be deferred to the group's end without holding the caller's buffers).
 * Graphs: calls are capturable and replay with new inputs; they never synchronise the host.
 */
#ifndef MKERNEL_FUSED_H_
#define MKERNEL_FUSED_H_

#include <stddef.h>
#include <cuda_runtime.h>
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  ncclFusedLayoutNK = 0, /* B is [N,K] row-major (a Linear weight) */
  ncclFusedLayoutKN = 1  /* B is [K,N] row-major */
} ncclFusedLayout_t;

typedef enum {
  ncclFusedAuto = 0,      /* sequential until the fused kernels are measured faster; with
                             MKERNEL_FUSED_AUTO=1 the cost model picks */
  ncclFusedFused = 1,     /* one persistent kernel: compute and communication CTAs */
  ncclFusedSequential = 2 /* mkernel's GEMM, then mkernel's collective */
} ncclFusedAlgo_t;

#define NCCL_FUSED_CONFIG_MAGIC 0x6d6b4663u /* "mkFc" */
#define NCCL_FUSED_CONFIG_VERSION 1u
/* outType value meaning "the input type": fixed, unlike ncclNumTypes, which grew with the
   fp8 types and would make a caller built against an older nccl.h send a real type */
#define NCCL_FUSED_OUT_TYPE_DEFAULT ((ncclDataType_t)-1)

typedef struct {
  size_t size;            /* sizeof(ncclFusedConfig_t) of the caller: checked like ncclConfig_t */
  unsigned int magic;     /* NCCL_FUSED_CONFIG_MAGIC */
  unsigned int version;   /* NCCL_FUSED_CONFIG_VERSION */
  int bLayout;            /* ncclFusedLayout_t */
  ncclDataType_t outType; /* ncclBfloat16, ncclFloat16, ncclFloat32, or the default */
  const void* bias;       /* optional [N] vector of outType, added once to the final result */
  int commSms;            /* -1: cost model (MKERNEL_FUSED_COMM_SMS); >= 0 forces the split */
  int algo;               /* ncclFusedAlgo_t */
} ncclFusedConfig_t;

#define NCCL_FUSED_CONFIG_INITIALIZER                                              \
  {                                                                                \
    sizeof(ncclFusedConfig_t), NCCL_FUSED_CONFIG_MAGIC, NCCL_FUSED_CONFIG_VERSION, \
        ncclFusedLayoutNK, NCCL_FUSED_OUT_TYPE_DEFAULT, NULL, -1, ncclFusedAuto    \
  }

/* A NULL config means NCCL_FUSED_CONFIG_INITIALIZER. */
ncclResult_t ncclGemmAllReduce(const void* A, const void* B, void* C, size_t M, size_t N, size_t K,
                               ncclDataType_t inType, const ncclFusedConfig_t* config,
                               ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGemmAllReduce(const void* A, const void* B, void* C, size_t M, size_t N, size_t K,
                                ncclDataType_t inType, const ncclFusedConfig_t* config,
                                ncclComm_t comm, cudaStream_t stream);

ncclResult_t ncclAllGatherGemm(const void* Ashard, const void* B, void* C, void* Agathered,
                               size_t M, size_t N, size_t K, ncclDataType_t inType,
                               const ncclFusedConfig_t* config, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclAllGatherGemm(const void* Ashard, const void* B, void* C, void* Agathered,
                                size_t M, size_t N, size_t K, ncclDataType_t inType,
                                const ncclFusedConfig_t* config, ncclComm_t comm,
                                cudaStream_t stream);

ncclResult_t ncclGemmReduceScatter(const void* A, const void* B, void* Cshard, size_t M, size_t N,
                                   size_t K, ncclDataType_t inType, const ncclFusedConfig_t* config,
                                   ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGemmReduceScatter(const void* A, const void* B, void* Cshard, size_t M, size_t N,
                                    size_t K, ncclDataType_t inType,
                                    const ncclFusedConfig_t* config, ncclComm_t comm,
                                    cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MKERNEL_FUSED_H_ */
