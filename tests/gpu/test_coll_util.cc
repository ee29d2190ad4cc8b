#include "gpu/test_coll_util.h"
#include "common/parallel.h"
#include "common/test_util.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "base/param.h"

namespace colltest {

// ---- cliques -------------------------------------------------------------------------
namespace {
std::map<int, std::unique_ptr<Clique>>& cliques() {
  static auto* m = new std::map<int, std::unique_ptr<Clique>>();
  return *m;
}

void destroyClique(Clique& c, bool abort) {
  for (ncclComm_t comm : c.comms)
    if (comm) abort ? ncclCommAbort(comm) : ncclCommDestroy(comm);
  for (cudaStream_t s : c.streams)
    if (s) cudaStreamDestroy(s);
  c.comms.clear();
  c.streams.clear();
  c.ok = false;
}

class CliqueEnv : public ::testing::Environment {
 public:
  void TearDown() override {
    for (auto& kv : cliques()) destroyClique(*kv.second, false);
    cliques().clear();
  }
};
[[maybe_unused]] ::testing::Environment* const kEnv =
    ::testing::AddGlobalTestEnvironment(new CliqueEnv);
}  // namespace

Clique& clique(int n) {
  auto& m = cliques();
  auto it = m.find(n);
  if (it != m.end() && it->second->ok) return *it->second;
  if (it != m.end()) {
    destroyClique(*it->second, true);
    m.erase(it);
  }
  auto c = std::make_unique<Clique>();
  c->n = n;
  c->comms.assign(n, nullptr);
  std::vector<int> devs(n, 0);
  ncclResult_t r = ncclCommInitAll(c->comms.data(), n, devs.data());
  if (r != ncclSuccess) {
    c->why = std::string("ncclCommInitAll failed: ") + ncclGetErrorString(r) + ": " +
             ncclGetLastError(nullptr);
  } else {
    c->ok = true;
    cudaSetDevice(0);
    c->streams.assign(n, nullptr);
    for (int i = 0; i < n; i++) {
      if (cudaStreamCreateWithFlags(&c->streams[i], cudaStreamNonBlocking) != cudaSuccess) {
        c->ok = false;
        c->why = "cudaStreamCreate failed";
      }
    }
  }
  Clique& ref = *c;
  m[n] = std::move(c);
  return ref;
}

void dropClique(int n) {
  auto& m = cliques();
  auto it = m.find(n);
  if (it == m.end()) return;
  destroyClique(*it->second, true);
  m.erase(it);
}

bool syncClique(Clique& c, double timeoutS, std::string* why) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<bool> done(c.n, false);
  int left = c.n;
  std::string err;
  while (left > 0 && err.empty()) {
    for (int r = 0; r < c.n; r++) {
      if (done[r]) continue;
      cudaError_t e = cudaStreamQuery(c.streams[r]);
      if (e == cudaSuccess) {
        done[r] = true;
        left--;
      } else if (e != cudaErrorNotReady) {
        err = std::string("rank ") + std::to_string(r) + ": CUDA error " + cudaGetErrorString(e);
        break;
      }
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(c.comms[r], &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress) {
        err = std::string("rank ") + std::to_string(r) + ": async error " +
              ncclGetErrorString(async) + ": " + ncclGetLastError(nullptr);
        break;
      }
    }
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (err.empty() && left > 0 && el > timeoutS) {
      err = "timed out after " + std::to_string(timeoutS) + " s (" + std::to_string(left) +
            " ranks still running): deadlock or lost message";
    }
    if (left > 0 && err.empty()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (!err.empty()) {
    if (why) *why = err;
    dropClique(c.n);
    return false;
  }
  return true;
}

// ---- dtypes --------------------------------------------------------------------------
namespace {
const DtInfo kInfo[] = {
    {ncclInt8, "int8", 1, false, true, 0, 0, 0, 0, 0},
    {ncclUint8, "uint8", 1, false, false, 0, 0, 0, 0, 0},
    {ncclInt32, "int32", 4, false, true, 0, 0, 0, 0, 0},
    {ncclUint32, "uint32", 4, false, false, 0, 0, 0, 0, 0},
    {ncclInt64, "int64", 8, false, true, 0, 0, 0, 0, 0},
    {ncclUint64, "uint64", 8, false, false, 0, 0, 0, 0, 0},
    {ncclFloat16, "half", 2, true, true, 5, 10, 15, std::ldexp(1.0, -11), std::ldexp(1.0, -24)},
    {ncclFloat32, "float", 4, true, true, 8, 23, 127, std::ldexp(1.0, -24), std::ldexp(1.0, -149)},
    {ncclFloat64, "double", 8, true, true, 11, 52, 1023, std::ldexp(1.0, -53),
     std::ldexp(1.0, -1074)},
    {ncclBfloat16, "bf16", 2, true, true, 8, 7, 127, std::ldexp(1.0, -8), std::ldexp(1.0, -133)},
    {ncclFloat8e4m3, "fp8e4m3", 1, true, true, 4, 3, 7, std::ldexp(1.0, -4), std::ldexp(1.0, -9)},
    {ncclFloat8e5m2, "fp8e5m2", 1, true, true, 5, 2, 15, std::ldexp(1.0, -3), std::ldexp(1.0, -16)},
};

double decodeMini(uint64_t bits, int eb, int mb, int bias) {
  uint64_t sign = (bits >> (eb + mb)) & 1;
  uint64_t e = (bits >> mb) & ((1ull << eb) - 1);
  uint64_t m = bits & ((1ull << mb) - 1);
  double v = e == 0 ? std::ldexp((double)m, 1 - bias - mb)
                    : std::ldexp(1.0 + std::ldexp((double)m, -mb), (int)e - bias);
  return sign ? -v : v;
}

const std::vector<double>& table(ncclDataType_t dt) {
  static std::map<int, std::vector<double>> t;
  auto it = t.find((int)dt);
  if (it != t.end()) return it->second;
  const DtInfo& d = dtInfo(dt);
  std::vector<double> v(1u << (8 * d.size));
  for (size_t i = 0; i < v.size(); i++) v[i] = decodeMini(i, d.expBits, d.manBits, d.bias);
  return t[(int)dt] = std::move(v);
}

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

const ncclDataType_t kAllTypes[12] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                      ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                      ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
const Op kAllOps[7] = {Op::kSum, Op::kProd,      Op::kMax,       Op::kMin,
                       Op::kAvg, Op::kPreMulDev, Op::kPreMulHost};

const DtInfo& dtInfo(ncclDataType_t dt) {
  for (const DtInfo& d : kInfo)
    if (d.dt == dt) return d;
  return kInfo[0];
}

double decodeFloat(ncclDataType_t dt, uint64_t bits) {
  if (dt == ncclFloat32) {
    float f;
    uint32_t b = (uint32_t)bits;
    memcpy(&f, &b, 4);
    return f;
  }
  if (dt == ncclFloat64) {
    double d;
    memcpy(&d, &bits, 8);
    return d;
  }
  return table(dt)[bits & ((1ull << (8 * dtInfo(dt).size)) - 1)];
}

uint64_t encodeExact(ncclDataType_t dt, double v) {
  const DtInfo& d = dtInfo(dt);
  if (!d.isFloat) return (uint64_t)(int64_t)v;
  if (dt == ncclFloat32) {
    float f = (float)v;
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
  }
  if (dt == ncclFloat64) {
    uint64_t b;
    memcpy(&b, &v, 8);
    return b;
  }
  const auto& t = table(dt);
  for (size_t i = 0; i < t.size(); i++)
    if (t[i] == v) return i;
  ADD_FAILURE() << v << " is not representable in " << d.name;
  return 0;
}

int64_t signExtend(uint64_t bits, size_t size) {
  if (size >= 8) return (int64_t)bits;
  int sh = 64 - 8 * (int)size;
  return (int64_t)(bits << sh) >> sh;
}

const char* opName(Op op) {
  switch (op) {
    case Op::kSum:
      return "sum";
    case Op::kProd:
      return "prod";
    case Op::kMax:
      return "max";
    case Op::kMin:
      return "min";
    case Op::kAvg:
      return "avg";
    case Op::kPreMulDev:
      return "premulDev";
    case Op::kPreMulHost:
      return "premulHost";
  }
  return "?";
}

ncclRedOp_t builtinOp(Op op) {
  switch (op) {
    case Op::kProd:
      return ncclProd;
    case Op::kMax:
      return ncclMax;
    case Op::kMin:
      return ncclMin;
    case Op::kAvg:
      return ncclAvg;
    default:
      return ncclSum;
  }
}

uint64_t HostBuf::get(size_t i) const {
  uint64_t v = 0;
  memcpy(&v, bytes.data() + i * size, size);
  return v;
}
void HostBuf::set(size_t i, uint64_t bits) {
  memcpy(bytes.data() + i * size, &bits, size);
}

void fillRandom(HostBuf& b, ncclDataType_t dt, Op op, size_t count, uint64_t seed) {
  const DtInfo& d = dtInfo(dt);
  b.size = d.size;
  b.bytes.assign(count * d.size, 0);
  uint64_t s = mix64(seed);
  // Up to 16 threads, none for fewer than 64K elements (thread start-up would dominate).
  mktest::parallelForRanges(
      count, 1u << 16,
      [&](size_t i0, size_t i1) {
        for (size_t i = i0; i < i1; i++) {
          uint64_t r = mix64(s + i * 0x9e3779b97f4a7c15ull);
          if (!d.isFloat) {
            b.set(i, r);
            continue;
          }
          // sign | exponent | mantissa: magnitudes in [2^-7, 1), or [0.5, 2) for products.
          uint64_t sign = r & 1;
          int64_t e = op == Op::kProd ? d.bias - (int64_t)((r >> 1) & 1)
                                      : d.bias - 1 - (int64_t)((r >> 1) % 7);
          if (e < 0) e = 0;
          uint64_t man = (r >> 8) & ((1ull << d.manBits) - 1);
          uint64_t bits = (sign << (d.expBits + d.manBits)) | ((uint64_t)e << d.manBits) | man;
          b.set(i, bits);
        }
      },
      16);
}

uint64_t scalarFor(ncclDataType_t dt, uint64_t seed) {
  const DtInfo& d = dtInfo(dt);
  static const double kF[] = {0.5, 0.75, 1.5, 2.0, -1.25};
  static const int64_t kI[] = {3, -2, 5, 7, 1};
  int k = (int)(mix64(seed ^ 0x5ca1ab1e) % 5);
  if (!d.isFloat) return (uint64_t)(d.isSigned ? kI[k] : (kI[k] < 0 ? 9 : kI[k]));
  return encodeExact(dt, kF[k]);
}

namespace {
std::string checkRange(ncclDataType_t dt, Op op, const std::vector<const HostBuf*>& in, size_t base,
                       const HostBuf& got, size_t i0, size_t count,
                       const std::vector<uint64_t>& scalars) {
  const DtInfo& d = dtInfo(dt);
  const int n = (int)in.size();
  const uint64_t mask = d.size >= 8 ? ~0ull : ((1ull << (8 * d.size)) - 1);
  const bool premul = op == Op::kPreMulDev || op == Op::kPreMulHost;
  const double* tab = d.isFloat && d.size <= 2 ? table(dt).data() : nullptr;
  auto dec = [&](uint64_t bits) { return tab ? tab[bits & mask] : decodeFloat(dt, bits); };
  std::ostringstream err;
  int bad = 0;
  for (size_t i = i0; i < count && bad < 5; i++) {
    uint64_t g = got.get(i) & mask;
    if (!d.isFloat) {
      uint64_t acc = 0;
      int64_t sacc = 0;
      uint64_t uacc = 0;
      for (int r = 0; r < n; r++) {
        uint64_t x = in[r]->get(base + i) & mask;
        int64_t sx = signExtend(x, d.size);
        switch (op) {
          case Op::kSum:
          case Op::kAvg:
            acc = r ? acc + x : x;
            break;
          case Op::kPreMulDev:
          case Op::kPreMulHost:
            acc = r ? acc + x * scalars[r] : x * scalars[r];
            break;
          case Op::kProd:
            acc = r ? acc * x : x;
            break;
          case Op::kMax:
            sacc = r ? std::max(sacc, sx) : sx;
            uacc = r ? std::max(uacc, x) : x;
            break;
          case Op::kMin:
            sacc = r ? std::min(sacc, sx) : sx;
            uacc = r ? std::min(uacc, x) : x;
            break;
        }
      }
      uint64_t want = acc & mask;
      if (op == Op::kMax || op == Op::kMin) want = (d.isSigned ? (uint64_t)sacc : uacc) & mask;
      if (op == Op::kAvg) {
        want = d.isSigned ? (uint64_t)(signExtend(want, d.size) / n) & mask : (want / n) & mask;
      }
      if (g != want) {
        err << "\n  element " << i << ": got 0x" << std::hex << g << " want 0x" << want << std::dec;
        bad++;
      }
      continue;
    }
    double ref = 0, mag = 0;
    for (int r = 0; r < n; r++) {
      double x = dec(in[r]->get(base + i));
      const double s = premul ? decodeFloat(dt, scalars[r]) : 1.0;
      switch (op) {
        case Op::kSum:
        case Op::kAvg:
        case Op::kPreMulDev:
        case Op::kPreMulHost:
          ref += x * s;
          mag += std::fabs(x * s);
          break;
        case Op::kProd:
          ref = r ? ref * x : x;
          break;
        case Op::kMax:
          ref = r ? std::max(ref, x) : x;
          break;
        case Op::kMin:
          ref = r ? std::min(ref, x) : x;
          break;
      }
    }
    double gv = dec(g);
    double tol = 0;
    if (op == Op::kSum || premul) {
      tol = (n + 3) * d.u * mag + (n + 2) * d.minSub;
    } else if (op == Op::kAvg) {
      ref /= n;
      tol = (n + 3) * d.u * mag / n + d.u * std::fabs(ref) + (n + 2) * d.minSub;
    } else if (op == Op::kProd) {
      tol = (2 * n + 2) * d.u * std::fabs(ref) + (n + 2) * d.minSub;
    }
    if (!(std::fabs(gv - ref) <= tol)) {
      err << "\n  element " << i << ": got " << gv << " (0x" << std::hex << g << std::dec
          << ") want " << ref << " +- " << tol << " inputs";
      for (int r = 0; r < n && r < 8; r++) err << " " << dec(in[r]->get(base + i));
      bad++;
    }
  }
  return err.str();
}
}  // namespace

std::string checkReduction(ncclDataType_t dt, Op op, const std::vector<const HostBuf*>& in,
                           size_t base, const HostBuf& got, size_t count, uint64_t scalar) {
  return checkReduction(dt, op, in, base, got, count, std::vector<uint64_t>(in.size(), scalar));
}

std::string checkReduction(ncclDataType_t dt, Op op, const std::vector<const HostBuf*>& in,
                           size_t base, const HostBuf& got, size_t count,
                           const std::vector<uint64_t>& scalars) {
  const DtInfo& d = dtInfo(dt);
  if (d.isFloat && d.size <= 2) table(dt);  // built before the threads read it
  unsigned hw = std::thread::hardware_concurrency();
  size_t t = std::min<size_t>(hw ? hw : 1, 16);
  if (count < (1u << 16) || t <= 1) return checkRange(dt, op, in, base, got, 0, count, scalars);
  std::vector<std::string> errs(t);  // per range, joined in index order
  const size_t per = (count + t - 1) / t;
  mktest::parallelFor(
      t,
      [&](size_t i) {
        const size_t i0 = i * per, i1 = std::min(count, i0 + per);
        if (i0 < i1) errs[i] = checkRange(dt, op, in, base, got, i0, i1, scalars);
      },
      16);
  std::string all;
  for (const std::string& e : errs) all += e;
  return all;
}

std::string checkBytes(const HostBuf& got, size_t gotOff, const HostBuf& want, size_t wantOff,
                       size_t bytes, const char* what) {
  const uint8_t* g = got.bytes.data() + gotOff;
  const uint8_t* w = want.bytes.data() + wantOff;
  if (memcmp(g, w, bytes) == 0) return "";
  size_t i = 0;
  while (i < bytes && g[i] == w[i]) i++;
  size_t wrong = 0;
  for (size_t j = i; j < bytes; j++) wrong += g[j] != w[j];
  std::ostringstream os;
  os << what << ": " << wrong << " of " << bytes << " bytes differ, first at byte " << i
     << " (got 0x" << std::hex << (int)g[i] << " want 0x" << (int)w[i] << ")";
  return os.str();
}

DevBuf::DevBuf(size_t b) : bytes(b) {
  if (b && cudaMalloc(&base, b) != cudaSuccess) {
    base = nullptr;
    ADD_FAILURE() << "cudaMalloc(" << b << ") failed";
  }
}
DevBuf::~DevBuf() {
  if (base) cudaFree(base);
}

void upload(void* dst, const HostBuf& h, size_t offElems, size_t count) {
  if (count == 0) return;
  ASSERT_EQ(mktest::syncMemcpy(dst, h.bytes.data() + offElems * h.size, count * h.size,
                               cudaMemcpyHostToDevice),
            cudaSuccess);
}

void download(HostBuf& h, const void* src, size_t count, size_t elemSize) {
  h.size = elemSize;
  h.bytes.resize(count * elemSize);
  if (count == 0) return;
  ASSERT_EQ(mktest::syncMemcpy(h.bytes.data(), src, count * elemSize, cudaMemcpyDeviceToHost),
            cudaSuccess);
}

AlgoScope::AlgoScope(const char* algo) {
  const char* old = getenv("MKERNEL_ALGO");
  hadOld = old != nullptr;
  if (old) oldValue = old;
  if (algo && *algo)
    setenv("MKERNEL_ALGO", algo, 1);
  else
    unsetenv("MKERNEL_ALGO");
  mk::paramReset();
}
AlgoScope::~AlgoScope() {
  if (hadOld)
    setenv("MKERNEL_ALGO", oldValue.c_str(), 1);
  else
    unsetenv("MKERNEL_ALGO");
  mk::paramReset();
}

std::string sizeName(size_t count) {
  if (count >= (1u << 20) && count % (1u << 20) == 0) return std::to_string(count >> 20) + "M";
  if (count > (1u << 20))
    return std::to_string(count >> 20) + "Mplus" + std::to_string(count % (1u << 20));
  return std::to_string(count);
}

}  // namespace colltest
