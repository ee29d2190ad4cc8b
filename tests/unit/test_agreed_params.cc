// The parameters every rank of a comm must share (comm/agreed.h): each rank's values as read
// from its environment, compared the way init compares them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/param.h"
#include "comm/agreed.h"
#include "common/test_util.h"

using mktest::ScopedEnv;

namespace {

// The RankInfo a rank with `var`=`value` (unset when null) would send.
mk::RankInfo rankWith(const char* var, const char* value) {
  mk::RankInfo r{};
  ScopedEnv e(var, value);  // resets the cached parameters both ways
  mk::agreedParamsFill(r.agreed);
  return r;
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
                          "MKERNEL_MOE_NODE_DEDUP"}) {
    std::vector<mk::RankInfo> v = {rankWith(var, "0"), rankWith(var, "0"), rankWith(var, "1"),
                                   rankWith(var, "0")};
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
