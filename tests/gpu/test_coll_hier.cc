// Hierarchical AllReduce across virtual nodes of equal size (MKERNEL_EMULATE_NODES): nodes x local
// ranks sharing GPU 0, one thread driving every rank in a group. Every element is checked against
// a double-precision reference (exact for integers) and every rank's result must be
// bit-identical to rank 0's.
#include <cstdint>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/test_coll_util.h"
#include "gpu/test_devcomm_util.h"

using namespace colltest;

namespace {

void runHier(dctest::VnodeComms& h, ncclDataType_t dt, Op op, size_t count, bool inplace,
             uint64_t seed) {
  const int n = h.n;
  const size_t es = dtInfo(dt).size;
  SCOPED_TRACE(std::string(dtInfo(dt).name) + " " + opName(op) + " count " + std::to_string(count) +
               (inplace ? " in-place" : " out-of-place"));
  std::vector<HostBuf> in(n);
  std::vector<DevBuf> sendb, recvb;
  const size_t bytes = (count ? count : 1) * es;
  for (int r = 0; r < n; r++) {
    fillRandom(in[r], dt, op, count, seed + r);
    sendb.emplace_back(bytes);
    recvb.emplace_back(bytes);
    mktest::syncMemset(recvb[r].base, 0xA5, bytes);  // poison
    if (count) upload(sendb[r].base, in[r], 0, count);
  }
  // PreMulSum: every rank its own scalar (as nccl-tests does).
  std::vector<uint64_t> scalars(n);
  for (int r = 0; r < n; r++) scalars[r] = scalarFor(dt, seed + 7919 * r);
  std::vector<ncclRedOp_t> ops(n, builtinOp(op));
  if (op == Op::kPreMulHost) {
    for (int r = 0; r < n; r++) {
      uint64_t s = scalars[r];
      ASSERT_EQ(ncclRedOpCreatePreMulSum(&ops[r], &s, dt, ncclScalarHostImmediate, h.comms[r]),
                ncclSuccess);
    }
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; r++) {
    void* dst = inplace ? sendb[r].base : recvb[r].base;
    ASSERT_EQ(ncclAllReduce(sendb[r].base, dst, count, dt, ops[r], h.comms[r], h.streams[r]),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  std::string err = h.sync();
  ASSERT_EQ(err, "");
  if (op == Op::kPreMulHost)
    for (int r = 0; r < n; r++) ncclRedOpDestroy(ops[r], h.comms[r]);
  if (count == 0) return;
  std::vector<const HostBuf*> inp;
  for (auto& b : in) inp.push_back(&b);
  HostBuf first;
  for (int r = 0; r < n; r++) {
    HostBuf got;
    download(got, inplace ? sendb[r].base : recvb[r].base, count, es);
    std::string bad = checkReduction(dt, op, inp, 0, got, count, scalars);
    ASSERT_EQ(bad, "") << "rank " << r;
    if (r == 0)
      first = got;
    else
      ASSERT_TRUE(got.bytes == first.bytes) << "rank " << r << " differs from rank 0";
  }
}

struct Shape {
  int nodes, local;
};

class HierAllReduce : public ::testing::TestWithParam<Shape> {};

TEST_P(HierAllReduce, DtypesOpsCounts) {
  MKTEST_REQUIRE_GPU();
  const Shape s = GetParam();
  dctest::VnodeComms h;
  ASSERT_EQ(h.init(s.nodes, s.nodes * s.local), ncclSuccess);
  const uint64_t seed = mktest::testSeed();
  const ncclDataType_t types[] = {ncclFloat32, ncclInt32, ncclBfloat16,
                                  ncclFloat64, ncclUint8, ncclFloat8e4m3};
  const Op opsList[] = {Op::kSum, Op::kMax, Op::kAvg, Op::kPreMulHost};
  for (ncclDataType_t dt : types)
    for (Op op : opsList)
      for (size_t count : {size_t(0), size_t(1), size_t(1023)})
        for (bool inplace : {false, true}) runHier(h, dt, op, count, inplace, seed);
  for (ncclDataType_t dt : {ncclFloat32, ncclInt64})
    for (bool inplace : {false, true}) runHier(h, dt, Op::kSum, (1u << 20) + 3, inplace, seed + 7);
  runHier(h, ncclFloat16, Op::kProd, (1u << 20) + 3, false, seed + 9);
  // PreMulSum, a scalar per rank, several chunks (each segment staged pre-scaled).
  for (ncclDataType_t dt : {ncclFloat32, ncclBfloat16, ncclInt32})
    for (bool inplace : {false, true})
      runHier(h, dt, Op::kPreMulHost, (1u << 20) + 3, inplace, seed + 11);
}

INSTANTIATE_TEST_SUITE_P(Shapes, HierAllReduce,
                         ::testing::Values(Shape{2, 2}, Shape{2, 4}, Shape{4, 2}),
                         [](const ::testing::TestParamInfo<Shape>& i) {
                           return std::to_string(i.param.nodes) + "x" +
                                  std::to_string(i.param.local);
                         });

// AllReduce on uneven nodes (flat forms) and every other operation: test_coll_hier_ops.cc.

}  // namespace
