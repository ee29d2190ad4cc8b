// Case lists of the multi-process collective tests (see test_coll_procs_cases.h).
#include <string>
#include <vector>

#include "gpu/test_coll_procs_cases.h"

namespace procstest {

using namespace colltest;

const char* kindName(K k) {
  static const char* n[] = {"AllReduce", "Reduce", "ReduceScatter", "AllGather", "Broadcast",
                            "AlltoAll",  "Gather", "Scatter",       "SendRecv"};
  return n[(int)k];
}
bool isRed(K k) {
  return k == K::kAllReduce || k == K::kReduce || k == K::kReduceScatter;
}
bool rooted(K k) {
  return k == K::kReduce || k == K::kBroadcast || k == K::kGather || k == K::kScatter;
}

std::string caseName(const Case& c) {
  std::string s = std::string(kindName(c.k)) + "_" + dtInfo(c.dt).name;
  if (isRed(c.k)) s += std::string("_") + opName(c.op);
  s += "_c" + sizeName(c.count) + (c.inplace ? "_inplace" : "_oop");
  if (rooted(c.k)) s += "_root" + std::to_string(c.root);
  if (c.algo) s += std::string("_") + c.algo;
  if (c.reg == kRegCudaMalloc) s += "_regCudaMalloc";
  if (c.reg == kRegMemAlloc) s += "_regMemAlloc";
  if (c.reg == kRegWindow) s += "_window";
  if (c.reps > 1) s += "_x" + std::to_string(c.reps);
  return s;
}

size_t sendElems(const Case& c, int n) {
  bool perRank = c.k == K::kReduceScatter || c.k == K::kAlltoAll || c.k == K::kScatter;
  return perRank ? c.count * n : c.count;
}
size_t recvElems(const Case& c, int n) {
  bool perRank = c.k == K::kAllGather || c.k == K::kAlltoAll || c.k == K::kGather;
  return perRank ? c.count * n : c.count;
}

int rankIndex(int n) {
  for (int i = 0; i < 4; i++)
    if (kRankCounts[i] == n) return i;
  return n % 4;
}

// The cases of one N (every child of the run builds the same list).
std::vector<Case> mainPlan(int n) {
  const int ni = rankIndex(n);
  std::vector<Case> v;
  // Count 0: a no-op on every rank, for every operation.
  for (int i = 0; i < 3; i++)
    v.push_back({kRed[i], kAllTypes[(i + ni) % 12], Op::kSum, 0, false, n - 1});
  for (int i = 0; i < 6; i++)
    v.push_back({kCopy[i], kAllTypes[(i + 3 + ni) % 12], Op::kSum, 0, false, n - 1});
  // Every (dtype, op) pair once over the four N: pair k (dtype k / 7, op k % 7) runs with
  // N = kRankCounts[k % 4]; each N sees every op (gcd(4, 7) = 1), every reduction at
  // counts 1, 7 and 1023, in and out of place, rotating roots.
  for (int k = ni; k < 84; k += 4) {
    const int j = k / 4;  // 0..20
    static const size_t kCounts[3] = {1, 7, 1023};
    v.push_back({kRed[j % 3], kAllTypes[k / 7], kAllOps[k % 7], kCounts[(j / 3) % 3],
                 (j / 2) % 2 == 1, j % n});
  }
  // Copies: counts 1, 7 and 1023 with rotating dtypes, in and out of place.
  for (int i = 0; i < 6; i++) {
    const bool p2p = kCopy[i] == K::kSendRecv;
    const bool in = !p2p && (i + ni) % 2 == 1;
    v.push_back({kCopy[i], kAllTypes[(i * 5 + ni * 7 + 2) % 12], Op::kSum, 1, false, 0});
    v.push_back({kCopy[i], kAllTypes[(i * 2 + ni * 3) % 12], Op::kSum, 7, in, (i + 1) % n});
    v.push_back(
        {kCopy[i], kAllTypes[(i * 2 + ni * 3 + 1) % 12], Op::kSum, 1023, !p2p && !in, n - 1});
  }
  // 1M+3: reductions (ReduceScatter's count is per rank: about 1M+3 in total from N=4 up).
  {
    static const ncclDataType_t arDt[4] = {ncclFloat32, ncclBfloat16, ncclInt32, ncclFloat16};
    static const Op arOp[4] = {Op::kSum, Op::kAvg, Op::kPreMulHost, Op::kPreMulDev};
    v.push_back({K::kAllReduce, arDt[ni], arOp[ni], kM3, ni % 2 == 1, 0});
    static const ncclDataType_t rDt[4] = {ncclFloat16, ncclInt64, ncclFloat32, ncclUint8};
    static const Op rOp[4] = {Op::kMax, Op::kSum, Op::kPreMulDev, Op::kMin};
    v.push_back({K::kReduce, rDt[ni], rOp[ni], kM3, false, n - 1});
    static const ncclDataType_t rsDt[4] = {ncclFloat32, ncclUint32, ncclBfloat16, ncclFloat64};
    static const Op rsOp[4] = {Op::kSum, Op::kProd, Op::kAvg, Op::kPreMulHost};
    v.push_back({K::kReduceScatter, rsDt[ni], rsOp[ni], n <= 3 ? kM3 : kM3 / n, ni == 2, 0});
  }
  // 1M+3 copies: three kinds per N, every kind at two N.
  for (int i = 0; i < 6; i++) {
    if ((i + ni) % 2) continue;
    static const ncclDataType_t dts[3] = {ncclInt8, ncclFloat32, ncclFloat16};
    const bool in = kCopy[i] != K::kSendRecv && (i / 2 + ni / 2) % 2 == 1;
    v.push_back({kCopy[i], dts[(i + ni) % 3], Op::kSum, kM3, in, (i + ni) % n});
  }
  // AllReduce with the algorithm forced: 1023 and 1M+3 elements, rotating dtypes and ops.
  static const char* kAlgos[3] = {"oneshot", "twoshot", "ring"};
  for (int a = 0; a < 3; a++) {
    const bool in = (a + ni) % 2 == 1;
    v.push_back({K::kAllReduce, kAllTypes[(a * 4 + ni * 5) % 12], kAllOps[(a * 2 + ni * 3) % 7],
                 1023, in, 0, kAlgos[a]});
    v.push_back({K::kAllReduce, kAllTypes[(a * 5 + ni * 3 + 6) % 12], kAllOps[(a + ni * 2 + 3) % 7],
                 kM3, !in, 0, kAlgos[a]});
  }
  return v;
}

// 64M floats once (N=4).
std::vector<Case> hugePlan() {
  return {{K::kAllReduce, ncclFloat32, Op::kSum, 64u << 20, false, 0}};
}

// Registered send and receive buffers (ncclCommRegister): the zero-copy path of ranks in
// other processes. The first case runs twice on the same buffers (the mapping cache).
std::vector<Case> regPlan() {
  const size_t k16M5 = (16u << 20) + 5;
  return {
      {K::kAllReduce, ncclFloat32, Op::kSum, k16M5, false, 0, nullptr, kRegCudaMalloc, 2},
      {K::kAllReduce, ncclFloat32, Op::kSum, 64u << 20, false, 0, nullptr, kRegCudaMalloc, 1},
      {K::kAllReduce, ncclFloat32, Op::kSum, k16M5, false, 0, nullptr, kRegMemAlloc, 1},
      {K::kAllReduce, ncclFloat32, Op::kPreMulHost, k16M5, false, 0, nullptr, kRegMemAlloc, 1},
      {K::kAllReduce, ncclBfloat16, Op::kAvg, kM3 * 5, true, 0, nullptr, kRegCudaMalloc, 1},
      // The other collectives over the registered path (4 MiB up: one lookup per call).
      {K::kReduceScatter, ncclFloat32, Op::kSum, kM3, false, 0, nullptr, kRegMemAlloc, 2, true},
      {K::kReduce, ncclFloat32, Op::kMax, k16M5 / 4 * 2, false, 2, nullptr, kRegMemAlloc, 1, true},
      {K::kAllGather, ncclFloat32, Op::kSum, kM3, false, 0, nullptr, kRegCudaMalloc, 2, true},
      {K::kBroadcast, ncclInt8, Op::kSum, k16M5, false, 1, nullptr, kRegMemAlloc, 1, true},
      {K::kAlltoAll, ncclFloat32, Op::kSum, kM3, false, 0, nullptr, kRegMemAlloc, 1, true},
      {K::kGather, ncclFloat32, Op::kSum, kM3, false, 3, nullptr, kRegCudaMalloc, 1, true},
      {K::kScatter, ncclFloat32, Op::kSum, kM3, false, 2, nullptr, kRegMemAlloc, 1, true},
  };
}

std::vector<Case> winPlan() {
  std::vector<Case> v;
  const size_t big = 300007;  // floats: 1.2 MB per block, above the zero-copy threshold
  int k = 0;
  for (K kind : {K::kAllReduce, K::kReduce, K::kReduceScatter, K::kAllGather, K::kBroadcast,
                 K::kAlltoAll, K::kGather, K::kScatter}) {
    // Out of place and in place (in place the buffers sit at rank-dependent offsets of the
    // windows; AlltoAll in place stages).
    v.push_back({kind, ncclFloat32, Op::kSum, big, false, k++ % 4, nullptr, kRegWindow, 2, true});
    v.push_back({kind, ncclBfloat16, Op::kMin, big + 1, true, k++ % 4, nullptr, kRegWindow, 1,
                 kind != K::kAlltoAll});
    // Small, forced: the handshake alone dominates.
    v.push_back({kind, ncclInt32, Op::kSum, 1023, false, k++ % 4, "zerocopy", kRegWindow, 2, true});
  }
  v.push_back(
      {K::kAllReduce, ncclFloat16, Op::kPreMulHost, kM3, false, 0, nullptr, kRegWindow, 1, true});
  v.push_back({K::kReduceScatter, ncclFloat8e4m3, Op::kPreMulDev, 4099, false, 0, "zerocopy",
               kRegWindow, 1, true});
  v.push_back(
      {K::kAllReduce, ncclInt64, Op::kProd, 4099, true, 0, "zerocopy", kRegWindow, 1, true});
  return v;
}

}  // namespace procstest
