#include "fused/core/cost_model.h"

#include <cstdint>
#include <string>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checks.h"
#include "base/param.h"
#include "fused/gemm/gemm.h"

namespace mk {
namespace fused {

namespace {

constexpr double kDefaultLinkGBps = 350.0;
constexpr double kDefaultNetGBps = 45.0;
constexpr double kLaunchUs = 5.0;  // one extra launch in the sequential path

// GEMM time on `sms` SMs with wave quantisation of 128x256 tiles.
double gemmUs(const SplitQuery& q, const DeviceRates& r, int sms) {
  if (q.M <= 0 || q.N <= 0 || q.K <= 0 || sms <= 0) return 0.0;
  const double tiles = std::ceil(q.M / 128.0) * std::ceil(q.N / 256.0);
  const double waves = std::ceil(tiles / sms);
  const double tileFlop = 2.0 * 128 * 256 * (double)q.K;
  return waves * tileFlop / (r.gemmTflopsPerSm * 1e12) * 1e6;
}

double commUs(const SplitQuery& q, const DeviceRates& r, int intraSms, int interSms) {
  const double link = q.linkGBps > 0 ? q.linkGBps : kDefaultLinkGBps;
  const double net = q.netGBps > 0 ? q.netGBps : kDefaultNetGBps;
  double t = 0;
  if (q.intraBytes > 0) {
    if (intraSms <= 0) return 1e30;
    t = std::max(t, q.intraBytes / (std::min(link, intraSms * r.copyGBpsPerSm) * 1e3));
  }
  if (q.interBytes > 0) {
    if (interSms <= 0) return 1e30;
    t = std::max(t, q.interBytes / (std::min(net, interSms * r.copyGBpsPerSm) * 1e3));
  }
  return t;
}

SmSplit makeSplit(const SplitQuery& q, int totalSms, int commSms) {
  SmSplit s;
  commSms = std::max(0, std::min(commSms, totalSms - 1));
  int left = commSms;
  if (q.nNodes > 1 && left >= 2) {
    s.count[(int)Role::kInterSend] = 1;
    s.count[(int)Role::kInterReduce] = 1;
    left -= 2;
  }
  s.count[(int)Role::kIntraComm] = left;
  s.count[(int)Role::kCompute] = totalSms - commSms;
  return s;
}

}  // namespace

SplitChoice chooseSplit(const SplitQuery& q, const DeviceRates& r, int totalSms) {
  SplitChoice best;
  DeviceRates rr = r;
  if (rr.gemmTflopsPerSm <= 0) rr.gemmTflopsPerSm = 5.8;  // ~770 TFLOP/s / 132
  if (rr.copyGBpsPerSm <= 0) rr.copyGBpsPerSm = 40.0;
  const bool needComm = q.intraBytes > 0 || q.interBytes > 0;
  const double seq = gemmUs(q, rr, totalSms) +
                     commUs(q, rr, std::max(totalSms, 1), q.nNodes > 1 ? 2 : 0) + kLaunchUs;
  best.tSequentialUs = seq;
  if (!needComm || totalSms < 2) {
    best.split = makeSplit(q, totalSms, 0);
    best.tFusedUs = gemmUs(q, rr, totalSms);
    best.fuse = needComm ? false : true;
    return best;
  }
  double bestT = 1e30;
  int bestC = 1;
  const int maxComm = std::max(1, totalSms / 2);
  for (int c = 1; c <= maxComm; ++c) {
    const SmSplit s = makeSplit(q, totalSms, c);
    const double t = std::max(
        gemmUs(q, rr, s.of(Role::kCompute)),
        commUs(q, rr, s.of(Role::kIntraComm), s.of(Role::kInterSend) + s.of(Role::kInterReduce)));
    if (t < bestT * 0.999) {  // prefer fewer comm SMs on near-ties
      bestT = t;
      bestC = c;
    }
  }
  best.split = makeSplit(q, totalSms, bestC);
  best.tFusedUs = bestT;
  // Fused kernels cost something (flag traffic, fewer GEMM SMs, no L2 sharing): demand a
  // clear win before fusing, so a fused call is never slower than the sequential path.
  best.fuse = bestT < 0.95 * seq;
  return best;
}

SplitChoice resolveSplit(const SplitQuery& q, const DeviceRates& r, int totalSms, int apiCommSms) {
  SplitChoice c = chooseSplit(q, r, totalSms);
  int forced = -1;
  const char* src = nullptr;
  if (apiCommSms >= 0) {
    forced = apiCommSms;
    src = "api";
  } else if (MK_PARAM_INT(FusedCommSms) >= 0) {
    forced = (int)MK_PARAM_INT(FusedCommSms);
    src = "env";
  }
  if (forced >= 0) {
    c.split = makeSplit(q, totalSms, forced);
    c.fuse = true;
    c.source = src;
  }
  return c;
}

std::string formatRates(const DeviceRates& r) {
  char buf[256];
  snprintf(
      buf, sizeof(buf),
      "version=1\nsms=%d\ngemm_tflops_per_sm=%.6f\ncopy_gbps_per_sm=%.3f\ncopy_gbps_peak=%.3f\n",
      r.sms, r.gemmTflopsPerSm, r.copyGBpsPerSm, r.copyGBpsPeak);
  return buf;
}

bool parseRates(const std::string& text, DeviceRates* r) {
  std::istringstream in(text);
  std::string line;
  DeviceRates v;
  int version = 0;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = line.substr(0, eq);
    const double x = atof(line.c_str() + eq + 1);
    if (k == "version")
      version = (int)x;
    else if (k == "sms")
      v.sms = (int)x;
    else if (k == "gemm_tflops_per_sm")
      v.gemmTflopsPerSm = x;
    else if (k == "copy_gbps_per_sm")
      v.copyGBpsPerSm = x;
    else if (k == "copy_gbps_peak")
      v.copyGBpsPeak = x;
  }
  if (version != 1 || v.sms <= 0 || v.gemmTflopsPerSm <= 0 || v.copyGBpsPerSm <= 0) return false;
  *r = v;
  return true;
}

namespace {

__global__ void copyKernel(const int4* __restrict__ src, int4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

__global__ void fillKernel(uint16_t* p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = 0x3c00 ^ (uint16_t)((i * 2654435761u) >> 20 & 0x3ff);  // bf16 values near 1..2
}

std::string cachePath(int device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  std::string dir;
  if (const char* d = getenv("MKERNEL_CACHE_DIR")) {
    dir = d;
  } else if (const char* h = getenv("HOME")) {
    dir = std::string(h) + "/.cache";
    mkdir(dir.c_str(), 0755);
    dir += "/mkernel";
  } else {
    return "";
  }
  mkdir(dir.c_str(), 0755);
  char uuid[40];
  for (int i = 0; i < 16; ++i) snprintf(uuid + 2 * i, 3, "%02x", (unsigned char)prop.uuid.bytes[i]);
  return dir + "/rates-" + uuid + ".txt";
}

// Bound of the one-time rate measurement (a few ms of work on an idle GPU).
constexpr int64_t kMeasureTimeoutMs = 60000;

int64_t clockMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Waits for event e with a deadline (the measurement's kernels run beside whatever else the
// GPU holds, e.g. other ranks' kernels waiting for their peers up to their own deadline).
ncclResult_t waitEvent(cudaEvent_t e, int64_t deadlineMs) {
  for (;;) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return ncclSuccess;
    if (q != cudaErrorNotReady) CUDACHECK(q);
    if (clockMs() > deadlineMs) {
      MK_WARN("fused cost model: the rate measurement did not finish within %lld ms",
              (long long)kMeasureTimeoutMs);
      return ncclInternalError;
    }
    usleep(200);
  }
}

// On a private non-blocking stream with stream-ordered allocations: the legacy default stream,
// cudaFree or a device-wide synchronisation would wait for every stream of the device, and
// this runs inside a fused call, beside the caller's earlier kernels that may wait for peers.
ncclResult_t measure(int device, DeviceRates* out) {
  DeviceRates r;
  CUDACHECK(cudaDeviceGetAttribute(&r.sms, cudaDevAttrMultiProcessorCount, device));
  const int n = 4096;
  const size_t bytes = (size_t)n * n * 2;
  const int64_t deadline = clockMs() + kMeasureTimeoutMs;
  void *a = nullptr, *b = nullptr, *d = nullptr;
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  ncclResult_t res = ncclSuccess;
  float ms = 0;
  const size_t n16 = bytes / 16;
  gemm::GemmArgs g;
  CUDACHECKGOTO(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), res, done);
  CUDACHECKGOTO(cudaEventCreate(&e0), res, done);
  CUDACHECKGOTO(cudaEventCreate(&e1), res, done);
  CUDACHECKGOTO(cudaMallocAsync(&a, bytes, s), res, done);
  CUDACHECKGOTO(cudaMallocAsync(&b, bytes, s), res, done);
  CUDACHECKGOTO(cudaMallocAsync(&d, bytes, s), res, done);
  fillKernel<<<1024, 256, 0, s>>>(static_cast<uint16_t*>(a), (size_t)n * n);
  fillKernel<<<1024, 256, 0, s>>>(static_cast<uint16_t*>(b), (size_t)n * n);
  g.M = g.N = g.K = n;
  g.A = a;
  g.B = b;
  g.D = d;
  NCCLCHECKGOTO(gemm::launch(g, s), res, done);
  CUDACHECKGOTO(cudaEventRecord(e0, s), res, done);
  for (int i = 0; i < 5; ++i) NCCLCHECKGOTO(gemm::launch(g, s), res, done);
  CUDACHECKGOTO(cudaEventRecord(e1, s), res, done);
  NCCLCHECKGOTO(waitEvent(e1, deadline), res, done);
  CUDACHECKGOTO(cudaEventElapsedTime(&ms, e0, e1), res, done);
  r.gemmTflopsPerSm = 2.0 * n * n * (double)n * 5 / (ms * 1e-3) / 1e12 / r.sms;
  // Copy rates: bytes read + written, one CTA and all SMs.
  copyKernel<<<1, 512, 0, s>>>(static_cast<int4*>(a), static_cast<int4*>(d), n16 / 16);
  CUDACHECKGOTO(cudaEventRecord(e0, s), res, done);
  copyKernel<<<1, 512, 0, s>>>(static_cast<int4*>(a), static_cast<int4*>(d), n16 / 16);
  CUDACHECKGOTO(cudaEventRecord(e1, s), res, done);
  NCCLCHECKGOTO(waitEvent(e1, deadline), res, done);
  CUDACHECKGOTO(cudaEventElapsedTime(&ms, e0, e1), res, done);
  r.copyGBpsPerSm = 2.0 * bytes / 16 / (ms * 1e-3) / 1e9;
  CUDACHECKGOTO(cudaEventRecord(e0, s), res, done);
  copyKernel<<<r.sms * 4, 512, 0, s>>>(static_cast<int4*>(a), static_cast<int4*>(d), n16);
  CUDACHECKGOTO(cudaEventRecord(e1, s), res, done);
  NCCLCHECKGOTO(waitEvent(e1, deadline), res, done);
  CUDACHECKGOTO(cudaEventElapsedTime(&ms, e0, e1), res, done);
  r.copyGBpsPeak = 2.0 * bytes / (ms * 1e-3) / 1e9;
  CUDACHECKGOTO(cudaGetLastError(), res, done);
  *out = r;
done:
  // Stream-ordered: after the kernels, even those a timeout left running.
  if (a != nullptr) cudaFreeAsync(a, s);
  if (b != nullptr) cudaFreeAsync(b, s);
  if (d != nullptr) cudaFreeAsync(d, s);
  if (e0 != nullptr) cudaEventDestroy(e0);
  if (e1 != nullptr) cudaEventDestroy(e1);
  if (s != nullptr) cudaStreamDestroy(s);  // released once its work is done
  (void)cudaGetLastError();
  return res;
}

}  // namespace

ncclResult_t getDeviceRates(int device, DeviceRates* out) {
  // One lock per device: a measurement on one GPU must not hold up callers on the others.
  static std::mutex mu[64];
  static DeviceRates mem[64];
  static bool have[64] = {};
  MK_ARGCHECK(device >= 0 && device < 64, "device %d out of range", device);
  std::lock_guard<std::mutex> lock(mu[device]);
  if (have[device]) {
    *out = mem[device];
    return ncclSuccess;
  }
  const std::string path = cachePath(device);
  DeviceRates r;
  bool ok = false;
  if (!path.empty()) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    ok = f.good() || f.eof() ? parseRates(ss.str(), &r) : false;
  }
  if (!ok) {
    int prev;
    CUDACHECK(cudaGetDevice(&prev));
    CUDACHECK(cudaSetDevice(device));
    ncclResult_t res = measure(device, &r);
    cudaSetDevice(prev);
    NCCLCHECK(res);
    if (!path.empty()) {
      std::ofstream f(path);
      f << formatRates(r);
    }
    MK_INFO(kFused,
            "fused cost model: measured rates for device %d: %.2f TFLOP/s per SM, "
            "copy %.1f GB/s per SM, %.0f GB/s peak (cached in %s)",
            device, r.gemmTflopsPerSm, r.copyGBpsPerSm, r.copyGBpsPeak, path.c_str());
  }
  mem[device] = r;
  have[device] = true;
  *out = r;
  return ncclSuccess;
}

}  // namespace fused
}  // namespace mk
