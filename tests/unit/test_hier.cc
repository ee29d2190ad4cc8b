// Host logic of the hierarchical AllReduce: topology check, window areas, segments.
#include <gtest/gtest.h>

#include <vector>

#include "coll/hier.h"

namespace {

TEST(HierTopo, EqualNodesAccepted) {
  std::vector<int> s{4, 4};
  EXPECT_EQ(mk::hierTopoProblem(2, s.data()), "");
  std::vector<int> t{2, 2, 2, 2};
  EXPECT_EQ(mk::hierTopoProblem(4, t.data()), "");
  std::vector<int> u{1, 1, 1};
  EXPECT_EQ(mk::hierTopoProblem(3, u.data()), "");
}

TEST(HierTopo, UnevenNodesRefused) {
  std::vector<int> s{3, 2};
  std::string why = mk::hierTopoProblem(2, s.data());
  EXPECT_NE(why.find("uneven nodes: flat ring not implemented yet"), std::string::npos) << why;
  EXPECT_NE(why.find("node 1 has 2"), std::string::npos) << why;
  std::vector<int> big(2, mk::kHierMaxLocal + 1);
  why = mk::hierTopoProblem(2, big.data());
  EXPECT_NE(why.find("uneven nodes: flat ring not implemented yet"), std::string::npos) << why;
  std::vector<int> one{4};
  EXPECT_NE(mk::hierTopoProblem(1, one.data()), "");
}

TEST(HierStride, FitsWindow) {
  const uint64_t w = 1 << 20;
  for (int nl : {1, 2, 4, 8}) {
    for (int nn : {2, 3, 4, 16}) {
      for (size_t es : {1, 2, 4, 8}) {
        uint64_t s = mk::hierStride(w, nl, nn, es);
        ASSERT_GT(s, 0u);
        EXPECT_EQ(s % 256, 0u);
        EXPECT_LE(mk::hierRailOff(s, nl, nn - 1) + s, w);
        EXPECT_LE(mk::hierAgOff(s, nl, nl - 1) + s, mk::hierRailOff(s, nl, 0));
        EXPECT_LE(mk::hierRsOff(s, nl, nl - 1) + s, mk::hierAgOff(s, nl, 0));
      }
    }
  }
  EXPECT_EQ(mk::hierStride(100, 2, 2, 4), 0u);
}

TEST(HierSegment, CoversChunkOnceAndFitsStride) {
  const uint64_t w = 64 << 10;
  for (int nl : {1, 2, 3, 4, 8}) {
    for (size_t es : {1, 2, 4, 8}) {
      const uint64_t stride = mk::hierStride(w, nl, 2, es);
      const uint64_t chunk = (uint64_t)nl * (stride / es);
      for (uint64_t n : {uint64_t(1), uint64_t(7), uint64_t(1023), chunk - 1, chunk}) {
        uint64_t next = 0;
        for (int j = 0; j < nl; j++) {
          uint64_t off, len;
          mk::hierSegment(n, nl, es, j, &off, &len);
          EXPECT_EQ(off, next) << "nl " << nl << " es " << es << " n " << n << " j " << j;
          EXPECT_LE(len * es, stride);
          next = off + len;
        }
        EXPECT_EQ(next, n);
      }
    }
  }
}

TEST(HierSignals, SlotsDisjoint) {
  EXPECT_LT(mk::kHierSigSeq, mk::kHierSigRS);
  EXPECT_EQ(mk::kHierSigAG, mk::kHierSigRS + mk::kHierMaxLocal);
  EXPECT_EQ(mk::kHierSigAckL, mk::kHierSigAG + mk::kHierMaxLocal);
  EXPECT_EQ(mk::kHierSigRail, mk::kHierSigAckL + mk::kHierMaxLocal);
  EXPECT_EQ(mk::kHierSigAckN, mk::kHierSigRail + mk::kHierMaxNodes);
  EXPECT_LE(mk::kHierSigEnd, mk::kNetSignals);
}

}  // namespace
