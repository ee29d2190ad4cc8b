// Argument rules of ncclRingAttention (include/mkernel/fused.h), checked on the CPU by
// ringAttnCheck: valid calls pass with their defaults resolved (scale = 1/sqrt(headDim)), and
// every rule is refused with ncclInvalidArgument and a message that names the API and the rule.
// The pointers are fake addresses: the checks never dereference them and make no CUDA call.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "fused/ops/ring_attn/ring_attn.h"
#include "mkernel/fused.h"

namespace {

using mk::fused::RingAttnCall;

// Fake, 256-byte aligned addresses 1 TiB apart, so that even 2^31-element tensors stay apart.
template <typename T = void>
T* addr(uintptr_t i) {
  return reinterpret_cast<T*>((i + 1) << 40);
}

// p moved by `bytes`.
template <typename T>
T* shift(T* p, intptr_t bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + bytes);
}

// A writable fake address `bytes` past p (the checks never write through it).
void* writable(const void* p, intptr_t bytes = 0) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + bytes);
}

RingAttnCall valid() {
  RingAttnCall c;
  c.q = addr(1);
  c.k = addr(2);
  c.v = addr(3);
  c.out = addr(4);
  c.lse = addr<float>(5);
  c.B = 2;
  c.S = 300;
  c.Hq = 16;
  c.Hkv = 4;
  c.D = 128;
  c.inType = ncclBfloat16;
  return c;
}

std::string check(RingAttnCall c, const ncclRingAttnConfig_t* cfg = nullptr, int n = 4) {
  const ncclResult_t res = mk::fused::ringAttnCheck(&c, cfg, n);
  if (res == ncclSuccess) return "";
  EXPECT_EQ(res, ncclInvalidArgument);
  return std::string("refused: ") + ncclGetLastError(nullptr);
}

TEST(RingAttnArgs, ValidCallsPassAndDefaultsResolve) {
  for (int d : {64, 128, 256}) {
    RingAttnCall c = valid();
    c.D = d;
    ASSERT_EQ(mk::fused::ringAttnCheck(&c, nullptr, 4), ncclSuccess) << ncclGetLastError(nullptr);
    EXPECT_FLOAT_EQ(c.cfg.scale, 1.0f / std::sqrt(float(d))) << "headDim " << d;
    EXPECT_EQ(c.cfg.size, sizeof(ncclRingAttnConfig_t));
    EXPECT_EQ(c.cfg.causal, 0);
    EXPECT_EQ(c.cfg.seqLayout, ncclRingAttnContiguous);
    EXPECT_EQ(c.cfg.commSms, -1);
    EXPECT_EQ(c.cfg.algo, ncclFusedAuto);
  }
  // An explicit scale is kept; a negative one selects the default as 0 does.
  RingAttnCall c = valid();
  ncclRingAttnConfig_t cfg = NCCL_RING_ATTN_CONFIG_INITIALIZER;
  cfg.scale = 0.37f;
  cfg.causal = 1;
  cfg.seqLayout = ncclRingAttnZigzag;
  cfg.algo = ncclFusedSequential;
  cfg.commSms = 8;
  c.inType = ncclFloat16;
  ASSERT_EQ(mk::fused::ringAttnCheck(&c, &cfg, 4), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(c.cfg.scale, 0.37f);
  EXPECT_EQ(c.cfg.causal, 1);
  EXPECT_EQ(c.cfg.seqLayout, ncclRingAttnZigzag);
  EXPECT_EQ(c.cfg.algo, ncclFusedSequential);
  EXPECT_EQ(c.cfg.commSms, 8);
  c = valid();
  cfg = NCCL_RING_ATTN_CONFIG_INITIALIZER;
  cfg.scale = -2.0f;
  ASSERT_EQ(mk::fused::ringAttnCheck(&c, &cfg, 4), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_FLOAT_EQ(c.cfg.scale, 1.0f / std::sqrt(128.0f));

  // A caller built against a later header passes a larger struct.
  struct Later {
    ncclRingAttnConfig_t v1;
    int added[4];
  } later{};
  later.v1 = NCCL_RING_ATTN_CONFIG_INITIALIZER;
  later.v1.size = sizeof(later);
  EXPECT_EQ(check(valid(), &later.v1), "");

  RingAttnCall noLse = valid();  // lse is optional
  noLse.lse = nullptr;
  EXPECT_EQ(check(noLse), "");
  RingAttnCall mha = valid();  // hq == hkv, one rank, batch 1, seqLocal 1
  mha.Hkv = mha.Hq;
  mha.B = 1;
  mha.S = 1;
  EXPECT_EQ(check(mha, nullptr, 1), "");
  RingAttnCall shared = valid();  // the inputs are only read: they may alias each other
  shared.v = shared.k;
  shared.q = shared.k;
  shared.Hkv = shared.Hq;
  EXPECT_EQ(check(shared), "");
  // Counts just below 2^31: q of 2^31 - 2^11 elements, gathered k/v of 2^31 - 2^11 elements.
  // (nranks*seqLocal cannot come near 2^31 alone: headDim >= 64 makes the gathered count reach it
  // first; the refusals below test that rule.)
  RingAttnCall bigQ = valid();
  bigQ.B = 1;
  bigQ.S = (size_t(1) << 20) - 1;
  bigQ.Hq = 16;
  bigQ.Hkv = 1;
  EXPECT_EQ(check(bigQ), "");
  RingAttnCall bigKv = valid();
  bigKv.B = 1;
  bigKv.S = (size_t(1) << 20) - 1;
  bigKv.Hq = bigKv.Hkv = 4;
  bigKv.D = 64;
  EXPECT_EQ(check(bigKv, nullptr, 8), "");
}

TEST(RingAttnArgs, EveryRuleRefusedWithItsMessage) {
  using Cfg = ncclRingAttnConfig_t;
  struct Rule {
    const char* what;
    std::function<void(RingAttnCall&, Cfg&, int&)> breakIt;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Rule> rules = {
      {"config->size", [](RingAttnCall&, Cfg& f, int&) { f.size = 0; }},
      // One byte short of version 1 (which ends after algo).
      {"config->size", [](RingAttnCall&, Cfg& f, int&) { f.size = offsetof(Cfg, algo) + 3; }},
      {"config->magic", [](RingAttnCall&, Cfg& f, int&) { f.magic = NCCL_MOE_CONFIG_MAGIC; }},
      {"config->version", [](RingAttnCall&, Cfg& f, int&) { f.version = 2; }},
      {"config->version", [](RingAttnCall&, Cfg& f, int&) { f.version = 0; }},
      {"config->causal", [](RingAttnCall&, Cfg& f, int&) { f.causal = 2; }},
      {"config->causal", [](RingAttnCall&, Cfg& f, int&) { f.causal = -1; }},
      {"config->scale", [](RingAttnCall&, Cfg& f, int&) { f.scale = std::nanf(""); }},
      {"config->scale", [inf](RingAttnCall&, Cfg& f, int&) { f.scale = inf; }},
      {"config->scale", [inf](RingAttnCall&, Cfg& f, int&) { f.scale = -inf; }},
      {"config->seqLayout", [](RingAttnCall&, Cfg& f, int&) { f.seqLayout = 2; }},
      {"config->algo", [](RingAttnCall&, Cfg& f, int&) { f.algo = 3; }},
      {"config->commSms", [](RingAttnCall&, Cfg& f, int&) { f.commSms = -2; }},
      {"config->commSms", [](RingAttnCall&, Cfg& f, int&) { f.commSms = 0; }},
      {"inType", [](RingAttnCall& c, Cfg&, int&) { c.inType = ncclFloat32; }},
      {"inType", [](RingAttnCall& c, Cfg&, int&) { c.inType = ncclInt8; }},
      {"no ranks", [](RingAttnCall&, Cfg&, int& n) { n = 0; }},
      {"headDim", [](RingAttnCall& c, Cfg&, int&) { c.D = 96; }},
      {"headDim", [](RingAttnCall& c, Cfg&, int&) { c.D = 0; }},
      {"hq=16 must be a multiple of hkv=3", [](RingAttnCall& c, Cfg&, int&) { c.Hkv = 3; }},
      {"hq=0 and hkv=4 must be >= 1", [](RingAttnCall& c, Cfg&, int&) { c.Hq = 0; }},
      {"hq=16 and hkv=0 must be >= 1", [](RingAttnCall& c, Cfg&, int&) { c.Hkv = 0; }},
      {"hq=16 and hkv=-4 must be >= 1", [](RingAttnCall& c, Cfg&, int&) { c.Hkv = -4; }},
      {"batch=0", [](RingAttnCall& c, Cfg&, int&) { c.B = 0; }},
      {"seqLocal=0", [](RingAttnCall& c, Cfg&, int&) { c.S = 0; }},
      {"seqLocal=301 must be even",
       [](RingAttnCall& c, Cfg& f, int&) {
         f.seqLayout = ncclRingAttnZigzag;
         c.S = 301;
       }},
      {"must not be NULL", [](RingAttnCall& c, Cfg&, int&) { c.q = nullptr; }},
      {"must not be NULL", [](RingAttnCall& c, Cfg&, int&) { c.k = nullptr; }},
      {"must not be NULL", [](RingAttnCall& c, Cfg&, int&) { c.v = nullptr; }},
      {"must not be NULL", [](RingAttnCall& c, Cfg&, int&) { c.out = nullptr; }},
      {"16-byte aligned", [](RingAttnCall& c, Cfg&, int&) { c.q = shift(c.q, 2); }},
      {"16-byte aligned", [](RingAttnCall& c, Cfg&, int&) { c.k = shift(c.k, 8); }},
      {"16-byte aligned", [](RingAttnCall& c, Cfg&, int&) { c.v = shift(c.v, 4); }},
      {"16-byte aligned", [](RingAttnCall& c, Cfg&, int&) { c.out = shift(c.out, 2); }},
      {"lse must be 4-byte aligned", [](RingAttnCall& c, Cfg&, int&) { c.lse = shift(c.lse, 2); }},
      // out's last 16 bytes on q's first, out inside k, v 16 bytes into out, out == q.
      {"out must not overlap",
       [](RingAttnCall& c, Cfg&, int&) {
         c.out = writable(c.q, -(intptr_t)(c.B * c.S * 16 * 128 * 2) + 16);
       }},
      {"out must not overlap", [](RingAttnCall& c, Cfg&, int&) { c.out = writable(c.k, 256); }},
      {"out must not overlap", [](RingAttnCall& c, Cfg&, int&) { c.v = shift(c.out, 16); }},
      {"out must not overlap", [](RingAttnCall& c, Cfg&, int&) { c.out = writable(c.q); }},
      {"lse must not overlap",
       [](RingAttnCall& c, Cfg&, int&) { c.lse = shift(static_cast<float*>(c.out), 1024); }},
      {"lse must not overlap",
       [](RingAttnCall& c, Cfg&, int&) { c.lse = static_cast<float*>(writable(c.q)); }},
      {"lse must not overlap",
       [](RingAttnCall& c, Cfg&, int&) { c.lse = static_cast<float*>(writable(c.v)); }},
      {"lse must not overlap",
       [](RingAttnCall& c, Cfg&, int&) {
         // k starts at lse's last 16 bytes.
         c.k = shift(c.lse, (intptr_t)(c.B * c.Hq * c.S * 4) - 16);
       }},
      // 2^31 bounds: exactly 2^31 elements is refused, and a size_t product that would wrap.
      {"batch*seqLocal*hq*headDim",
       [](RingAttnCall& c, Cfg&, int&) {
         c.B = 1;
         c.S = size_t(1) << 20;
         c.Hkv = 1;  // q holds 2^20 * 16 * 128 = 2^31 elements, k and v 2^27
       }},
      {"batch*seqLocal*hq*headDim",
       [](RingAttnCall& c, Cfg&, int&) {
         c.B = (size_t(1) << 53) + 1;
         c.S = 1;  // B*S*Hq*D = 2^64 + 2^11 wraps to 2048 in a size_t
       }},
      {"nranks*seqLocal",
       [](RingAttnCall& c, Cfg&, int& n) {
         n = 128;
         c.B = 1;
         c.S = size_t(1) << 24;  // 2^31 positions; q and k/v hold 2^30 elements
         c.Hq = c.Hkv = 1;
         c.D = 64;
         c.lse = nullptr;
       }},
      {"nranks*batch*seqLocal*hkv*headDim",
       [](RingAttnCall& c, Cfg&, int& n) {
         n = 8;
         c.B = 1;
         c.S = size_t(1) << 20;
         c.Hq = c.Hkv = 4;
         c.D = 64;  // 2^28 elements per rank, 2^31 gathered
       }},
  };
  for (const Rule& r : rules) {
    RingAttnCall c = valid();
    Cfg cfg = NCCL_RING_ATTN_CONFIG_INITIALIZER;
    int n = 4;
    r.breakIt(c, cfg, n);
    const std::string got = check(c, &cfg, n);
    EXPECT_NE(got.find(r.what), std::string::npos) << r.what << ": " << got;
    EXPECT_NE(got.find("ncclRingAttention"), std::string::npos) << r.what << ": " << got;
  }
}

// A NULL config is NCCL_RING_ATTN_CONFIG_INITIALIZER, so a call refused with one is refused the
// same way without one.
TEST(RingAttnArgs, NullConfigChecksTheSameRules) {
  RingAttnCall c = valid();
  c.D = 96;
  EXPECT_NE(check(c, nullptr).find("headDim=96"), std::string::npos);
  c = valid();
  c.out = writable(c.q, 16);
  EXPECT_NE(check(c, nullptr).find("out must not overlap"), std::string::npos);
}

}  // namespace
