// SM-split cost model for fused operators: how many SMs go to communication roles so that
// communication hides under compute, and whether fusing beats "GEMM then collective".
//
// Rates are measured once per device (engine GEMM throughput per SM, copy bandwidth per SM
// and in total) and cached in $MKERNEL_CACHE_DIR or $HOME/.cache/mkernel/rates-<uuid>.txt.
// Overrides, strongest first: the API argument (commSms >= 0), MKERNEL_FUSED_COMM_SMS, model.
#pragma once
#include <cstdint>
#include <string>
#include <nccl.h>

#include "fused/core/types.h"

namespace mk {
namespace fused {

struct DeviceRates {
  int sms = 0;
  double gemmTflopsPerSm = 0;  // bf16 engine, large shape, all SMs / sms
  double copyGBpsPerSm = 0;    // one CTA's device-to-device copy rate
  double copyGBpsPeak = 0;     // all SMs
};

struct SplitQuery {
  int64_t M = 0, N = 0, K = 0;  // the GEMM each rank runs
  int nRanks = 1;               // ranks taking part
  int nNodes = 1;               // nodes among them (1: intra-node only)
  double intraBytes = 0;        // bytes each rank's comm roles move over NVLink/P2P
  double interBytes = 0;        // bytes each rank sends over the network
  double linkGBps = 0;          // per-GPU NVLink/P2P rate (0: 350 GB/s estimate)
  double netGBps = 0;           // per-GPU network rate (0: 45 GB/s estimate, 400 Gb/s NIC)
};

struct SplitChoice {
  SmSplit split;
  double tFusedUs = 0;           // model: max(compute on the rest, comm on its SMs)
  double tSequentialUs = 0;      // model: GEMM on all SMs, then comm on all SMs
  bool fuse = true;              // false: the caller should run GEMM then the collective
  const char* source = "model";  // "api", "env" or "model"
};

// Pure model (no CUDA calls; unit-tested on the CPU).
SplitChoice chooseSplit(const SplitQuery& q, const DeviceRates& r, int totalSms);

// Applies the overrides (apiCommSms >= 0, then MKERNEL_FUSED_COMM_SMS >= 0) before the model.
// Communication SMs beyond the first go to intra-node roles; multi-node queries get one
// inter-node send and one reduce CTA first.
SplitChoice resolveSplit(const SplitQuery& q, const DeviceRates& r, int totalSms, int apiCommSms);

// Measured once per device (a few ms of GPU time) and cached on disk and in memory.
ncclResult_t getDeviceRates(int device, DeviceRates* out);

// For tests: parse/format the cache file body.
std::string formatRates(const DeviceRates& r);
bool parseRates(const std::string& text, DeviceRates* r);

}  // namespace fused
}  // namespace mk
