// Argument helpers shared by the GEMM engine's rules (gemm_rules.cc) and its parameter builder
// (gemm.cu); host only, no CUDA call. The public rules (canImplement, autoPipeline, ...) are in
// gemm.h.
#pragma once
#include <cstdint>

#include "fused/gemm/gemm.h"

namespace mk {
namespace gemm {

// Leading dimensions and the groups' B stride with their defaults (0 = packed) resolved.
int64_t effLda(const GemmArgs& a);
int64_t effLdb(const GemmArgs& a);
int64_t effLdd(const GemmArgs& a);
int64_t effLdc(const GemmArgs& a);
int64_t effStrideB(const GemmArgs& a);

// Whether the epilogue can store D through TMA (16-byte aligned rows and width), and whether
// GemmArgs::regStores can store it from the accumulators.
bool tmaStorable(const GemmArgs& a);
bool regStorable(const GemmArgs& a);

// GemmArgs::cluster and ::streamK resolved against MKERNEL_GEMM_CLUSTER / _STREAMK.
int32_t resolvedCluster(const GemmArgs& a);
bool resolvedStreamK(const GemmArgs& a);

// The persistent CTAs a call may use: GemmArgs::smBudget, or all `sms` of the device.
int32_t budgetOf(const GemmArgs& a, int32_t sms);

}  // namespace gemm
}  // namespace mk
