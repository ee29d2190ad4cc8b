// The GEMM engine's host-rule unit tests' common arguments (test_gemm_can_implement.cc,
// test_gemm_auto_rules.cc): a call canImplement accepts, built on a static buffer (no CUDA).
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "fused/gemm/gemm.h"

namespace gemmargs {

using mk::gemm::BLayout;
using mk::gemm::DType;
using mk::gemm::GemmArgs;

alignas(256) inline char gBuf[4096];

inline GemmArgs good() {
  GemmArgs a;
  a.M = 1000;
  a.N = 3000;
  a.K = 512;
  a.A = gBuf;
  a.B = gBuf + 256;
  a.D = gBuf + 512;
  return a;
}

inline void expectReject(const GemmArgs& a, const char* fragment) {
  std::string why;
  EXPECT_FALSE(mk::gemm::canImplement(a, &why));
  EXPECT_NE(why.find(fragment), std::string::npos) << "message: " << why;
}

// `a` with each 16-bit D type and B layout, alpha -2 and beta 0.5: every one accepted.
inline void expectAcceptsEvery16BitD(GemmArgs a) {
  std::string why;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (BLayout bl : {BLayout::kKN, BLayout::kNK}) {
      a.dType = dt;
      a.bLayout = bl;
      a.beta = 0.5f;
      a.alpha = -2.0f;
      EXPECT_TRUE(mk::gemm::canImplement(a, &why)) << why;
    }
  }
}

}  // namespace gemmargs
