#include "fused/ops/example/example.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "base/checks.h"
#include "base/param.h"
#include "device/chan.cuh"
#include "fused/core/cost_model.h"
#include "fused/core/framework.h"
#include "fused/core/fused_comm.h"
#include "fused/core/fused_dev.cuh"
#include "fused/gemm/gemm_kernel.cuh"

namespace mk {
namespace fused {
namespace example {

namespace {

struct Params {
  gemm::GemmParams g;  // first: holds the 64-byte aligned tensor maps
  FusedComm f;
  SmSplit split;
  uint16_t* recv;  // bf16 bits
  int64_t ldRecv;
  uint64_t* recvFlags;
  int32_t lanes;       // channel lanes per direction (the same on every rank)
  int32_t next, prev;  // local indices of the ring neighbours
};

static_assert(Config::kThreads == gemm::kThreads, "compute role needs the GEMM CTA shape");
static_assert(gemm::kSmemBytes <= gemm::kMaxSmemPerBlock, "shared-memory budget");
static_assert(Config::kMaxLanes <= kMaxLanes, "lanes of the comm's channels");
static_assert(sizeof(Params) < 32000, "kernel parameter limit");

// Tile `id` (mBlk * tilesN + nBlk) as a packed row-major block of rows x cols elements.
struct Tile {
  int64_t m0, n0;
  int32_t rows, cols;
  __device__ Tile(const gemm::GemmParams& g, int32_t id) {
    const int32_t mBlk = id / g.tilesN, nBlk = id - mBlk * g.tilesN;
    m0 = (int64_t)mBlk * gemm::kTileM;
    n0 = (int64_t)nBlk * gemm::kTileN;
    rows = min(gemm::kTileM, g.M - (int32_t)m0);
    cols = min(gemm::kTileN, g.N - (int32_t)n0);
  }
  __device__ int64_t elems() const { return (int64_t)rows * cols; }
  // Element e of the packed block in a matrix of leading dimension ld.
  __device__ int64_t at(int64_t e, int64_t ld) const {
    const int64_t r = e / cols;
    return (m0 + r) * ld + n0 + (e - r * cols);
  }
};

// Messages of one tile: slot-sized pieces of its packed elements.
__device__ __forceinline__ int64_t pieceElems(const Params& p) {
  return (int64_t)(p.f.c.ws.slotBytes / sizeof(uint16_t));
}

// Shared by the threads of a comm CTA.
struct CommShared {
  uint64_t k;  // channel message counter
  int ok;
};

// Waits for tile `id` of this call's GEMM: its flag carries the call number (seqBase).
__device__ bool waitTile(const Params& p, int32_t id, uint64_t seq, CommShared& sh) {
  if (threadIdx.x == 0) sh.ok = rt::waitFlag(p.f.c.w, p.g.hooks.tileDone + id, seq, id, false);
  __syncthreads();
  const bool ok = sh.ok != 0;
  __syncthreads();  // every thread has read sh.ok before thread 0 writes it again
  return ok;
}
__device__ void tileReceived(const Params& p, int32_t id, uint64_t seq) {
  if (p.recvFlags == nullptr) return;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) rt::releaseFlag(p.recvFlags + id, seq, false);
}

// Roles send (kSend: own tiles to the next rank) and receive (the previous rank's tiles
// into recv). Lanes idx, idx + n, ...; on each lane the tiles id = lane, lane + lanes, ...
// in ascending order, each in slot-sized pieces; the other end walks the same sequence, so
// every wait depends only on earlier messages of the same lane.
template <bool kSend>
__device__ void ringRole(const Params& p, int32_t idx, int32_t n, uint64_t seq, CommShared& sh) {
  const CommDev& c = p.f.c;
  const int peer = kSend ? p.next : p.prev;
  const uint16_t* D = static_cast<const uint16_t*>(p.g.D);
  const int32_t numTiles = p.g.tilesM * p.g.tilesN;
  for (int32_t lane = idx; lane < p.lanes; lane += n) {
    const dev::P2pLink link =
        kSend ? dev::sendLink(c, c.peers, peer, lane) : dev::recvLink(c, c.peers, peer, lane);
    uint64_t* cnt = (kSend ? c.sendCnt : c.recvCnt) + peer * kMaxLanes + lane;
    if (threadIdx.x == 0) sh.k = *cnt;
    __syncthreads();
    for (int32_t id = lane; id < numTiles; id += p.lanes) {
      if (kSend && !waitTile(p, id, seq, sh)) return;
      const Tile t(p.g, id);
      for (int64_t e0 = 0; e0 < t.elems(); e0 += pieceElems(p)) {
        const int64_t e1 = min(t.elems(), e0 + pieceElems(p));
        if (threadIdx.x == 0)
          sh.ok = kSend ? dev::acquire(c, link, sh.k, rt::kOpExample, peer, lane)
                        : dev::receive(c, link, sh.k, rt::kOpExample, peer, lane);
        __syncthreads();
        if (!sh.ok) return;
        uint16_t* slot = reinterpret_cast<uint16_t*>(dev::slotData(link, sh.k));
        for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
          if (kSend)
            slot[e - e0] = D[t.at(e, p.g.ldd)];
          else  // peers rewrite slots between two reads of the same address: bypass L1
            p.recv[t.at(e, p.ldRecv)] = __ldcg(slot + (e - e0));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
          ptx::fenceAcqRelSys();
          if (kSend)
            dev::publish(link, sh.k);
          else
            dev::release(link, sh.k);
          sh.k++;
        }
        __syncthreads();
      }
      if (!kSend) tileReceived(p, id, seq);
    }
    if (threadIdx.x == 0) *cnt = sh.k;
    __syncthreads();
  }
}

// Role for a rank alone in its node: its own tiles are the "previous rank's".
__device__ void selfRole(const Params& p, int32_t idx, int32_t n, uint64_t seq, CommShared& sh) {
  const uint16_t* D = static_cast<const uint16_t*>(p.g.D);
  const int32_t numTiles = p.g.tilesM * p.g.tilesN;
  for (int32_t id = idx; id < numTiles; id += n) {
    if (!waitTile(p, id, seq, sh)) return;
    const Tile t(p.g, id);
    for (int64_t e = threadIdx.x; e < t.elems(); e += blockDim.x)
      p.recv[t.at(e, p.ldRecv)] = D[t.at(e, p.g.ldd)];
    tileReceived(p, id, seq);
  }
}

// 5. The persistent kernel: role dispatch. Compute CTAs need the GEMM register split
// (setmaxnreg), hence __launch_bounds__(kThreads, 1) for the whole kernel.
template <gemm::BLayout kB>
__global__ void __launch_bounds__(Config::kThreads, 1)
    exampleKernel(const __grid_constant__ Params p) {
  extern __shared__ uint8_t smem[];
  __shared__ CommShared sh;
  __shared__ uint64_t seq;
  if (rt::ctaFailed(p.f.c.w)) return;  // an earlier operation failed: peers are out of step
  if (threadIdx.x == 0) seq = callSeq(p.f);
  __syncthreads();
  int32_t idx;
  const Role role = p.split.roleOf(blockIdx.x, &idx);
  const int32_t nComm = p.split.of(Role::kIntraComm), nSend = (nComm + 1) / 2;
  if (role == Role::kCompute) {
    gemm::gemmCta<gemm::Traits<gemm::DType::kBF16, gemm::DType::kBF16, kB>>(
        p.g, smem, idx, p.split.of(Role::kCompute));
  } else if (role == Role::kIntraComm && p.lanes == 0) {
    selfRole(p, idx, nComm, seq, sh);
  } else if (role == Role::kIntraComm && idx < nSend) {
    ringRole<true>(p, idx, nSend, seq, sh);
  } else if (role == Role::kIntraComm) {
    ringRole<false>(p, idx - nSend, nComm - nSend, seq, sh);
  }
  __syncthreads();
  if (threadIdx.x == 0) finishCall(p.f, seq);
}

}  // namespace

bool canImplement(const Args& a, std::string* why) {
  if (!gemm::canImplement(a.gemm, why)) return false;
  auto fail = [&](const char* m) {
    if (why) *why = m;
    return false;
  };
  if (a.gemm.abType != gemm::DType::kBF16 || a.gemm.dType != gemm::DType::kBF16)
    return fail("the example operator supports bf16 inputs and output only");
  if (a.gemm.hooks.tileDone != nullptr || a.gemm.hooks.rowReady != nullptr)
    return fail("the example operator sets the GEMM hooks itself");
  if (a.gemm.alpha != 1.0f || a.gemm.beta != 0.0f)
    return fail("the example operator computes D = A·B (alpha 1, beta 0)");
  if (a.recv == nullptr || a.tileFlags == nullptr) return fail("recv and tileFlags must be set");
  if (a.ldRecv != 0 && a.ldRecv < a.gemm.N) return fail("ldRecv must be >= N");
  return true;
}

ncclResult_t launch(const Args& a, ncclComm* comm, cudaStream_t stream, SmSplit* splitOut) {
  std::string why;
  if (!canImplement(a, &why)) {
    MK_WARN("fused example: %s", why.c_str());
    return ncclInvalidArgument;
  }
  FusedComm f;
  NCCLCHECK(fusedCommView(comm, rt::kOpExample, &f));
  const int budget = a.gemm.smBudget > 0 ? std::min(a.gemm.smBudget, f.smBudget) : f.smBudget;
  const int nLocal = f.c.nLocal;
  const int minComm = nLocal > 1 ? Config::kMinCommCtas : 1;
  MK_ARGCHECK(budget > minComm, "fused example: an SM budget of %d leaves no SM for compute",
              budget);

  SplitQuery q;
  q.M = a.gemm.M;
  q.N = a.gemm.N;
  q.K = a.gemm.K;
  q.nRanks = nLocal;
  q.intraBytes = 2.0 * a.gemm.M * a.gemm.N * 2;  // D out, the previous rank's D in
  DeviceRates rates;
  // The model needs rates only when no override decides the split.
  if (a.commSms < 0 && MK_PARAM_INT(FusedCommSms) < 0) NCCLCHECK(getDeviceRates(f.cudaDev, &rates));
  SplitChoice choice = resolveSplit(q, rates, budget, a.commSms);
  SmSplit split;  // compute and intra-node roles only (no inter-node roles in this operator)
  int commCtas = std::max(minComm, choice.split.commTotal());
  commCtas = std::min(commCtas, budget - 1);
  split.count[(int)Role::kCompute] = budget - commCtas;
  split.count[(int)Role::kIntraComm] = commCtas;
  if (splitOut != nullptr) *splitOut = split;

  Params p{};
  gemm::GemmArgs g = a.gemm;
  g.hooks.tileDone = a.tileFlags;
  // Tiles are published with the call number (completed calls + 1), read on the device:
  // flags are never reset and a CUDA graph replay publishes a new value.
  g.hooks.seqBase = fusedCallCounter(f);
  g.hooks.tileDoneValue = 1;
  g.hooks.wait = f.c.w;
  g.cluster = 1;  // the operator's compute role runs the unpaired GEMM CTA
  // ...with the deep ring: a caller's pipeline 3 would change tmB's box (half-tile units).
  g.pipeline = 0;
  int32_t gridUnused;
  NCCLCHECK(gemm::buildParams(g, &p.g, &gridUnused));
  p.f = f;
  p.split = split;
  p.recv = static_cast<uint16_t*>(a.recv);
  p.ldRecv = a.ldRecv ? a.ldRecv : a.gemm.N;
  p.recvFlags = a.recvFlags;
  p.lanes = nLocal > 1 ? std::min(f.c.ws.lanes, Config::kMaxLanes) : 0;
  p.next = (f.c.me + 1) % nLocal;
  p.prev = (f.c.me + nLocal - 1) % nLocal;
  MK_INFO(kFused, "fused example: rank %d M=%d N=%d K=%d split compute=%d comm=%d (%s), lanes %d",
          f.rank, g.M, g.N, g.K, split.of(Role::kCompute), split.of(Role::kIntraComm),
          choice.source, p.lanes);
  auto kernel = g.bLayout == gemm::BLayout::kKN ? exampleKernel<gemm::BLayout::kKN>
                                                : exampleKernel<gemm::BLayout::kNK>;
  return fusedEnqueue(comm, stream, "fused example", [&](cudaStream_t s) {
    return launchRoles(kernel, split, Config::kThreads, gemm::kSmemBytes, s, p);
  });
}

}  // namespace example
}  // namespace fused
}  // namespace mk
