// Argument rules of ncclMoeDispatchGemm and ncclMoeDispatchFfnCombine (include/mkernel/fused.h),
// checked on the CPU by moeCheck: every refusal names its rule, valid calls pass, and the
// config's defaults are resolved (outType = inType).
#include <gtest/gtest.h>

#include <algorithm>
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

// The most local experts the header allows (E / nranks == NCCL_MOE_MAX_LOCAL_EXPERTS); one more
// is refused, which only fewer than 4 ranks can ask for (E <= 1024).
TEST(MoeArgs, MostLocalExpertsPass) {
  MoeCall c = valid();
  c.E = 4 * NCCL_MOE_MAX_LOCAL_EXPERTS;
  EXPECT_EQ(check(c), "");
  c.E = NCCL_MOE_MAX_LOCAL_EXPERTS;
  EXPECT_EQ(check(c, nullptr, 1), "");
  c.E = NCCL_MOE_MAX_LOCAL_EXPERTS + 1;
  EXPECT_NE(check(c, nullptr, 1).find("NCCL_MOE_MAX_LOCAL_EXPERTS"), std::string::npos);
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

// ncclMoeDispatchFfnCombine as its API entry (src/api/api_fused.cc) hands it to moeCheck: the
// dispatch and GEMM1 see buf as a recv layout whose y is buf->h, without rowSource/rowWeight,
// and N = 2 * inter.
void deriveRecv(MoeCall& c) {
  c.recv = ncclMoeRecv_t{c.buf.xRecv, c.buf.h, c.buf.expertCount, c.buf.expertOffset,
                         nullptr,     nullptr, c.buf.maxRows};
  c.N = 2 * c.I;
}

// p moved by `bytes` (to break an alignment rule).
template <typename T>
T* shift(T* p, int bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + bytes);
}

MoeCall validFfn() {
  MoeCall c = valid();
  c.ffn = true;
  c.w2 = addr(11);
  c.yOut = addr(12);
  c.I = 64;
  c.buf = ncclMoeFfnBuffers_t{addr(13),     addr(14),     addr(15), addr<float>(16),
                              addr<int>(7), addr<int>(8), 4096};
  deriveRecv(c);
  return c;
}

TEST(MoeArgs, FfnValidCallsPass) {
  MoeCall c = validFfn();
  ASSERT_EQ(mk::fused::moeCheck(&c, nullptr, 4), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(c.cfg.outType, ncclBfloat16);
  c = validFfn();
  c.inType = ncclFloat16;
  ncclMoeConfig_t cfg = NCCL_MOE_CONFIG_INITIALIZER;
  cfg.outType = ncclFloat32;
  cfg.wLayout = ncclFusedLayoutKN;
  ASSERT_EQ(mk::fused::moeCheck(&c, &cfg, 4), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(c.cfg.outType, ncclFloat32);
  MoeCall none = validFfn();  // a rank without tokens takes part in the exchange and combine
  none.T = 0;
  none.x = nullptr;
  none.topkIdx = nullptr;
  none.topkWeights = nullptr;
  none.yOut = nullptr;  // no token, no output row
  EXPECT_EQ(check(none), "");
  for (size_t inter : {size_t(8), size_t(24), (size_t(1) << 30) - 8}) {
    MoeCall i = validFfn();
    i.I = inter;
    deriveRecv(i);
    EXPECT_EQ(check(i), "") << "inter=" << inter;
  }
}

TEST(MoeArgs, FfnEveryRuleRefusedWithItsMessage) {
  struct Rule {
    const char* what;
    std::function<void(MoeCall&, ncclMoeConfig_t&)> breakIt;
  };
  const std::vector<Rule> rules = {
      {"inter=36", [](MoeCall& c, ncclMoeConfig_t&) { c.I = 36; }},
      {"inter=12",
       [](MoeCall& c, ncclMoeConfig_t& f) {
         f.wLayout = ncclFusedLayoutKN;  // N = 24 passes the KN rule: inter's own rule refuses
         c.I = 12;
       }},
      {"buf->act and buf->out must not be NULL",
       [](MoeCall& c, ncclMoeConfig_t&) { c.w2 = nullptr; }},
      {"buf->act and buf->out must not be NULL",
       [](MoeCall& c, ncclMoeConfig_t&) { c.yOut = nullptr; }},
      {"buf->act and buf->out must not be NULL",
       [](MoeCall& c, ncclMoeConfig_t&) { c.buf.act = nullptr; }},
      {"buf->act and buf->out must not be NULL",
       [](MoeCall& c, ncclMoeConfig_t&) { c.buf.out = nullptr; }},
      {"topkWeights must not be NULL",
       [](MoeCall& c, ncclMoeConfig_t&) { c.topkWeights = nullptr; }},
      {"w2, y, buf->act and buf->out must be 16-byte aligned",
       [](MoeCall& c, ncclMoeConfig_t&) { c.w2 = shift(c.w2, 8); }},
      {"w2, y, buf->act and buf->out must be 16-byte aligned",
       [](MoeCall& c, ncclMoeConfig_t&) { c.yOut = shift(c.yOut, 8); }},
      {"w2, y, buf->act and buf->out must be 16-byte aligned",
       [](MoeCall& c, ncclMoeConfig_t&) { c.buf.act = shift(c.buf.act, 2); }},
      {"w2, y, buf->act and buf->out must be 16-byte aligned",
       [](MoeCall& c, ncclMoeConfig_t&) { c.buf.out = shift(c.buf.out, 4); }},
      // The rules shared with ncclMoeDispatchGemm name the buffers by their ffn names.
      {"buf->h", [](MoeCall& c, ncclMoeConfig_t&) { c.buf.h = nullptr; }},
      {"buf->xRecv", [](MoeCall& c, ncclMoeConfig_t&) { c.buf.xRecv = nullptr; }},
      {"buf->expertCount", [](MoeCall& c, ncclMoeConfig_t&) { c.buf.expertCount = nullptr; }},
      {"buf->xRecv and buf->h must be 16-byte aligned",
       [](MoeCall& c, ncclMoeConfig_t&) { c.buf.h = shift(c.buf.h, 8); }},
      {"the buf arrays must be 4-byte aligned",
       [](MoeCall& c, ncclMoeConfig_t&) { c.buf.expertOffset = shift(c.buf.expertOffset, 2); }},
      {"buf->maxRows=0", [](MoeCall& c, ncclMoeConfig_t&) { c.buf.maxRows = 0; }},
      {"experts=18 must be a multiple of nranks", [](MoeCall& c, ncclMoeConfig_t&) { c.E = 18; }},
  };
  for (const Rule& r : rules) {
    MoeCall c = validFfn();
    ncclMoeConfig_t cfg = NCCL_MOE_CONFIG_INITIALIZER;
    r.breakIt(c, cfg);
    deriveRecv(c);
    const std::string got = check(c, &cfg);
    EXPECT_NE(got.find(r.what), std::string::npos) << r.what << ": " << got;
    EXPECT_NE(got.find("ncclMoeDispatchFfnCombine"), std::string::npos) << got;
    EXPECT_EQ(got.find("recv"), std::string::npos) << "names the other API's buffers: " << got;
  }
  // inter = 0 makes N = 0: refused by the shared size rule before inter's own (its message
  // names n, the GEMM1 width).
  MoeCall zero = validFfn();
  zero.I = 0;
  deriveRecv(zero);
  const std::string got = check(zero);
  EXPECT_NE(got.find("ncclMoeDispatchFfnCombine"), std::string::npos) << got;
}

}  // namespace

namespace {

// The fused kernel's split (fused_moe.cu): every budget leaves at least one CTA to each role,
// a forced commSms is honoured up to that, and the automatic split gives the dispatch at most
// half the CTAs and no more CTAs than its warps have slots to copy.
TEST(MoeFusedSplit, EachRoleKeepsACta) {
  MoeCall c = valid();
  c.cfg = NCCL_MOE_CONFIG_INITIALIZER;
  for (int budget : {2, 3, 16, 33, 132}) {
    for (int sms : {-1, 1, 5, 1000}) {
      c.cfg.commSms = sms;
      const int d = mk::fused::moeFusedDispatchCtas(c, budget);
      EXPECT_GE(d, 1) << "budget " << budget << " commSms " << sms;
      EXPECT_LE(d, budget - 1) << "budget " << budget << " commSms " << sms;
      if (sms >= 1) EXPECT_EQ(d, std::min(sms, budget - 1)) << "budget " << budget;
      if (sms < 0) EXPECT_LE(d, std::max(1, budget / 2)) << "budget " << budget;
    }
  }
  // 300 tokens x 4 slots = 1200 slots = 100 CTAs' warps (12 a CTA) at most.
  c.cfg.commSms = -1;
  c.N = 8;  // a GEMM so small that the balance asks for every CTA it may have
  EXPECT_EQ(mk::fused::moeFusedDispatchCtas(c, 132), 66);
  c.T = 12;  // 48 slots: 4 CTAs' warps
  EXPECT_EQ(mk::fused::moeFusedDispatchCtas(c, 132), 4);
}

}  // namespace
