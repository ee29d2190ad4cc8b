// The test matrix of the fused GEMM + collective calls, part 3: comms spanning virtual nodes
// (MKERNEL_EMULATE_NODES, socket backend on loopback, as test_coll_hier*.cc), ranks sharing
// GPU 0, one thread driving them. Every ncclFusedAuto call takes the sequential path here
// (engine GEMM, then the hierarchical collective); ncclFusedFused calls run the fused
// kernel's xnode layout where its rules allow (fused/ops/gemm_coll/xnode.h: AllGatherGemm,
// GemmReduceScatter, GemmAllReduce with M % n == 0; its own tests, which assert that it ran,
// are in test_fused_xnode.cu), the sequential path otherwise. Both algos are run.
//
// Layouts: 2x2, 2x4, 3x1, and the uneven splits MKERNEL_EMULATE_NODES can express (nodes of
// consecutive ranks, node(r) = r * k / n, larger nodes first): 2+1 (3 ranks, k = 2), 3+2
// (5 ranks, k = 2), 2+1+1 (4 ranks, k = 3). A 3+1 split of 4 ranks is not expressible (4
// ranks over 2 nodes are always 2+2), so 3+2 and 2+1 stand for "uneven".
// On 2x2 also: 50 graph replays with new inputs per call, and 200 random fused calls mixed
// with collectives on the one comm.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/test_devcomm_util.h"
#include "gpu/test_fused_util.cuh"

namespace {

using fusedtest::Case;
using fusedtest::Problem;

using Vnodes = dctest::FusedVnodes;

struct Layout {
  int nodes, n;
  const char* name;
};

class FusedMatrixVnodes : public ::testing::TestWithParam<Layout> {};

// Every call x algo auto/fused x shapes with tails in M, N, K (N % 4 != 0 too), both B
// layouts, every output type, bias on and off, AllGatherGemm in place and with Agathered
// NULL once each.
TEST_P(FusedMatrixVnodes, EveryCall) {
  MKTEST_REQUIRE_GPU();
  const Layout& l = GetParam();
  Vnodes v(l.nodes, l.n);
  ASSERT_TRUE(v.ok()) << v.why;
  const int n = l.n;
  struct Shape {
    int rowsPerRank, N, K;
  };
  const Shape shapes[] = {{64, 256, 128}, {37, 136, 72}, {24, 130, 40}};
  const ncclDataType_t outs[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
  const uint64_t seed = mktest::testSeed() ^ (0x70de5ull * l.n + l.nodes);
  int idx = 0;
  for (int op = 0; op < 3; ++op) {
    for (int si = 0; si < 3; ++si) {
      for (int algo : {ncclFusedAuto, ncclFusedFused}) {
        const Shape& s = shapes[si];
        Case c{op, n, s.rowsPerRank * n, s.N, s.K, 0, ncclBfloat16, ncclBfloat16, false, algo};
        c.layout = s.N % 8 == 0 ? (si + op + algo) % 2 : ncclFusedLayoutNK;
        c.in = (si + algo) % 2 ? ncclFloat16 : ncclBfloat16;
        c.out = outs[(si + op + algo) % 3];
        c.bias = (si + op + algo) % 2 == 0;
        c.inplace = op == fusedtest::kAllGather && si == 1 && algo == ncclFusedAuto;
        c.noGathered = op == fusedtest::kAllGather && si == 2 && algo == ncclFusedFused;
        Problem p(c);
        const std::string err = fusedtest::runDriven(p, v.comms, v.streams, seed + idx++);
        if (!err.empty()) v.abortAll();
        ASSERT_EQ(err, "") << l.name << " " << name(c);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FusedMatrix, FusedMatrixVnodes,
                         ::testing::Values(Layout{2, 4, "2x2"}, Layout{2, 8, "2x4"},
                                           Layout{3, 3, "3x1"}, Layout{2, 3, "uneven_2p1"},
                                           Layout{2, 5, "uneven_3p2"},
                                           Layout{3, 4, "uneven_2p1p1"}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return std::string(i.param.name);
                         });

// 2x2: each call captured once per rank stream and replayed 50 times with new inputs (the
// hierarchical collectives' device-resident counters and the proxy across replays).
TEST(FusedMatrixVnodesGraph, ReplaysWithNewInputs2x2) {
  MKTEST_REQUIRE_GPU();
  Vnodes v(2, 4);
  ASSERT_TRUE(v.ok()) << v.why;
  const uint64_t seed = mktest::testSeed() ^ 0x96a9;
  for (int op = 0; op < 3; ++op) {
    const ncclDataType_t out = op == 2 ? ncclFloat32 : ncclBfloat16;
    const int algo = op == 1 ? ncclFusedFused : ncclFusedAuto;
    Case c{op, 4, 4 * 40, 136, 72, op % 2, ncclBfloat16, out, op != 1, algo};
    Problem p(c);
    const std::string err = fusedtest::runDriven(p, v.comms, v.streams, seed + op, true, 50);
    if (!err.empty()) v.abortAll();
    ASSERT_EQ(err, "") << name(c);
  }
}

// 2x2: 200 random fused calls mixed with collectives on one comm; the seed is printed.
TEST(FusedMatrixVnodesRandom, MixedWithCollectives2x2) {
  MKTEST_REQUIRE_GPU();
  Vnodes v(2, 4);
  ASSERT_TRUE(v.ok()) << v.why;
  const uint64_t seed = mktest::testSeed() ^ 0x2b2;
  printf("[FusedMatrixVnodesRandom] seed %llu (MKTEST_SEED=%llu repeats it)\n",
         (unsigned long long)seed, (unsigned long long)mktest::testSeed());
  int colls = 0;
  const std::string err = fusedtest::runRandomMix(
      v.comms, v.streams, seed, 200, 25, [&] { v.abortAll(); }, &colls);
  ASSERT_EQ(err, "");
  printf("[FusedMatrixVnodesRandom] 200 fused calls and %d collectives checked\n", colls);
}

}  // namespace
