// Reduction collectives on ranks sharing GPU 0: AllReduce (every algorithm), Reduce and
// ReduceScatter for every dtype and op, in and out of place, counts 0..64M, 1-8 ranks.
// Outputs are poisoned first; integers are compared exactly, floats against a double
// reference within the bound of one rounding per reduction step; every rank's AllReduce
// result must be bit-identical.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/test_coll_util.h"

using namespace colltest;

namespace colltest {
namespace {
const char* rcollName(RColl c) {
  return c == RColl::kAllReduce ? "AllReduce" : c == RColl::kReduce ? "Reduce" : "ReduceScatter";
}

}  // namespace

std::string paramName(const RedParam& p) {
  std::string s = std::string(rcollName(p.coll)) + "_" + dtInfo(p.dt).name + "_" + opName(p.op) +
                  "_n" + std::to_string(p.n) + "_c" + sizeName(p.count) +
                  (p.inplace ? "_inplace" : "_oop");
  if (p.coll == RColl::kReduce) s += "_root" + std::to_string(p.root);
  if (p.algo) s += std::string("_") + p.algo;
  if (p.offset) s += "_off" + std::to_string(p.offset);
  return s;
}

namespace {
uint64_t caseSeed(const std::string& name) {
  uint64_t h = mktest::testSeed();
  for (char ch : name) h = (h ^ (uint8_t)ch) * 1099511628211ull;
  return h;
}

ncclResult_t issue(const RedParam& p, Clique& c, int r, const void* s, void* d, ncclRedOp_t op) {
  switch (p.coll) {
    case RColl::kAllReduce:
      return ncclAllReduce(s, d, p.count, p.dt, op, c.comms[r], c.streams[r]);
    case RColl::kReduce:
      return ncclReduce(s, d, p.count, p.dt, op, p.root, c.comms[r], c.streams[r]);
    default:
      return ncclReduceScatter(s, d, p.count, p.dt, op, c.comms[r], c.streams[r]);
  }
}

}  // namespace

void runReduction(const RedParam& p) {
  Clique& c = clique(p.n);
  ASSERT_TRUE(c.ok) << c.why;
  AlgoScope algo(p.algo);
  const std::string name = paramName(p);
  const DtInfo& d = dtInfo(p.dt);
  const size_t es = d.size;
  const int n = p.n;
  const size_t sendCount = p.coll == RColl::kReduceScatter ? p.count * n : p.count;
  const size_t recvCount = p.count;
  const uint64_t seed = caseSeed(name);
  const bool premul = p.op == Op::kPreMulDev || p.op == Op::kPreMulHost;
  std::vector<HostBuf> in(n);
  std::vector<const HostBuf*> inPtr(n);
  for (int r = 0; r < n; r++) {
    fillRandom(in[r], p.dt, p.op, sendCount, seed + 1000003ull * r);
    inPtr[r] = &in[r];
  }
  // PreMulSum: every rank its own scalar (as nccl-tests does): each input is scaled by its
  // owner's scalar, whichever rank reduces it.
  std::vector<uint64_t> scalarOf(n, 0);
  for (int r = 0; r < n && premul; r++) scalarOf[r] = scalarFor(p.dt, seed + 7919ull * r);
  const size_t sOff = p.offset * es, rOff = p.offset ? (p.offset + 2) * es : 0;
  std::vector<DevBuf> bufs;
  std::vector<const void*> sp(n);
  std::vector<void*> rp(n);
  for (int r = 0; r < n; r++) {
    if (p.inplace) {
      bufs.emplace_back(std::max(sendCount, recvCount) * es + sOff + 64);
      char* b = bufs.back().at(sOff);
      sp[r] = b;
      rp[r] = p.coll == RColl::kReduceScatter ? b + (size_t)r * p.count * es : b;
    } else {
      bufs.emplace_back(sendCount * es + sOff + 64);
      sp[r] = bufs.back().at(sOff);
      bufs.emplace_back(recvCount * es + rOff + 64);
      ASSERT_EQ(mktest::syncMemset(bufs.back().base, 0xCD, bufs.back().bytes), cudaSuccess);
      rp[r] = bufs.back().at(rOff);
    }
    upload((void*)sp[r], in[r], 0, sendCount);
  }
  std::vector<ncclRedOp_t> ops(n, ncclSum);
  std::vector<DevBuf> scalars;
  for (int r = 0; r < n; r++) {
    switch (p.op) {
      case Op::kSum:
        ops[r] = ncclSum;
        break;
      case Op::kProd:
        ops[r] = ncclProd;
        break;
      case Op::kMax:
        ops[r] = ncclMax;
        break;
      case Op::kMin:
        ops[r] = ncclMin;
        break;
      case Op::kAvg:
        ops[r] = ncclAvg;
        break;
      case Op::kPreMulDev:
        scalars.emplace_back(16);
        ASSERT_EQ(mktest::syncMemcpy(scalars.back().base, &scalarOf[r], es, cudaMemcpyHostToDevice),
                  cudaSuccess);
        ASSERT_EQ(ncclRedOpCreatePreMulSum(&ops[r], scalars.back().base, p.dt, ncclScalarDevice,
                                           c.comms[r]),
                  ncclSuccess);
        break;
      case Op::kPreMulHost: {
        uint64_t local = scalarOf[r];
        ASSERT_EQ(
            ncclRedOpCreatePreMulSum(&ops[r], &local, p.dt, ncclScalarHostImmediate, c.comms[r]),
            ncclSuccess);
        break;
      }
    }
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; r++)
    ASSERT_EQ(issue(p, c, r, sp[r], rp[r], ops[r]), ncclSuccess) << ncclGetLastError(nullptr);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  // Destroying a PreMulSum op right after the call must not affect the running operation.
  if (premul)
    for (int r = 0; r < n; r++) EXPECT_EQ(ncclRedOpDestroy(ops[r], c.comms[r]), ncclSuccess);
  std::string why;
  ASSERT_TRUE(syncClique(c, p.count > (1u << 24) ? 300 : 60, &why)) << name << ": " << why;
  // AllReduce: rank 0 against the reference, every other rank bit-identical to rank 0.
  HostBuf first;
  for (int r = 0; r < n; r++) {
    if (p.coll == RColl::kReduce && r != p.root) continue;
    HostBuf got;
    download(got, rp[r], recvCount, es);
    if (p.coll == RColl::kAllReduce && r > 0) {
      EXPECT_EQ(checkBytes(got, 0, first, 0, recvCount * es, "result vs rank 0"), "")
          << name << ": rank " << r << " is not bit-identical to rank 0";
      continue;
    }
    size_t base = p.coll == RColl::kReduceScatter ? (size_t)r * p.count : 0;
    std::string e = checkReduction(p.dt, p.op, inPtr, base, got, recvCount, scalarOf);
    EXPECT_EQ(e, "") << name << ": rank " << r << " (seed " << mktest::testSeed() << ")";
    if (r == 0) first = std::move(got);
  }
}

}  // namespace colltest

namespace {

class CollReduce : public ::testing::TestWithParam<RedParam> {};

TEST_P(CollReduce, Matches) {
  MKTEST_REQUIRE_GPU();
  runReduction(GetParam());
}

std::string nameOf(const ::testing::TestParamInfo<RedParam>& i) {
  return paramName(i.param);
}

// Drops cases whose name repeats (generators overlap at their edges).
std::vector<RedParam> unique(std::vector<RedParam> v) {
  std::set<std::string> seen;
  std::vector<RedParam> out;
  for (const RedParam& p : v)
    if (seen.insert(paramName(p)).second) out.push_back(p);
  return out;
}

const int kRanks[] = {1, 2, 3, 4, 8};
const size_t kMiB3 = (1u << 20) + 3;

// Every dtype x op at small counts, every rank count, in and out of place.
std::vector<RedParam> opCases() {
  std::vector<RedParam> v;
  for (RColl coll : {RColl::kAllReduce, RColl::kReduce, RColl::kReduceScatter})
    for (ncclDataType_t dt : kAllTypes)
      for (Op op : kAllOps)
        for (size_t count : {(size_t)1, (size_t)7, (size_t)1023})
          for (int n : kRanks)
            for (bool inplace : {false, true}) {
              // Reduce/ReduceScatter: full matrix out of place, a slice in place.
              if (coll != RColl::kAllReduce && inplace && count != 7) continue;
              int root = coll == RColl::kReduce ? (int)(count % n) : 0;
              v.push_back({coll, dt, op, count, n, inplace, root, nullptr, 0});
            }
  return v;
}

// Count 0 is a no-op on every rank.
std::vector<RedParam> zeroCases() {
  std::vector<RedParam> v;
  for (RColl coll : {RColl::kAllReduce, RColl::kReduce, RColl::kReduceScatter})
    for (int n : kRanks) v.push_back({coll, ncclFloat32, Op::kSum, 0, n, false, 0, nullptr, 0});
  return v;
}

// Every AllReduce algorithm (forced with MKERNEL_ALGO) at sizes that take several chunks,
// lanes and ring rounds, for every dtype.
std::vector<RedParam> algoCases() {
  std::vector<RedParam> v;
  for (const char* algo : {"oneshot", "twoshot", "ring", "zerocopy"})
    for (ncclDataType_t dt : kAllTypes)
      for (int n : {2, 3, 4, 8}) {
        v.push_back({RColl::kAllReduce, dt, Op::kSum, 1023, n, false, 0, algo, 0});
        v.push_back(
            {RColl::kAllReduce, dt, n == 3 ? Op::kAvg : Op::kSum, kMiB3, n, n == 4, 0, algo, 0});
      }
  // Every op through every algorithm at a multi-chunk size.
  for (const char* algo : {"oneshot", "twoshot", "ring", "zerocopy"})
    for (Op op : kAllOps)
      for (ncclDataType_t dt : {ncclFloat32, ncclInt32, ncclBfloat16, ncclFloat8e5m2})
        v.push_back({RColl::kAllReduce, dt, op, 100003, 3, false, 0, algo, 0});
  return v;
}

// 1M+3 elements with the automatic choice, Reduce and ReduceScatter included.
std::vector<RedParam> largeCases() {
  std::vector<RedParam> v;
  for (ncclDataType_t dt : kAllTypes)
    for (int n : kRanks) {
      v.push_back({RColl::kAllReduce, dt, Op::kSum, kMiB3, n, false, 0, nullptr, 0});
      if (n == 2 || n == 8) {
        v.push_back({RColl::kReduce, dt, Op::kSum, kMiB3, n, false, n - 1, nullptr, 0});
        // ReduceScatter's count is per rank: keep the total input near 1M+3 elements.
        v.push_back({RColl::kReduceScatter, dt, Op::kSum, kMiB3 / n, n, false, 0, nullptr, 0});
      }
    }
  for (Op op : kAllOps)
    for (ncclDataType_t dt : {ncclFloat32, ncclInt32, ncclFloat16})
      for (int n : {3, 8}) {
        v.push_back({RColl::kAllReduce, dt, op, kMiB3, n, n == 8, 0, nullptr, 0});
        v.push_back({RColl::kReduceScatter, dt, op, kMiB3 / n, n, n == 3, 0, nullptr, 0});
        v.push_back({RColl::kReduce, dt, op, kMiB3, n, false, 1, nullptr, 0});
      }
  return v;
}

// Pointers that are element-aligned but not 16-byte aligned (scalar paths).
std::vector<RedParam> unalignedCases() {
  std::vector<RedParam> v;
  for (RColl coll : {RColl::kAllReduce, RColl::kReduce, RColl::kReduceScatter})
    for (ncclDataType_t dt : {ncclInt8, ncclFloat16, ncclFloat32, ncclFloat64})
      for (const char* algo : {"oneshot", "twoshot", "ring", "zerocopy"}) {
        if (coll != RColl::kAllReduce && algo != std::string("oneshot")) continue;
        v.push_back({coll, dt, Op::kSum, 100003, 3, false, 1, algo, 1});
        v.push_back({coll, dt, Op::kMax, 1023, 4, true, 0, algo, 3});
      }
  return v;
}

// 64M elements: a subset (each takes seconds of host reference work).
std::vector<RedParam> hugeCases() {
  const size_t k64M = 64u << 20;
  return {
      {RColl::kAllReduce, ncclFloat32, Op::kSum, k64M, 8, false, 0, nullptr, 0},
      {RColl::kAllReduce, ncclBfloat16, Op::kSum, k64M, 4, true, 0, nullptr, 0},
      {RColl::kAllReduce, ncclInt8, Op::kMax, k64M, 2, false, 0, "twoshot", 0},
      {RColl::kReduceScatter, ncclFloat16, Op::kSum, k64M / 8, 8, false, 0, nullptr, 0},
      {RColl::kReduce, ncclFloat32, Op::kAvg, k64M, 3, false, 2, nullptr, 0},
  };
}

INSTANTIATE_TEST_SUITE_P(Ops, CollReduce, ::testing::ValuesIn(unique(opCases())), nameOf);
INSTANTIATE_TEST_SUITE_P(Zero, CollReduce, ::testing::ValuesIn(unique(zeroCases())), nameOf);
INSTANTIATE_TEST_SUITE_P(Algos, CollReduce, ::testing::ValuesIn(unique(algoCases())), nameOf);
INSTANTIATE_TEST_SUITE_P(Large, CollReduce, ::testing::ValuesIn(unique(largeCases())), nameOf);
INSTANTIATE_TEST_SUITE_P(Unaligned, CollReduce, ::testing::ValuesIn(unique(unalignedCases())),
                         nameOf);
INSTANTIATE_TEST_SUITE_P(Huge, CollReduce, ::testing::ValuesIn(unique(hugeCases())), nameOf);

}  // namespace
