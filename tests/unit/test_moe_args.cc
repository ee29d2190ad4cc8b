// Argument rules of ncclMoeDispatchGemm (include/mkernel/fused.h), checked on the CPU by
// moeCheck: every refusal names its rule, valid calls pass, and the config's defaults are
// resolved (outType = inType).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fused/ops/moe/moe.h"
#include "mkernel/fused.h"

namespace {

using mk::fused::MoeCall;

// Fake, 256-byte aligned addresses far apart: the checks never dereference them.
template <typename T = void>
T* addr(uintptr_t i) {
  return reinterpret_cast<T*>((i + 1) << 32);
}

MoeCall valid() {
  MoeCall c;
  c.x = addr(1);
  c.topkIdx = addr<const int32_t>(2);
  c.topkWeights = addr<const float>(3);
  c.w1 = addr(4);
  c.recv = ncclMoeRecv_t{addr(5),      addr(6),         addr<int>(7), addr<int>(8),
                         addr<int>(9), addr<float>(10), 4096};
  c.T = 300;
  c.H = 128;
  c.N = 256;
  c.E = 16;
  c.k = 4;
  return c;
}

std::string check(MoeCall c, const ncclMoeConfig_t* cfg = nullptr, int n = 4) {
  const ncclResult_t res = mk::fused::moeCheck(&c, cfg, n);
  if (res == ncclSuccess) return "";
  EXPECT_EQ(res, ncclInvalidArgument);
  return std::string("refused: ") + ncclGetLastError(nullptr);
}

TEST(MoeArgs, ValidCallsPassAndDefaultsResolve) {
  MoeCall c = valid();
  ASSERT_EQ(mk::fused::moeCheck(&c, nullptr, 4), ncclSuccess);
  EXPECT_EQ(c.cfg.outType, ncclBfloat16);
  EXPECT_EQ(c.cfg.wLayout, ncclFusedLayoutNK);
  c = valid();
  c.inType = ncclFloat16;
  ncclMoeConfig_t cfg = NCCL_MOE_CONFIG_INITIALIZER;
  cfg.outType = ncclFloat32;
  cfg.wLayout = ncclFusedLayoutKN;
  ASSERT_EQ(mk::fused::moeCheck(&c, &cfg, 4), ncclSuccess);
  EXPECT_EQ(c.cfg.outType, ncclFloat32);
  MoeCall none = valid();  // a rank without tokens still takes part
  none.T = 0;
  none.x = nullptr;
  none.topkIdx = nullptr;
  none.topkWeights = nullptr;
  none.recv.rowWeight = nullptr;
  EXPECT_EQ(check(none), "");
  MoeCall opt = valid();  // rowSource and rowWeight are optional
  opt.recv.rowSource = nullptr;
  opt.recv.rowWeight = nullptr;
  EXPECT_EQ(check(opt), "");
}

TEST(MoeArgs, EveryRuleRefusedWithItsMessage) {
  struct Rule {
    const char* what;
    std::function<void(MoeCall&, ncclMoeConfig_t&)> breakIt;
  };
  const std::vector<Rule> rules = {
      {"inType", [](MoeCall& c, ncclMoeConfig_t&) { c.inType = ncclFloat32; }},
      {"magic", [](MoeCall&, ncclMoeConfig_t& f) { f.magic = 1; }},
      {"version", [](MoeCall&, ncclMoeConfig_t& f) { f.version = 99; }},
      {"size", [](MoeCall&, ncclMoeConfig_t& f) { f.size = 8; }},
      {"wLayout", [](MoeCall&, ncclMoeConfig_t& f) { f.wLayout = 7; }},
      {"algo", [](MoeCall&, ncclMoeConfig_t& f) { f.algo = 9; }},
      {"commSms", [](MoeCall&, ncclMoeConfig_t& f) { f.commSms = 0; }},
      {"outType", [](MoeCall&, ncclMoeConfig_t& f) { f.outType = ncclInt8; }},
      {"experts", [](MoeCall& c, ncclMoeConfig_t&) { c.E = 0; }},
      {"experts", [](MoeCall& c, ncclMoeConfig_t&) { c.E = NCCL_MOE_MAX_EXPERTS + 4; }},
      {"multiple of nranks", [](MoeCall& c, ncclMoeConfig_t&) { c.E = 18; }},
      {"topk", [](MoeCall& c, ncclMoeConfig_t&) { c.k = 0; }},
      {"topk", [](MoeCall& c, ncclMoeConfig_t&) { c.k = NCCL_MOE_MAX_TOPK + 1; }},
      {"hidden", [](MoeCall& c, ncclMoeConfig_t&) { c.H = 100; }},
      {"hidden", [](MoeCall& c, ncclMoeConfig_t&) { c.N = 0; }},
      {"multiple of 8 with w1",
       [](MoeCall& c, ncclMoeConfig_t& f) {
         f.wLayout = ncclFusedLayoutKN;
         c.N = 100;
       }},
      {"maxRows", [](MoeCall& c, ncclMoeConfig_t&) { c.recv.maxRows = 0; }},
      {"x and topkIdx", [](MoeCall& c, ncclMoeConfig_t&) { c.topkIdx = nullptr; }},
      {"must not be NULL", [](MoeCall& c, ncclMoeConfig_t&) { c.recv.y = nullptr; }},
      {"must not be NULL", [](MoeCall& c, ncclMoeConfig_t&) { c.recv.expertOffset = nullptr; }},
      {"needs topkWeights", [](MoeCall& c, ncclMoeConfig_t&) { c.topkWeights = nullptr; }},
      {"16-byte aligned",
       [](MoeCall& c, ncclMoeConfig_t&) { c.x = static_cast<const char*>(c.x) + 8; }},
      {"4-byte aligned",
       [](MoeCall& c, ncclMoeConfig_t&) {
         c.recv.rowWeight = reinterpret_cast<float*>(reinterpret_cast<char*>(c.recv.rowWeight) + 2);
       }},
  };
  for (const Rule& r : rules) {
    MoeCall c = valid();
    ncclMoeConfig_t cfg = NCCL_MOE_CONFIG_INITIALIZER;
    r.breakIt(c, cfg);
    const std::string got = check(c, &cfg);
    EXPECT_NE(got.find(r.what), std::string::npos) << r.what << ": " << got;
    EXPECT_NE(got.find("ncclMoeDispatchGemm"), std::string::npos) << got;
  }
}

}  // namespace
