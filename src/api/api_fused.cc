// The fused entry points of include/mkernel/fused.h: each checks its call (no CUDA call
// before every rule passed) and hands it to the GEMM + collective operators.
#include <nccl.h>

#include "api/api.h"
#include "base/checks.h"
#include "coll/group.h"
#include "comm/comm.h"
#include "fused/ops/gemm_coll/gemm_coll.h"
#include "fused/ops/moe/moe.h"
#include "fused/ops/ring_attn/ring_attn.h"
#include "mkernel/fused.h"

namespace {
// What every fused entry checks first: a usable comm, and no open group.
ncclResult_t enter(ncclComm_t comm, const char* api) {
  NCCLCHECK(mk::commCheck(comm, api));
  NCCLCHECK(mk::commCheckReady(comm, api));
  if (mk::groupActive()) {
    // The GEMM would have to be deferred to ncclGroupEnd together with the caller's
    // buffers; NCCL has no such contract, so the call is refused rather than half-grouped.
    MK_WARN("%s: fused calls are not allowed inside ncclGroupStart/ncclGroupEnd", api);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

ncclResult_t run(mk::fused::GemmCollCall c, const ncclFusedConfig_t* config) {
  const char* api = mk::fused::gemmCollName(c.op);
  NCCLCHECK(enter(c.comm, api));
  NCCLCHECK(mk::fused::gemmCollCheck(&c, config, c.comm->nRanks, c.comm->rank));
  return mk::apiGuard(api, [&] { return mk::fused::gemmCollRun(c); });
}

mk::fused::GemmCollCall makeCall(mk::fused::GemmColl op, const void* A, const void* B, void* C,
                                 void* G, size_t M, size_t N, size_t K, ncclDataType_t inType,
                                 ncclComm_t comm, cudaStream_t stream) {
  mk::fused::GemmCollCall c;
  c.op = op;
  c.A = A;
  c.B = B;
  c.C = C;
  c.Agathered = G;
  c.M = M;
  c.N = N;
  c.K = K;
  c.inType = inType;
  c.comm = comm;
  c.stream = stream;
  return c;
}
}  // namespace

MK_API(ncclResult_t, ncclGemmAllReduce, const void* A, const void* B, void* C, size_t M, size_t N,
       size_t K, ncclDataType_t inType, const ncclFusedConfig_t* config, ncclComm_t comm,
       cudaStream_t stream) {
  return run(
      makeCall(mk::fused::GemmColl::kAllReduce, A, B, C, nullptr, M, N, K, inType, comm, stream),
      config);
}

MK_API(ncclResult_t, ncclAllGatherGemm, const void* Ashard, const void* B, void* C, void* Agathered,
       size_t M, size_t N, size_t K, ncclDataType_t inType, const ncclFusedConfig_t* config,
       ncclComm_t comm, cudaStream_t stream) {
  return run(makeCall(mk::fused::GemmColl::kAllGather, Ashard, B, C, Agathered, M, N, K, inType,
                      comm, stream),
             config);
}

MK_API(ncclResult_t, ncclGemmReduceScatter, const void* A, const void* B, void* Cshard, size_t M,
       size_t N, size_t K, ncclDataType_t inType, const ncclFusedConfig_t* config, ncclComm_t comm,
       cudaStream_t stream) {
  return run(makeCall(mk::fused::GemmColl::kReduceScatter, A, B, Cshard, nullptr, M, N, K, inType,
                      comm, stream),
             config);
}

namespace {
// The fields both MoE calls share; checked (moeCheck) and run.
ncclResult_t moeRunChecked(mk::fused::MoeCall& c, const void* x, const int* topkIdx,
                           const float* topkWeights, const void* w1, size_t tokens, size_t hidden,
                           int experts, int topk, ncclDataType_t inType,
                           const ncclMoeConfig_t* config, ncclComm_t comm, cudaStream_t stream) {
  c.x = x;
  c.topkIdx = topkIdx;
  c.topkWeights = topkWeights;
  c.w1 = w1;
  c.T = tokens;
  c.H = hidden;
  c.E = experts;
  c.k = topk;
  c.inType = inType;
  c.comm = comm;
  c.stream = stream;
  NCCLCHECK(mk::fused::moeCheck(&c, config, comm->nRanks));
  return mk::apiGuard(mk::fused::moeApi(c), [&] { return mk::fused::moeRun(c); });
}
}  // namespace

MK_API(ncclResult_t, ncclMoeDispatchGemm, const void* x, const int* topkIdx,
       const float* topkWeights, const void* w1, const ncclMoeRecv_t* recv, size_t tokens,
       size_t hidden, size_t n, int experts, int topk, ncclDataType_t inType,
       const ncclMoeConfig_t* config, ncclComm_t comm, cudaStream_t stream) {
  const char* api = "ncclMoeDispatchGemm";
  NCCLCHECK(enter(comm, api));
  MK_ARGCHECK(recv != nullptr, "%s: recv must not be NULL", api);
  mk::fused::MoeCall c;
  c.recv = *recv;
  c.N = n;
  return moeRunChecked(c, x, topkIdx, topkWeights, w1, tokens, hidden, experts, topk, inType,
                       config, comm, stream);
}

MK_API(ncclResult_t, ncclMoeDispatchFfnCombine, const void* x, const int* topkIdx,
       const float* topkWeights, const void* w1, const void* w2, void* y,
       const ncclMoeFfnBuffers_t* buf, size_t tokens, size_t hidden, size_t inter, int experts,
       int topk, ncclDataType_t inType, const ncclMoeConfig_t* config, ncclComm_t comm,
       cudaStream_t stream) {
  const char* api = "ncclMoeDispatchFfnCombine";
  NCCLCHECK(enter(comm, api));
  MK_ARGCHECK(buf != nullptr, "%s: buf must not be NULL", api);
  MK_ARGCHECK(inter < (size_t(1) << 30), "%s: inter=%zu must be below 2^30", api, inter);
  mk::fused::MoeCall c;
  c.ffn = true;
  c.w2 = w2;
  c.yOut = y;
  c.buf = *buf;
  // The dispatch and GEMM1 see the buffers as a recv layout whose y is GEMM1's output.
  c.recv.xRecv = buf->xRecv;
  c.recv.y = buf->h;
  c.recv.expertCount = buf->expertCount;
  c.recv.expertOffset = buf->expertOffset;
  c.recv.rowSource = nullptr;
  c.recv.rowWeight = nullptr;
  c.recv.maxRows = buf->maxRows;
  c.I = inter;
  c.N = 2 * inter;
  return moeRunChecked(c, x, topkIdx, topkWeights, w1, tokens, hidden, experts, topk, inType,
                       config, comm, stream);
}

MK_API(ncclResult_t, ncclRingAttention, const void* q, const void* k, const void* v, void* out,
       float* lse, size_t batch, size_t seqLocal, int hq, int hkv, int headDim,
       ncclDataType_t inType, const ncclRingAttnConfig_t* config, ncclComm_t comm,
       cudaStream_t stream) {
  const char* api = "ncclRingAttention";
  NCCLCHECK(enter(comm, api));
  mk::fused::RingAttnCall c;
  c.q = q;
  c.k = k;
  c.v = v;
  c.out = out;
  c.lse = lse;
  c.B = batch;
  c.S = seqLocal;
  c.Hq = hq;
  c.Hkv = hkv;
  c.D = headDim;
  c.inType = inType;
  c.comm = comm;
  c.stream = stream;
  NCCLCHECK(mk::fused::ringAttnCheck(&c, config, comm->nRanks));
  return mk::apiGuard(api, [&] { return mk::fused::ringAttnRun(c); });
}
