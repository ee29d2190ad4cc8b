// The parameters every rank of a comm must share (comm/agreed.h): each rank's values as read
// from its environment, compared the way init compares them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/param.h"
#include "api/agreed.h"
#include "common/test_util.h"

using mktest::ScopedEnv;

namespace {

// The RankInfo a rank with `var`=`value` (unset when null) would send.
constexpr int kRanks = 4;  // the comm size the values are read for

mk::RankInfo rankWith(const char* var, const char* value) {
  mk::RankInfo r{};
  ScopedEnv e(var, value);  // resets the cached parameters both ways
  mk::agreedParamsFill(kRanks, r.agreed);
  return r;
}

// Whether two ranks with these settings of `var` pass the check.
bool agree(const char* var, const char* a, const char* b) {
  std::vector<mk::RankInfo> v = {rankWith(var, a), rankWith(var, b)};
  std::string why;
  return mk::agreedParamsCheck(v, 0, &why) == ncclSuccess;
}

}  // namespace

TEST(AgreedParams, EqualSettingsPass) {
  std::vector<mk::RankInfo> v = {rankWith("MKERNEL_MOE_NODE_DEDUP", "1"),
                                 rankWith("MKERNEL_MOE_NODE_DEDUP", "1"),
                                 rankWith("MKERNEL_MOE_NODE_DEDUP", "1")};
  std::string why;
  for (int r = 0; r < 3; ++r) EXPECT_EQ(mk::agreedParamsCheck(v, r, &why), ncclSuccess) << why;
  // Unset and set to the default read the same value.
  v[1] = rankWith("MKERNEL_MOE_NODE_DEDUP", nullptr);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(mk::agreedParamsCheck(v, r, &why), ncclSuccess) << why;
}

TEST(AgreedParams, EveryRankRefusesAMismatchAndNamesIt) {
  for (const char* var : {"MKERNEL_EMULATE_NODES", "MKERNEL_REG_ZERO_COPY", "MKERNEL_FUSED_AUTO",
                          "MKERNEL_MOE_NODE_DEDUP", "MKERNEL_FUSED_XNODE",
                          "MKERNEL_RING_SEQ_DIRECT", "MKERNEL_MOE_SWIGLU_EPILOGUE"}) {
    // 0 and 1 virtual nodes are the same map (none): 2 against 3 differ.
    const bool nodes = std::string(var) == "MKERNEL_EMULATE_NODES";
    const char* a = nodes ? "2" : "0";
    const char* b = nodes ? "3" : "1";
    std::vector<mk::RankInfo> v = {rankWith(var, a), rankWith(var, a), rankWith(var, b),
                                   rankWith(var, a)};
    for (int r = 0; r < 4; ++r) {
      std::string why;
      EXPECT_EQ(mk::agreedParamsCheck(v, r, &why), ncclInvalidUsage) << var << " rank " << r;
      EXPECT_NE(why.find(var), std::string::npos) << why;
      // The message names a rank on the other side.
      EXPECT_NE(why.find(r == 2 ? "rank 0" : "rank 2"), std::string::npos) << why;
    }
  }
}

TEST(AgreedParams, StringsCompareWithoutCase) {
  std::vector<mk::RankInfo> v = {rankWith("MKERNEL_ALGO", "Ring"),
                                 rankWith("MKERNEL_ALGO", "ring")};
  std::string why;
  EXPECT_EQ(mk::agreedParamsCheck(v, 0, &why), ncclSuccess) << why;
  v[1] = rankWith("MKERNEL_ALGO", "oneshot");
  // The message quotes this process's own setting (init checks in the process that filled it).
  ScopedEnv mine("MKERNEL_ALGO", "Ring");
  EXPECT_EQ(mk::agreedParamsCheck(v, 0, &why), ncclInvalidUsage);
  EXPECT_NE(why.find("MKERNEL_ALGO"), std::string::npos) << why;
  EXPECT_NE(why.find("\"Ring\""), std::string::npos) << why;  // this rank's own text
  // Automatic ("") differs from a forced algorithm.
  v[1] = rankWith("MKERNEL_ALGO", nullptr);
  EXPECT_EQ(mk::agreedParamsCheck(v, 0, &why), ncclInvalidUsage);
}

TEST(AgreedParams, OtherParametersMayDiffer) {
  std::vector<mk::RankInfo> v = {rankWith("MKERNEL_TIMEOUT_MS", "1000"),
                                 rankWith("MKERNEL_TIMEOUT_MS", "5000")};
  std::string why;
  EXPECT_EQ(mk::agreedParamsCheck(v, 0, &why), ncclSuccess) << why;
}

// What the library does alike is never refused: the values compared are the effective ones.
TEST(AgreedParams, EqualBehaviourAgreesWhateverTheSpelling) {
  EXPECT_TRUE(agree("MKERNEL_ALGO", "one-shot", "oneshot"));
  EXPECT_TRUE(agree("MKERNEL_ALGO", "Zero_Copy", "zerocopy"));
  EXPECT_TRUE(agree("MKERNEL_ALGO", "auto", nullptr));
  EXPECT_TRUE(agree("MKERNEL_ALGO", "nonsense", ""));  // unknown: automatic, with a warning
  EXPECT_FALSE(agree("MKERNEL_ALGO", "twoshot", "ring"));
  EXPECT_TRUE(agree("MKERNEL_EMULATE_NODES", "0", "1"));  // both: no virtual nodes
  EXPECT_TRUE(agree("MKERNEL_EMULATE_NODES", "4", "9"));  // both capped at the 4 ranks
  EXPECT_FALSE(agree("MKERNEL_EMULATE_NODES", "2", "4"));
  EXPECT_FALSE(agree("MKERNEL_EMULATE_NODES", "1", "2"));
}
