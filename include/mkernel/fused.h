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
 * M % nranks == 0 for AllGatherGemm and GemmReduceScatter; A, B, C non-NULL and 16-byte
 * aligned, as is Agathered (AllGatherGemm only; NULL elsewhere); bias aligned to its element;
 * C overlaps none of A, B and the bias; Agathered overlaps neither B nor C, and Ashard only
 * in place (Ashard == Agathered + rank * M/nranks * K elements, as in ncclAllGather).
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
  ncclFusedAuto = 0,      /* GEMM calls on a comm spanning nodes: fused for ReduceScatter /
                             AllReduce where the layout takes the shape, and AllGather from
                             N = 256 (measured faster there); ranks of one process sharing a
                             GPU: fused for AllReduce with K >= 4096 and ReduceScatter with
                             K >= 8192 (>= 1024 tiles, 16-bit output; measured faster); other
                             layouts sequential; with MKERNEL_FUSED_AUTO=1 the cost model picks
                             where no rule fuses */
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

/* ---- MoE expert parallelism ------------------------------------------------------------
 *
 *   ncclMoeDispatchGemm   every rank holds T tokens x [T,H], their routing topkIdx [T,k]
 *                         (expert ids in [0,E), -1 = unused slot) and topkWeights [T,k] (fp32),
 *                         all in device memory, and the weights of its E/nranks local experts
 *                         w1 [E/n][N][H] (ncclFusedLayoutNK) or [E/n][H][N] (KN). Each routed
 *                         slot's token row travels to the rank owning the slot's expert (only
 *                         there); every rank gets, for each local expert, the rows routed to it
 *                         packed in recv->xRecv and multiplied by the expert's w1 in recv->y.
 *
 * Packed layout (recv): local expert e owns rows [expertOffset[e], expertOffset[e] +
 * expertCount[e]); offsets are multiples of 128 (NCCL_MOE_ROW_ALIGN) and the rows up to the
 * next offset are padding (their y rows are unspecified, their rowSource entries -1).
 * expertOffset[E/n] is the number of rows the layout spans. Inside an expert, rows of source
 * rank 0 come first, then rank 1's, ...; inside a source, in slot order (token, then k).
 * rowSource[3*i..3*i+2] = (source rank, token, slot j) and rowWeight[i] = topkWeights[t][j] of
 * the source: what a combine needs to send results back. Counts and offsets are exchanged on
 * the device: no host synchronisation, calls run back to back and can be captured (after one
 * eager call on the comm).
 *
 * maxRows bounds the rows a rank may receive (padding included). A rank whose layout would
 * exceed it receives nothing (counts 0) and its comm reports ncclInvalidUsage through
 * ncclCommGetAsyncError, naming the operation and the row count; nothing is dropped silently.
 *
 * Rules (ncclInvalidArgument otherwise): inType bf16/fp16; outType bf16/fp16/fp32;
 * E % nranks == 0, 1 <= E <= 1024, E / nranks <= NCCL_MOE_MAX_LOCAL_EXPERTS (256: the
 * grouped GEMM's groups), 1 <= k <= 16; H % 8 == 0 (and N % 8 == 0 for the KN layout); H and
 * N below 2^31, tokens * k below 2^31, maxRows in 1..2^31-1; 16-byte aligned x, w1, xRecv,
 * y; 4-byte aligned topkIdx, topkWeights and the int / float arrays of recv; x and topkIdx
 * non-NULL unless tokens is 0; every pointer of recv non-NULL except rowSource and rowWeight
 * (rowWeight needs topkWeights).
 *
 * Paths. When every rank of the comm lives in this process on one GPU (threads, or one thread
 * per group of ranks; at most 32), one dispatch kernel pushes each row straight into its
 * destination's layout. Every other layout (processes, several GPUs, (virtual) nodes) runs the
 * AllToAll path: counts, rows and (for the whole layer) the experts' outputs travel with
 * mkernel's AllToAll in per-pair buffers of maxRows rows (scratch: about 2 * nranks * maxRows
 * rows of H elements, and as many again for the layer's return). Where the ranks are
 * processes of one node, the fused kernels (algo ncclFusedFused, and for the layer also
 * ncclFusedAuto: see ncclMoeConfig_t::algo) run instead, their rows landing in windows every
 * rank maps (maxRows rows each). On a comm spanning (virtual) nodes, algo ncclFusedFused, and
 * for the layer also ncclFusedAuto, runs one kernel per rank after the AllToAll path's exchange
 * of counts (MKERNEL_FUSED_XNODE=1; the layer with w1 in the [N,K] layout and
 * MKERNEL_MOE_SWIGLU_EPILOGUE=1; the layer ran 1.2-1.5x as fast as the AllToAll path on 2
 * virtual nodes of one H200): token rows (across nodes once per node with
 * MKERNEL_MOE_NODE_DEDUP=1, as on the AllToAll path), and the layer's expert outputs back,
 * travel per pair through the device communication API while the grouped GEMM takes tiles as
 * their rows land (scratch: about nranks * maxRows records of a token row and 16 * topk bytes,
 * plus nranks-per-node * maxRows more with the dedup, and for the layer 2 * nranks * maxRows
 * rows of H elements). A rank whose GPU cannot hold the kernel's grid at once refuses the call with
 * ncclInvalidUsage before it enqueues anything (its peers then fail at their timeout). On every
 * layout but the first every rank must pass the same maxRows. A mismatch in the comm's first fused
 * MoE call on processes is refused on every rank (ncclInvalidArgument: the windows' sizes differ);
 * later, or on the AllToAll path, it is found only when it shows (a receiver that sees another
 * bound reports both; a rank that would grow its windows alone fails after
 * MKERNEL_BOOTSTRAP_TIMEOUT_S, its peers at their device deadline). The paths give the same
 * outputs.
 */
#define NCCL_MOE_ROW_ALIGN 128
#define NCCL_MOE_MAX_EXPERTS 1024
#define NCCL_MOE_MAX_LOCAL_EXPERTS 256
#define NCCL_MOE_MAX_TOPK 16
#define NCCL_MOE_CONFIG_MAGIC 0x6d6b4d63u /* "mkMc" */
#define NCCL_MOE_CONFIG_VERSION 1u
typedef struct {
  size_t size;            /* sizeof(ncclMoeConfig_t) of the caller */
  unsigned int magic;     /* NCCL_MOE_CONFIG_MAGIC */
  unsigned int version;   /* NCCL_MOE_CONFIG_VERSION */
  int wLayout;            /* ncclFusedLayout_t of w1 */
  ncclDataType_t outType; /* ncclBfloat16, ncclFloat16, ncclFloat32, or the default (inType) */
  int commSms;            /* -1: automatic; >= 1 forces the CTAs of the dispatch */
  int algo;               /* ncclFusedAlgo_t: with ncclFusedFused, ncclMoeDispatchGemm runs
                             one kernel per rank (dispatch CTAs feeding the grouped GEMM's CTAs
                             tile by tile) on ranks of one process sharing a GPU and on ranks
                             that are processes of one node (there the rows land in windows
                             the ranks map, and are copied to xRecv after the kernel), and
                             ncclMoeDispatchFfnCombine one kernel per rank for the whole layer
                             on ranks of one node (see there); both calls also on comms
                             spanning (virtual) nodes (the layer with w1 [N,K]; session
                             35, slower than the AllToAll path there); everywhere
                             else, and with sequential, the layout's sequential path. auto:
                             the sequential
                             path, but the fused layer on ranks that are processes of one node.
                             Every rank of a call must pass the same algo. */
} ncclMoeConfig_t;
#define NCCL_MOE_CONFIG_INITIALIZER                                                             \
  {                                                                                             \
    sizeof(ncclMoeConfig_t), NCCL_MOE_CONFIG_MAGIC, NCCL_MOE_CONFIG_VERSION, ncclFusedLayoutNK, \
        NCCL_FUSED_OUT_TYPE_DEFAULT, -1, ncclFusedAuto                                          \
  }
typedef struct {
  void* xRecv;       /* [maxRows, H] inType: the received token rows, packed */
  void* y;           /* [maxRows, N] outType: xRecv rows times their expert's w1 */
  int* expertCount;  /* [E/n] rows of each local expert */
  int* expertOffset; /* [E/n + 1] first row of each local expert; last: rows spanned */
  int* rowSource;    /* [maxRows, 3] (source rank, token, slot) per row, or NULL */
  float* rowWeight;  /* [maxRows] the routing weight of each row, or NULL */
  size_t maxRows;    /* capacity of xRecv, y, rowSource, rowWeight in rows */
} ncclMoeRecv_t;
ncclResult_t ncclMoeDispatchGemm(const void* x, const int* topkIdx, const float* topkWeights,
                                 const void* w1, const ncclMoeRecv_t* recv, size_t tokens,
                                 size_t hidden, size_t n, int experts, int topk,
                                 ncclDataType_t inType, const ncclMoeConfig_t* config,
                                 ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclMoeDispatchGemm(const void* x, const int* topkIdx, const float* topkWeights,
                                  const void* w1, const ncclMoeRecv_t* recv, size_t tokens,
                                  size_t hidden, size_t n, int experts, int topk,
                                  ncclDataType_t inType, const ncclMoeConfig_t* config,
                                  ncclComm_t comm, cudaStream_t stream);

/* ncclMoeDispatchFfnCombine: the whole MoE layer. Every rank holds T tokens x [T,H], their
 * routing topkIdx/topkWeights [T,k] as for ncclMoeDispatchGemm, and its E/nranks local
 * experts' weights: w1 [E/n][2I][H] (NK; gate rows [0,I), then up rows [I,2I)) or [E/n][H][2I]
 * (KN; gate columns first), and w2 [E/n][H][I] (NK) or [E/n][I][H] (KN). Each routed slot's
 * row travels to its expert's owner (only there), which computes
 *     expert_e(x) = (silu(x W1gate_e^T) * (x W1up_e^T)) W2_e^T
 * and the result travels back: rank r gets y [T,H] (outType) with
 *     y[t] = sum over the slots j of token t with an expert id of topkWeights[t][j] * expert(x_t).
 * Precision: the GEMMs accumulate in fp32. With w1 in the NK layout GEMM1 applies SwiGLU to its
 * fp32 accumulators and stores only the product (buf->act, inType; buf->h, still required, is
 * not written); with KN (or MKERNEL_MOE_SWIGLU_EPILOGUE=0) it stores buf->h in inType and a
 * SwiGLU kernel computes buf->act from it. GEMM2 stores the expert outputs (buf->out) in fp32;
 * the combine takes each rounded to inType (as torch's grouped GEMM returns it; rows that
 * travel back to their token's rank carry that type; with fp16 an output beyond 65504 becomes
 * inf, whatever outType), adds the slots in slot order in fp32 and rounds once to outType. A token
 * whose slots are all -1 gets zeros. On a rank whose call reports an error (its bound exceeded, a
 * bad expert id in its topkIdx), y is unspecified; the other ranks' y are complete. The buffers
 * (ncclMoeFfnBuffers_t) are the rows this rank receives, in the packed layout of ncclMoeRecv_t
 * (expertCount, expertOffset as there); peers read buf->out of the ranks that hold their tokens'
 * experts, so keep the buffers alive and unchanged until every rank's call has completed. maxRows,
 * overflow (reported, the overflowing rank receives nothing and its sources get zeros for those
 * slots), bad expert ids, no host synchronisation, capture after one eager call and the layouts
 * that run: as for ncclMoeDispatchGemm. Rules beyond its rules: inter I >= 1, I % 8 == 0 and I <
 * 2^30; topkWeights and y non-NULL unless tokens is 0, w2 and every buffer non-NULL; w2, y, h, act,
 * out 16-byte aligned. The sequential path runs: dispatch kernel, grouped GEMM1 (SwiGLU in its
 * epilogue, or a SwiGLU kernel after it, see Precision), grouped GEMM2, combine kernel. With algo
 * ncclFusedFused, ranks of one node (of one process sharing a GPU, or each in its own
 * process), the weights in the NK layout with MKERNEL_MOE_SWIGLU_EPILOGUE=1 (the default), at
 * least 2 SMs per rank and E small enough for the dispatch state to fit in shared memory, one
 * fused kernel per rank runs the layer instead (dispatch, GEMM1, GEMM2 and combine overlapped
 * row tile by row tile), with the same arithmetic (ranks of one process: y is bit for bit the
 * sequential path's; processes: the rows land in, and the expert outputs are read from, windows
 * the ranks map, and buf->xRecv and buf->out are not written). On a comm spanning (virtual)
 * nodes, with the same weights rule, the fused kernel across nodes runs it (see the layouts
 * above; session 35, slower than the AllToAll path there). Elsewhere the sequential path runs (the
 * reason logged once). ncclFusedAuto runs the fused kernel where the ranks are
 * processes of one node and it applies (measured faster than the AllToAll path at every shape
 * tried, docs/moe.md), else the sequential path. A call captured in a graph must
 * follow an eager call on the same path (each path allocates its shared state at its first
 * call), and every rank of a call must take the same path: a rank that runs the fused kernel
 * while a peer runs the sequential path reports it (ncclInvalidUsage naming the peer).
 */
typedef struct {
  void* xRecv;       /* [maxRows, H] inType: the received token rows, packed */
  void* h;           /* [maxRows, 2I] inType: GEMM1 output (gate | up) */
  void* act;         /* [maxRows, I] inType: silu(gate) * up */
  float* out;        /* [maxRows, H] fp32: the experts' outputs, read by the combine */
  int* expertCount;  /* [E/n] rows of each local expert */
  int* expertOffset; /* [E/n + 1] first row of each local expert; last: rows spanned */
  size_t maxRows;    /* capacity of xRecv, h, act and out in rows */
} ncclMoeFfnBuffers_t;
ncclResult_t ncclMoeDispatchFfnCombine(const void* x, const int* topkIdx, const float* topkWeights,
                                       const void* w1, const void* w2, void* y,
                                       const ncclMoeFfnBuffers_t* buf, size_t tokens, size_t hidden,
                                       size_t inter, int experts, int topk, ncclDataType_t inType,
                                       const ncclMoeConfig_t* config, ncclComm_t comm,
                                       cudaStream_t stream);
ncclResult_t pncclMoeDispatchFfnCombine(const void* x, const int* topkIdx, const float* topkWeights,
                                        const void* w1, const void* w2, void* y,
                                        const ncclMoeFfnBuffers_t* buf, size_t tokens,
                                        size_t hidden, size_t inter, int experts, int topk,
                                        ncclDataType_t inType, const ncclMoeConfig_t* config,
                                        ncclComm_t comm, cudaStream_t stream);

/* ---- Ring attention (context parallelism) ----------------------------------------------
 *
 *   ncclRingAttention   every rank holds a slice of seqLocal positions of a sequence of
 *                       nranks * seqLocal positions: q [batch, seqLocal, hq, headDim] and
 *                       k, v [batch, seqLocal, hkv, headDim] (row-major, contiguous; inType
 *                       bf16 or fp16). Rank r gets, for each of its queries, the attention
 *                       over the keys and values of the whole sequence (every rank's slice):
 *                       out[b,s,h] = sum_j softmax_j(scale * q[b,s,h] . k[b,j,h/g]) v[b,j,h/g]
 *                       with g = hq / hkv (grouped-query attention: query head h reads key/value
 *                       head h / g), j over the whole sequence or, with causal, over the
 *                       positions j <= the query's position.
 *
 * Outputs: out [batch, seqLocal, hq, headDim] (inType) and, unless lse is NULL, lse [batch, hq,
 * seqLocal] (fp32): the natural log of each query row's softmax denominator,
 * log(sum_j exp(scale * q . k_j)) over the keys it attends to (what a merge or a backward pass
 * needs). A row that attends to no key (none exists only when the caller masks everything,
 * which causal attention never does) gets zeros and lse = -inf.
 *
 * Layout of the sequence across ranks (config->seqLayout):
 *   ncclRingAttnContiguous  rank r holds positions [r*seqLocal, (r+1)*seqLocal);
 *   ncclRingAttnZigzag      seqLocal is even, C = seqLocal/2: rank r holds chunk r (positions
 *                           [r*C, (r+1)*C)) in its first C rows and chunk 2n-1-r in its last C
 *                           rows, so that causal work is the same on every rank.
 * The position decides the causal mask; without causal the layout changes nothing.
 *
 * Precision: both products accumulate in fp32, the probabilities are rounded to inType before
 * the second product (as flash attention does), the softmax runs in fp32 (exp2 with the scale
 * folded in), out is rounded once. config->scale <= 0 means 1/sqrt(headDim).
 *
 * Algorithms: the sequential path gathers k and v with mkernel's AllGather (any layout of the
 * ranks: threads, processes, nodes) into stream-ordered scratch (2 * nranks * batch * seqLocal
 * * hkv * headDim elements, freed at the end of the call), then runs mkernel's attention kernel
 * (TMA, wgmma, producer/consumer warpgroups) over the gathered sequence; ncclFusedAuto runs it.
 * ncclFusedFused runs one persistent kernel per rank when the comm's ranks (at most 32) live on
 * one node, either all in this process on one GPU or each in its own process (then each rank
 * stages its k and v in memory every local rank maps, made at the first such call, which must
 * not be captured; otherwise the sequential path): its communication CTAs copy
 * the peers' k/v slices in ring order (this rank's, then rank-1's, ...) while its attention CTAs
 * already run on the slices in place; same scratch, same results. Ranks each in its own process,
 * all on one GPU (at most 8), by default read the peers' copies in place instead: each rank
 * copies its k and v into its mapped memory before its kernel, and the kernel has no copy CTAs
 * and no gather scratch (MKERNEL_RING_DIRECT). In both, the call completes only after every
 * peer has read this rank's k and v. On a comm spanning (virtual) nodes, ncclFusedFused runs a
 * fused kernel whose slices travel through the device communication API (P2P inside a node,
 * the proxy across; MKERNEL_FUSED_XNODE=1, the default), where its plan fits the comm's
 * window; ncclFusedAuto stays sequential there. With MKERNEL_RING_SEQ_DIRECT=1 (every rank
 * alike; the default since session 35, measured faster than gathering) the sequential path of
 * ranks that are processes all on one GPU reads the peers' copies in place too, after a
 * one-thread wait for them, instead of gathering.
 *
 * Rules (ncclInvalidArgument otherwise): inType bf16/fp16; headDim 64, 128 or 256; hq, hkv >= 1
 * and hq % hkv == 0; batch, seqLocal >= 1; zigzag: seqLocal even; q, k, v, out 16-byte
 * aligned, lse 4-byte aligned; out does not overlap q, k or v, lse none of q, k, v and out;
 * config->scale finite (<= 0 selects 1/sqrt(headDim)); every element count below 2^31
 * and nranks * seqLocal below 2^31. Capturable; never synchronises the host. The sequential
 * path runs on communicators of at most 512 ranks (ncclInvalidUsage above).
 */
typedef enum {
  ncclRingAttnContiguous = 0, /* rank r holds positions [r*S, (r+1)*S) */
  ncclRingAttnZigzag = 1      /* rank r holds chunks r and 2n-1-r of 2n chunks */
} ncclRingAttnLayout_t;

#define NCCL_RING_ATTN_CONFIG_MAGIC 0x6d6b5261u /* "mkRa" */
#define NCCL_RING_ATTN_CONFIG_VERSION 1u
typedef struct {
  size_t size;          /* sizeof(ncclRingAttnConfig_t) of the caller */
  unsigned int magic;   /* NCCL_RING_ATTN_CONFIG_MAGIC */
  unsigned int version; /* NCCL_RING_ATTN_CONFIG_VERSION */
  int causal;           /* 0: every key; 1: keys at positions <= the query's */
  float scale;          /* softmax scale; <= 0: 1/sqrt(headDim) */
  int seqLayout;        /* ncclRingAttnLayout_t */
  int commSms;          /* -1: automatic; >= 1 forces the communication CTAs (fused path) */
  int algo;             /* ncclFusedAlgo_t */
} ncclRingAttnConfig_t;
#define NCCL_RING_ATTN_CONFIG_INITIALIZER                                                        \
  {                                                                                              \
    sizeof(ncclRingAttnConfig_t), NCCL_RING_ATTN_CONFIG_MAGIC, NCCL_RING_ATTN_CONFIG_VERSION, 0, \
        0.0f, ncclRingAttnContiguous, -1, ncclFusedAuto                                          \
  }

/* A NULL config means NCCL_RING_ATTN_CONFIG_INITIALIZER. */
ncclResult_t ncclRingAttention(const void* q, const void* k, const void* v, void* out, float* lse,
                               size_t batch, size_t seqLocal, int hq, int hkv, int headDim,
                               ncclDataType_t inType, const ncclRingAttnConfig_t* config,
                               ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRingAttention(const void* q, const void* k, const void* v, void* out, float* lse,
                                size_t batch, size_t seqLocal, int hq, int hkv, int headDim,
                                ncclDataType_t inType, const ncclRingAttnConfig_t* config,
                                ncclComm_t comm, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MKERNEL_FUSED_H_ */
