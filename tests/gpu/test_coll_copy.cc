// Data-movement collectives on ranks sharing GPU 0: Broadcast (and ncclBcast), AllGather,
// AlltoAll (and ncclAllToAll), Gather, Scatter; in and out of place, counts 0..64M, 1-8
// ranks, unaligned pointers. Outputs are poisoned first and compared byte for byte.
#include <algorithm>
#include <cstdint>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/test_coll_util.h"
#include "mkernel/nccl_extra.h"

using namespace colltest;

namespace colltest {
namespace {
const char* ccollName(CColl c) {
  static const char* n[] = {"Broadcast", "AllGather", "AlltoAll", "Gather",
                            "Scatter",   "Bcast",     "AllToAll"};
  return n[(int)c];
}
bool rooted(CColl c) {
  return c == CColl::kBroadcast || c == CColl::kBcast || c == CColl::kGather ||
         c == CColl::kScatter;
}

}  // namespace

std::string paramName(const CopyParam& p) {
  std::string s = std::string(ccollName(p.coll)) + "_" + dtInfo(p.dt).name + "_n" +
                  std::to_string(p.n) + "_c" + sizeName(p.count) +
                  (p.inplace ? "_inplace" : "_oop");
  if (rooted(p.coll)) s += "_root" + std::to_string(p.root);
  if (p.sendOff || p.recvOff)
    s += "_off" + std::to_string(p.sendOff) + "x" + std::to_string(p.recvOff);
  return s;
}

void runCopy(const CopyParam& p) {
  Clique& c = clique(p.n);
  ASSERT_TRUE(c.ok) << c.why;
  const std::string name = paramName(p);
  const size_t es = dtInfo(p.dt).size, cnt = p.count;
  const int n = p.n, R = p.root;
  const bool a2a = p.coll == CColl::kAlltoAll || p.coll == CColl::kAllToAll;
  const size_t sendElems = (a2a || p.coll == CColl::kScatter) ? cnt * n : cnt;
  const size_t recvElems =
      (p.coll == CColl::kAllGather || a2a || p.coll == CColl::kGather) ? cnt * n : cnt;
  uint64_t seed = mktest::testSeed();
  for (char ch : name) seed = (seed ^ (uint8_t)ch) * 1099511628211ull;
  // Inputs are random bytes: copy collectives must move any bit pattern.
  std::vector<HostBuf> in(n);
  for (int r = 0; r < n; r++) {
    fillRandom(in[r], ncclUint8, Op::kSum, sendElems * es, seed + 7919ull * r);
    in[r].size = es;
  }
  std::vector<DevBuf> bufs;
  std::vector<const void*> sp(n);
  std::vector<void*> rp(n);
  for (int r = 0; r < n; r++) {
    if (p.inplace) {
      bufs.emplace_back(std::max(sendElems, recvElems) * es + p.sendOff + 64);
      ASSERT_EQ(mktest::syncMemset(bufs.back().base, 0xCD, bufs.back().bytes), cudaSuccess);
      char* b = bufs.back().at(p.sendOff);
      switch (p.coll) {
        case CColl::kAllGather:
        case CColl::kGather:
          rp[r] = b;
          sp[r] = b + (size_t)r * cnt * es;
          break;
        case CColl::kScatter:
          sp[r] = b;
          rp[r] = b + (size_t)r * cnt * es;
          break;
        default:
          sp[r] = rp[r] = b;
      }
    } else {
      bufs.emplace_back(sendElems * es + p.sendOff + 64);
      sp[r] = bufs.back().at(p.sendOff);
      bufs.emplace_back(recvElems * es + p.recvOff + 64);
      ASSERT_EQ(mktest::syncMemset(bufs.back().base, 0xCD, bufs.back().bytes), cudaSuccess);
      rp[r] = bufs.back().at(p.recvOff);
    }
    upload((void*)sp[r], in[r], 0, sendElems);
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; r++) {
    ncclResult_t res = ncclInternalError;
    ncclComm_t comm = c.comms[r];
    cudaStream_t s = c.streams[r];
    switch (p.coll) {
      case CColl::kBroadcast:
        res = ncclBroadcast(sp[r], rp[r], cnt, p.dt, R, comm, s);
        break;
      case CColl::kBcast:
        res = ncclBcast(rp[r], cnt, p.dt, R, comm, s);
        break;
      case CColl::kAllGather:
        res = ncclAllGather(sp[r], rp[r], cnt, p.dt, comm, s);
        break;
      case CColl::kAlltoAll:
        res = ncclAlltoAll(sp[r], rp[r], cnt, p.dt, comm, s);
        break;
      case CColl::kAllToAll:
        res = ncclAllToAll(sp[r], rp[r], cnt, p.dt, comm, s);
        break;
      case CColl::kGather:
        res = ncclGather(sp[r], rp[r], cnt, p.dt, R, comm, s);
        break;
      case CColl::kScatter:
        res = ncclScatter(sp[r], rp[r], cnt, p.dt, R, comm, s);
        break;
    }
    ASSERT_EQ(res, ncclSuccess) << name << " rank " << r << ": " << ncclGetLastError(nullptr);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  std::string why;
  ASSERT_TRUE(syncClique(c, cnt > (1u << 24) ? 300 : 60, &why)) << name << ": " << why;
  const size_t B = cnt * es;
  for (int r = 0; r < n; r++) {
    if ((p.coll == CColl::kGather) && r != R) continue;
    HostBuf got;
    download(got, rp[r], recvElems, es);
    std::string e;
    switch (p.coll) {
      case CColl::kBroadcast:
      case CColl::kBcast:
        e = checkBytes(got, 0, in[R], 0, B, "broadcast data");
        break;
      case CColl::kAllGather:
      case CColl::kGather:
        for (int q = 0; q < n && e.empty(); q++)
          e = checkBytes(got, q * B, in[q], 0, B, ("block from rank " + std::to_string(q)).c_str());
        break;
      case CColl::kAlltoAll:
      case CColl::kAllToAll:
        for (int q = 0; q < n && e.empty(); q++)
          e = checkBytes(got, q * B, in[q], r * B, B,
                         ("block from rank " + std::to_string(q)).c_str());
        break;
      case CColl::kScatter:
        e = checkBytes(got, 0, in[R], r * B, B, "scattered block");
        break;
    }
    EXPECT_EQ(e, "") << name << ": rank " << r << " (seed " << mktest::testSeed() << ")";
  }
}

}  // namespace colltest

namespace {

class CollCopy : public ::testing::TestWithParam<CopyParam> {};

TEST_P(CollCopy, Matches) {
  MKTEST_REQUIRE_GPU();
  runCopy(GetParam());
}

std::string nameOf(const ::testing::TestParamInfo<CopyParam>& i) {
  return paramName(i.param);
}

// Drops cases whose name repeats (generators overlap at their edges).
std::vector<CopyParam> unique(std::vector<CopyParam> v) {
  std::set<std::string> seen;
  std::vector<CopyParam> out;
  for (const CopyParam& p : v)
    if (seen.insert(paramName(p)).second) out.push_back(p);
  return out;
}

const CColl kColls[] = {CColl::kBroadcast, CColl::kAllGather, CColl::kAlltoAll, CColl::kGather,
                        CColl::kScatter};
const size_t kMiB3 = (1u << 20) + 3;

std::vector<CopyParam> smallCases() {
  std::vector<CopyParam> v;
  for (CColl coll : kColls)
    for (ncclDataType_t dt : {ncclInt8, ncclFloat16, ncclFloat32, ncclFloat64})
      for (size_t count : {(size_t)0, (size_t)1, (size_t)7, (size_t)1023})
        for (int n : {1, 2, 3, 4, 8})
          for (bool inplace : {false, true})
            for (int root : {0, n - 1}) {
              if (!rooted(coll) && root != 0) continue;
              if (rooted(coll) && root == 0 && n > 1 && count == 1023) continue;
              v.push_back({coll, dt, count, n, inplace, root, 0, 0});
            }
  // Every dtype at least once; the API aliases.
  for (ncclDataType_t dt : kAllTypes)
    for (CColl coll : kColls) v.push_back({coll, dt, 1023, 3, false, 1, 0, 0});
  for (int n : {1, 2, 4}) {
    v.push_back({CColl::kBcast, ncclFloat32, 1023, n, true, n - 1, 0, 0});
    v.push_back({CColl::kAllToAll, ncclInt32, 1023, n, false, 0, 0, 0});
  }
  return v;
}

std::vector<CopyParam> largeCases() {
  std::vector<CopyParam> v;
  for (CColl coll : kColls)
    for (ncclDataType_t dt : {ncclInt8, ncclFloat32})
      for (int n : {1, 2, 3, 4, 8}) v.push_back({coll, dt, kMiB3, n, n == 4, n - 1, 0, 0});
  return v;
}

// Pointers not 16-byte aligned (and misaligned with respect to each other).
std::vector<CopyParam> unalignedCases() {
  std::vector<CopyParam> v;
  for (CColl coll : kColls)
    for (ncclDataType_t dt : {ncclInt8, ncclFloat16, ncclFloat32})
      for (int n : {2, 3}) {
        int es = (int)dtInfo(dt).size;
        v.push_back({coll, dt, 100003, n, false, n - 1, es, 3 * es});
        v.push_back({coll, dt, 1023, n, true, 0, 5 * es, 0});
        v.push_back({coll, dt, 4097, n, false, 0, 8, 8});
      }
  return v;
}

std::vector<CopyParam> hugeCases() {
  const size_t k64M = 64u << 20;
  return {
      {CColl::kAllGather, ncclInt8, k64M, 8, false, 0, 0, 0},
      {CColl::kBroadcast, ncclFloat32, k64M, 4, false, 3, 0, 0},
      {CColl::kAlltoAll, ncclInt8, k64M / 8, 8, false, 0, 0, 0},
      {CColl::kGather, ncclFloat16, k64M, 2, true, 1, 0, 0},
      {CColl::kScatter, ncclInt8, k64M, 3, false, 0, 0, 0},
  };
}

INSTANTIATE_TEST_SUITE_P(Small, CollCopy, ::testing::ValuesIn(unique(smallCases())), nameOf);
INSTANTIATE_TEST_SUITE_P(Large, CollCopy, ::testing::ValuesIn(unique(largeCases())), nameOf);
INSTANTIATE_TEST_SUITE_P(Unaligned, CollCopy, ::testing::ValuesIn(unique(unalignedCases())),
                         nameOf);
INSTANTIATE_TEST_SUITE_P(Huge, CollCopy, ::testing::ValuesIn(unique(hugeCases())), nameOf);

}  // namespace
