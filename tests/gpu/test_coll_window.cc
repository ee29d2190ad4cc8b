// Windows (ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC) and the zero-copy collectives
// on 4 ranks sharing GPU 0, one thread driving all four as nccl-tests -g 4 -R 2 does:
// registration inside ncclGroupStart/End, every collective on window buffers (at the same
// offset on every rank) with fresh random inputs and poisoned outputs, compared with a host
// reference (copies byte for byte, integers exactly, floats within one rounding per step,
// AllReduce bit-identical on every rank), the bytes around each output still poisoned, and
// the zero-copy counters (coll/zc_plan.h) proving which path ran. Also: NCCL_WIN_DEFAULT
// windows and ncclCommRegister buffers (-R 1), CUDA graphs, argument errors, leaks.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <gtest/gtest.h>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include "coll/algo.h"
#include "coll/zc_plan.h"
#include "common/test_util.h"
#include "gpu/test_coll_util.h"

using namespace colltest;

namespace {

constexpr int kN = 4;
constexpr size_t kCap = 24u << 20;  // bytes of each rank's send and receive window
constexpr size_t kSlack = 64;       // poisoned bytes checked before and after every output

enum class C {
  kAllReduce,
  kReduceScatter,
  kReduce,
  kAllGather,
  kBroadcast,
  kAlltoAll,
  kGather,
  kScatter
};
const char* cName(C c) {
  static const char* n[] = {"AllReduce", "ReduceScatter", "Reduce", "AllGather",
                            "Broadcast", "AlltoAll",      "Gather", "Scatter"};
  return n[(int)c];
}
mk::CollType cType(C c) {
  static const mk::CollType t[] = {mk::CollType::kAllReduce, mk::CollType::kReduceScatter,
                                   mk::CollType::kReduce,    mk::CollType::kAllGather,
                                   mk::CollType::kBroadcast, mk::CollType::kAlltoAll,
                                   mk::CollType::kGather,    mk::CollType::kScatter};
  return t[(int)c];
}
bool isRed(C c) {
  return c == C::kAllReduce || c == C::kReduceScatter || c == C::kReduce;
}
bool rooted(C c) {
  return c == C::kReduce || c == C::kBroadcast || c == C::kGather || c == C::kScatter;
}
size_t sendElems(C c, size_t cnt) {
  return c == C::kReduceScatter || c == C::kAlltoAll || c == C::kScatter ? cnt * kN : cnt;
}
size_t recvElems(C c, size_t cnt) {
  return c == C::kAllGather || c == C::kAlltoAll || c == C::kGather ? cnt * kN : cnt;
}

// How the buffers are made known to the comms.
enum class Mode { kSymWindow, kDefaultWindow, kRegister, kPlain };
const char* modeName(Mode m) {
  static const char* n[] = {"symwin", "defwin", "reg", "plain"};
  return n[(int)m];
}

// Four ranks on GPU 0 with, per rank, a send and a receive area of kCap bytes from
// ncclMemAlloc, registered as the mode says. Fresh per test (windows belong to one comm).
struct Ranks {
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  std::vector<void*> send, recv;
  std::vector<ncclWindow_t> sendWin, recvWin;
  std::vector<void*> sendReg, recvReg;
  Mode mode = Mode::kPlain;
  std::string error;

  explicit Ranks(Mode m) : mode(m) {
    comms.assign(kN, nullptr);
    streams.assign(kN, nullptr);
    send.assign(kN, nullptr);
    recv.assign(kN, nullptr);
    sendWin.assign(kN, nullptr);
    recvWin.assign(kN, nullptr);
    sendReg.assign(kN, nullptr);
    recvReg.assign(kN, nullptr);
    std::vector<int> devs(kN, 0);
    ncclResult_t r = ncclCommInitAll(comms.data(), kN, devs.data());
    if (r != ncclSuccess) {
      error = std::string("ncclCommInitAll: ") + ncclGetErrorString(r);
      return;
    }
    cudaSetDevice(0);
    for (int i = 0; i < kN && error.empty(); i++) {
      if (cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking) != cudaSuccess)
        error = "cudaStreamCreate";
      else if (ncclMemAlloc(&send[i], kCap) != ncclSuccess ||
               ncclMemAlloc(&recv[i], kCap) != ncclSuccess)
        error = "ncclMemAlloc";
    }
    if (error.empty()) error = registerAll();
  }
  std::string registerAll() {
    if (mode == Mode::kPlain) return "";
    if (ncclGroupStart() != ncclSuccess) return "ncclGroupStart";
    for (int i = 0; i < kN; i++) {
      ncclResult_t a, b;
      if (mode == Mode::kRegister) {
        a = ncclCommRegister(comms[i], send[i], kCap, &sendReg[i]);
        b = ncclCommRegister(comms[i], recv[i], kCap, &recvReg[i]);
      } else {
        int f = mode == Mode::kSymWindow ? NCCL_WIN_COLL_SYMMETRIC : NCCL_WIN_DEFAULT;
        a = ncclCommWindowRegister(comms[i], send[i], kCap, &sendWin[i], f);
        b = ncclCommWindowRegister(comms[i], recv[i], kCap, &recvWin[i], f);
      }
      if (a != ncclSuccess || b != ncclSuccess) {
        ncclGroupEnd();
        return std::string("register rank ") + std::to_string(i) + ": " + ncclGetLastError(nullptr);
      }
    }
    ncclResult_t r = ncclGroupEnd();
    if (r != ncclSuccess)
      return std::string("ncclGroupEnd of the registrations: ") + ncclGetErrorString(r) + ": " +
             ncclGetLastError(nullptr);
    for (int i = 0; i < kN; i++)
      if ((mode != Mode::kRegister && (!sendWin[i] || !recvWin[i])) ||
          (mode == Mode::kRegister && (!sendReg[i] || !recvReg[i])))
        return "a handle is still NULL after ncclGroupEnd";
    return "";
  }
  std::string deregisterAll() {
    std::string e;
    for (int i = 0; i < kN; i++) {
      for (ncclWindow_t* w : {&sendWin[i], &recvWin[i]}) {
        if (*w && ncclCommWindowDeregister(comms[i], *w) != ncclSuccess && e.empty())
          e = std::string("ncclCommWindowDeregister: ") + ncclGetLastError(nullptr);
        *w = nullptr;
      }
      for (void** h : {&sendReg[i], &recvReg[i]}) {
        if (*h && ncclCommDeregister(comms[i], *h) != ncclSuccess && e.empty())
          e = std::string("ncclCommDeregister: ") + ncclGetLastError(nullptr);
        *h = nullptr;
      }
    }
    return e;
  }
  ~Ranks() {
    deregisterAll();
    for (int i = 0; i < kN; i++) {
      if (comms[i]) error.empty() ? ncclCommDestroy(comms[i]) : ncclCommAbort(comms[i]);
      if (streams[i]) cudaStreamDestroy(streams[i]);
      if (send[i]) ncclMemFree(send[i]);
      if (recv[i]) ncclMemFree(recv[i]);
    }
  }
  // Waits (bounded) for every rank's stream; checks async errors.
  std::string sync(double timeoutS) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kN; i++) {
      for (;;) {
        cudaError_t e = cudaStreamQuery(streams[i]);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) return std::string("CUDA error ") + cudaGetErrorString(e);
        ncclResult_t a = ncclSuccess;
        if (ncclCommGetAsyncError(comms[i], &a) == ncclSuccess && a != ncclSuccess &&
            a != ncclInProgress)
          return "rank " + std::to_string(i) + ": async error: " + ncclGetLastError(nullptr);
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeoutS)
          return "timed out: rank " + std::to_string(i) + " still running";
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    return "";
  }
};

struct WinCase {
  C coll;
  ncclDataType_t dt;
  Op op;
  size_t count;
  bool inplace;
  int root;
  size_t off;        // elements from the start of every rank's window (the same on all)
  const char* algo;  // MKERNEL_ALGO, nullptr: automatic
  bool zc;           // the zero-copy path must run
};

std::string caseName(const WinCase& c) {
  std::string s = std::string(cName(c.coll)) + "_" + dtInfo(c.dt).name;
  if (isRed(c.coll)) s += std::string("_") + opName(c.op);
  s += "_c" + sizeName(c.count) + (c.inplace ? "_inplace" : "_oop");
  if (rooted(c.coll)) s += "_root" + std::to_string(c.root);
  if (c.off) s += "_off" + std::to_string(c.off);
  if (c.algo) s += std::string("_") + c.algo;
  return s;
}

uint64_t nameSeed(const std::string& name, int rep) {
  uint64_t h = mktest::testSeed() + 0x9e3779b97f4a7c15ull * (uint64_t)rep;
  for (char ch : name) h = (h ^ (uint8_t)ch) * 1099511628211ull;
  return h;
}

// The buffers of one case on rank r (inside its send/receive areas, at the case's offset).
struct Ptrs {
  const void* s = nullptr;
  void* r = nullptr;
  char* out = nullptr;  // the area holding the output (poisoned first)
};
Ptrs ptrsOf(Ranks& R, const WinCase& c, int r) {
  const size_t es = dtInfo(c.dt).size, B = c.count * es, off = c.off * es;
  Ptrs p;
  if (!c.inplace) {
    p.s = (char*)R.send[r] + off;
    p.r = (char*)R.recv[r] + off;
    p.out = (char*)R.recv[r];
    return p;
  }
  char* b = (char*)R.send[r] + off;
  p.out = (char*)R.send[r];
  switch (c.coll) {
    case C::kAllGather:
    case C::kGather:
      p.r = b;
      p.s = b + r * B;
      break;
    case C::kReduceScatter:
    case C::kScatter:
      p.s = b;
      p.r = b + r * B;
      break;
    default:
      p.s = p.r = b;
  }
  return p;
}

ncclResult_t issue(Ranks& R, const WinCase& c, int r, const Ptrs& p, ncclRedOp_t op) {
  ncclComm_t comm = R.comms[r];
  cudaStream_t s = R.streams[r];
  switch (c.coll) {
    case C::kAllReduce:
      return ncclAllReduce(p.s, p.r, c.count, c.dt, op, comm, s);
    case C::kReduceScatter:
      return ncclReduceScatter(p.s, p.r, c.count, c.dt, op, comm, s);
    case C::kReduce:
      return ncclReduce(p.s, p.r, c.count, c.dt, op, c.root, comm, s);
    case C::kAllGather:
      return ncclAllGather(p.s, p.r, c.count, c.dt, comm, s);
    case C::kBroadcast:
      return ncclBroadcast(p.s, p.r, c.count, c.dt, c.root, comm, s);
    case C::kAlltoAll:
      return ncclAlltoAll(p.s, p.r, c.count, c.dt, comm, s);
    case C::kGather:
      return ncclGather(p.s, p.r, c.count, c.dt, c.root, comm, s);
    default:
      return ncclScatter(p.s, p.r, c.count, c.dt, c.root, comm, s);
  }
}

// Runs one case `reps` times on the same buffers with fresh inputs; "" when every output
// (and the poison around it) is right and the zero-copy counter moved as expected.
std::string runCase(Ranks& R, const WinCase& c, int reps = 1) {
  AlgoScope algo(c.algo);
  const std::string name = caseName(c);
  const DtInfo& d = dtInfo(c.dt);
  const size_t es = d.size, cnt = c.count, B = cnt * es;
  const size_t sN = sendElems(c.coll, cnt), rN = recvElems(c.coll, cnt);
  const size_t span = std::max(sN, rN) * es + c.off * es + kSlack;
  if (span > kCap) return name + ": does not fit the windows";
  const bool premul = c.op == Op::kPreMulDev || c.op == Op::kPreMulHost;
  const mk::CollType t = cType(c.coll);
  for (int rep = 0; rep < reps; rep++) {
    const uint64_t seed = nameSeed(name, rep);
    std::vector<HostBuf> in(kN);
    std::vector<const HostBuf*> inPtr(kN);
    std::vector<uint64_t> scal(kN, 0);
    std::vector<Ptrs> p(kN);
    for (int r = 0; r < kN; r++) {
      if (isRed(c.coll)) {
        fillRandom(in[r], c.dt, c.op, sN, seed + 1000003ull * r);
        if (premul) scal[r] = scalarFor(c.dt, seed + 7919ull * r);
      } else {
        fillRandom(in[r], ncclUint8, Op::kSum, sN * es, seed + 7919ull * r);
        in[r].size = es;
      }
      inPtr[r] = &in[r];
      p[r] = ptrsOf(R, c, r);
      if (mktest::syncMemset(p[r].out, 0xCD, span) != cudaSuccess) return "cudaMemset";
      bool needIn =
          !(c.inplace && (c.coll == C::kBroadcast || c.coll == C::kScatter) && r != c.root);
      if (needIn && sN > 0 &&
          mktest::syncMemcpy((void*)p[r].s, in[r].bytes.data(), sN * es, cudaMemcpyHostToDevice) !=
              cudaSuccess)
        return "upload";
    }
    std::vector<ncclRedOp_t> ops(kN, builtinOp(c.op));
    std::vector<void*> devScal(kN, nullptr);
    for (int r = 0; r < kN && premul; r++) {
      ncclResult_t res;
      if (c.op == Op::kPreMulDev) {
        if (cudaMalloc(&devScal[r], 16) != cudaSuccess ||
            mktest::syncMemcpy(devScal[r], &scal[r], es, cudaMemcpyHostToDevice) != cudaSuccess)
          return "scalar upload";
        res = ncclRedOpCreatePreMulSum(&ops[r], devScal[r], c.dt, ncclScalarDevice, R.comms[r]);
      } else {
        uint64_t v = scal[r];
        res = ncclRedOpCreatePreMulSum(&ops[r], &v, c.dt, ncclScalarHostImmediate, R.comms[r]);
      }
      if (res != ncclSuccess) return "ncclRedOpCreatePreMulSum";
    }
    const uint64_t before = mk::zcTakenCount(t);
    if (ncclGroupStart() != ncclSuccess) return "ncclGroupStart";
    for (int r = 0; r < kN; r++) {
      ncclResult_t res = issue(R, c, r, p[r], ops[r]);
      if (res != ncclSuccess) {
        ncclGroupEnd();
        return name + ": rank " + std::to_string(r) + ": " + ncclGetLastError(nullptr);
      }
    }
    if (ncclGroupEnd() != ncclSuccess) return name + ": ncclGroupEnd: " + ncclGetLastError(nullptr);
    const uint64_t taken = mk::zcTakenCount(t) - before;
    std::string e = R.sync(cnt > (1u << 22) ? 120 : 60);
    for (int r = 0; r < kN && premul; r++) {
      ncclRedOpDestroy(ops[r], R.comms[r]);
      if (devScal[r]) cudaFree(devScal[r]);
    }
    if (!e.empty()) {
      R.error = e;
      return name + ": " + e;
    }
    if (taken != (c.zc ? (uint64_t)kN : 0))
      return name + ": zero-copy launches " + std::to_string(taken) + ", expected " +
             std::to_string(c.zc ? kN : 0);
    HostBuf first;
    for (int r = 0; r < kN; r++) {
      if ((c.coll == C::kReduce || c.coll == C::kGather) && r != c.root) continue;
      HostBuf area;
      download(area, p[r].out, span, 1);
      const size_t outOff = (const char*)p[r].r - p[r].out;
      const size_t outBytes = rN * es;
      HostBuf got;
      got.size = es;
      got.bytes.assign(area.bytes.begin() + outOff, area.bytes.begin() + outOff + outBytes);
      std::string err;
      switch (c.coll) {
        case C::kAllReduce:
          if (r > 0)
            err = checkBytes(got, 0, first, 0, outBytes, "bit-identical to rank 0");
          else
            err = checkReduction(c.dt, c.op, inPtr, 0, got, cnt, scal);
          break;
        case C::kReduceScatter:
          err = checkReduction(c.dt, c.op, inPtr, (size_t)r * cnt, got, cnt, scal);
          break;
        case C::kReduce:
          err = checkReduction(c.dt, c.op, inPtr, 0, got, cnt, scal);
          break;
        case C::kBroadcast:
          err = checkBytes(got, 0, in[c.root], 0, B, "broadcast data");
          break;
        case C::kAllGather:
        case C::kGather:
          for (int q = 0; q < kN && err.empty(); q++)
            err = checkBytes(got, q * B, in[q], 0, B, "gathered block");
          break;
        case C::kAlltoAll:
          for (int q = 0; q < kN && err.empty(); q++)
            err = checkBytes(got, q * B, in[q], r * B, B, "block from a peer");
          break;
        case C::kScatter:
          err = checkBytes(got, 0, in[c.root], r * B, B, "scattered block");
          break;
      }
      if (r == 0 && c.coll == C::kAllReduce) first = got;
      // Out of place, nothing around the output was written.
      for (size_t i = 0; i < area.bytes.size() && err.empty() && !c.inplace; i++)
        if ((i < outOff || i >= outOff + outBytes) && area.bytes[i] != 0xCD)
          err = "byte " + std::to_string(i) + " of the receive area outside the output was " +
                "overwritten";
      if (!err.empty())
        return name + " rep " + std::to_string(rep) + ": rank " + std::to_string(r) + ": " + err +
               " (seed " + std::to_string(mktest::testSeed()) + ")";
    }
  }
  return "";
}

// ---- the case lists ------------------------------------------------------------------
const C kAll[] = {C::kAllReduce, C::kReduceScatter, C::kReduce, C::kAllGather,
                  C::kBroadcast, C::kAlltoAll,      C::kGather, C::kScatter};
const size_t kBig = 300007;  // float: 1.2 MB per block, above the zero-copy threshold

std::vector<WinCase> symCases() {
  std::vector<WinCase> v;
  int k = 0;
  for (C c : kAll) {
    // Automatic choice above the threshold: zero-copy, out of place and in place (AlltoAll
    // in place stages: a rank would overwrite blocks still being read).
    for (bool ip : {false, true}) {
      bool zc = !(ip && c == C::kAlltoAll);
      v.push_back({c, ncclFloat32, Op::kSum, kBig, ip, k++ % kN, 0, nullptr, zc});
    }
    // An offset that is not a multiple of 16 bytes (the same on every rank).
    v.push_back({c, ncclBfloat16, Op::kMax, kBig + 1, false, k++ % kN, 3, nullptr, true});
    // Small messages, forced: the first element, odd counts, unaligned tails.
    for (size_t cnt : {(size_t)1, (size_t)7, (size_t)1023, (size_t)65537})
      v.push_back({c, ncclInt8, Op::kSum, cnt, false, k++ % kN, cnt % 5, "zerocopy", true});
    // Below the threshold, automatic: the staging path, same results.
    v.push_back({c, ncclFloat32, Op::kMin, 1023, false, k++ % kN, 0, nullptr, false});
    // Count 0: nothing runs.
    v.push_back({c, ncclFloat32, Op::kSum, 0, false, 0, 0, "zerocopy", false});
  }
  // Every dtype x op of the reductions (forced, small), rotating the collective.
  int i = 0;
  for (ncclDataType_t dt : kAllTypes)
    for (Op op : kAllOps) {
      C c = i % 3 == 0 ? C::kAllReduce : i % 3 == 1 ? C::kReduceScatter : C::kReduce;
      v.push_back({c, dt, op, 4099, (i / 3) % 2 == 1, i % kN, 0, "zerocopy", true});
      i++;
    }
  // Every dtype of the copies.
  i = 0;
  for (ncclDataType_t dt : kAllTypes) {
    C c = kAll[3 + i % 5];
    v.push_back({c, dt, Op::kSum, 777, false, i % kN, 1, "zerocopy", true});
    i++;
  }
  return v;
}

class CollWindow : public ::testing::Test {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
};

TEST_F(CollWindow, EveryCollectiveOnSymmetricWindows) {
  Ranks R(Mode::kSymWindow);
  ASSERT_EQ(R.error, "");
  for (const WinCase& c : symCases()) {
    ASSERT_EQ(runCase(R, c), "");
    if (HasFailure()) break;
  }
}

// Back to back on the same windows, fresh inputs each time (the handshake's call numbers
// advance across collective types).
TEST_F(CollWindow, RepeatedMixedCalls) {
  Ranks R(Mode::kSymWindow);
  ASSERT_EQ(R.error, "");
  int k = 0;
  for (int round = 0; round < 3; round++)
    for (C c : kAll)
      ASSERT_EQ(runCase(R, {c, ncclFloat16, Op::kSum, kBig, false, k++ % kN, 0, nullptr, true}, 2),
                "");
}

// NCCL_WIN_DEFAULT windows and ncclCommRegister buffers (nccl-tests -R 1): offsets may
// differ, so the ranks of this process exchange raw pointers on the device.
TEST_F(CollWindow, DefaultWindowsAndRegisteredBuffers) {
  for (Mode m : {Mode::kDefaultWindow, Mode::kRegister}) {
    SCOPED_TRACE(modeName(m));
    Ranks R(m);
    ASSERT_EQ(R.error, "");
    int k = 0;
    for (C c : kAll) {
      ASSERT_EQ(runCase(R, {c, ncclFloat32, Op::kSum, kBig, false, k++ % kN, 5, nullptr, true}),
                "");
      ASSERT_EQ(runCase(R, {c, ncclUint8, Op::kMax, 333, false, k++ % kN, 0, "zerocopy", true}),
                "");
    }
  }
}

// Unregistered buffers stage, but for the AllReduce, ReduceScatter and AllGather of one process
// on one GPU (zero-copy on any buffers, in place too); so do window buffers once deregistered.
TEST_F(CollWindow, PlainAndDeregisteredBuffers) {
  for (Mode m : {Mode::kPlain, Mode::kSymWindow}) {
    SCOPED_TRACE(modeName(m));
    Ranks R(m);
    ASSERT_EQ(R.error, "");
    if (m == Mode::kSymWindow) ASSERT_EQ(R.deregisterAll(), "");
    int k = 0;
    for (C c : kAll)
      ASSERT_EQ(runCase(R, {c, ncclFloat32, Op::kSum, kBig, false, k++ % kN, 0, nullptr,
                            c == C::kAllReduce || c == C::kReduceScatter || c == C::kAllGather}),
                "");
    for (C c : {C::kAllReduce, C::kReduceScatter, C::kAllGather})
      ASSERT_EQ(runCase(R, {c, ncclBfloat16, Op::kSum, kBig, true, 0, 0, nullptr, true}), "");
  }
}

// Captured in a CUDA graph on window buffers and replayed with fresh inputs.
TEST_F(CollWindow, GraphReplays) {
  Ranks R(Mode::kSymWindow);
  ASSERT_EQ(R.error, "");
  for (C c : {C::kAllGather, C::kReduceScatter, C::kBroadcast, C::kAllReduce}) {
    WinCase wc{c, ncclFloat32, Op::kSum, kBig, false, 1, 0, nullptr, true};
    SCOPED_TRACE(caseName(wc));
    std::vector<Ptrs> p(kN);
    for (int r = 0; r < kN; r++) p[r] = ptrsOf(R, wc, r);
    std::vector<cudaGraph_t> g(kN, nullptr);
    std::vector<cudaGraphExec_t> x(kN, nullptr);
    for (int r = 0; r < kN; r++)
      ASSERT_EQ(cudaStreamBeginCapture(R.streams[r], cudaStreamCaptureModeThreadLocal),
                cudaSuccess);
    const uint64_t before = mk::zcTakenCount(cType(c));
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < kN; r++) ASSERT_EQ(issue(R, wc, r, p[r], ncclSum), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    EXPECT_EQ(mk::zcTakenCount(cType(c)) - before, (uint64_t)kN);
    std::vector<cudaError_t> ended(kN);
    for (int r = 0; r < kN; r++) ended[r] = cudaStreamEndCapture(R.streams[r], &g[r]);
    for (int r = 0; r < kN; r++) ASSERT_EQ(ended[r], cudaSuccess);
    for (int r = 0; r < kN; r++) ASSERT_EQ(cudaGraphInstantiate(&x[r], g[r], 0), cudaSuccess);
    const size_t es = 4, sN = sendElems(c, kBig), rN = recvElems(c, kBig);
    for (int it = 0; it < 3; it++) {
      std::vector<HostBuf> in(kN);
      std::vector<const HostBuf*> inPtr(kN);
      for (int r = 0; r < kN; r++) {
        fillRandom(in[r], ncclFloat32, Op::kSum, sN, nameSeed(caseName(wc), it) + 31ull * r);
        inPtr[r] = &in[r];
        ASSERT_EQ(mktest::syncMemset(p[r].r, 0xCD, rN * es), cudaSuccess);
        upload((void*)p[r].s, in[r], 0, sN);
      }
      for (int r = 0; r < kN; r++) ASSERT_EQ(cudaGraphLaunch(x[r], R.streams[r]), cudaSuccess);
      ASSERT_EQ(R.sync(60), "") << "replay " << it;
      for (int r = 0; r < kN; r++) {
        HostBuf got;
        download(got, p[r].r, rN, es);
        std::string e;
        if (c == C::kAllGather)
          for (int q = 0; q < kN && e.empty(); q++)
            e = checkBytes(got, q * kBig * es, in[q], 0, kBig * es, "gathered block");
        else if (c == C::kBroadcast)
          e = checkBytes(got, 0, in[wc.root], 0, kBig * es, "broadcast data");
        else
          e = checkReduction(ncclFloat32, Op::kSum, inPtr, c == C::kReduceScatter ? r * kBig : 0,
                             got, kBig, 0);
        ASSERT_EQ(e, "") << "replay " << it << " rank " << r;
      }
    }
    for (int r = 0; r < kN; r++) {
      cudaGraphExecDestroy(x[r]);
      cudaGraphDestroy(g[r]);
    }
  }
}

// Bad input: ncclInvalidArgument with a message, and the comm stays usable.
TEST_F(CollWindow, ArgumentErrors) {
  Ranks R(Mode::kPlain);
  ASSERT_EQ(R.error, "");
  ncclComm_t c0 = R.comms[0];
  ncclWindow_t w = nullptr;
  auto expectInvalid = [&](ncclResult_t got, const char* what, const char* needle) {
    EXPECT_EQ(got, ncclInvalidArgument) << what;
    std::string msg = ncclGetLastError(nullptr);
    EXPECT_NE(msg.find(needle), std::string::npos) << what << ": " << msg;
  };
  std::vector<char> host(8192);
  expectInvalid(ncclCommWindowRegister(c0, host.data(), host.size(), &w, 0), "malloc memory",
                "device memory");
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 8192), cudaSuccess);
  expectInvalid(ncclCommWindowRegister(c0, pinned, 8192, &w, 0), "pinned host", "host memory");
  void* managed = nullptr;
  ASSERT_EQ(cudaMallocManaged(&managed, 8192), cudaSuccess);
  expectInvalid(ncclCommWindowRegister(c0, managed, 8192, &w, 0), "managed", "managed memory");
  expectInvalid(ncclCommWindowRegister(c0, R.send[0], 4096, nullptr, 0), "null win", "win is NULL");
  // As NCCL 2.28.9: nothing to register (0 bytes) is no error, and no window.
  w = reinterpret_cast<ncclWindow_t>(&host);
  EXPECT_EQ(ncclCommWindowRegister(c0, R.send[0], 0, &w, 0), ncclSuccess) << "size 0";
  EXPECT_EQ(w, nullptr) << "size 0 gives no window";
  w = reinterpret_cast<ncclWindow_t>(&host);
  expectInvalid(ncclCommWindowRegister(c0, R.send[0], 4096, &w, 0x80), "flags", "winFlags");
  EXPECT_EQ(w, nullptr) << "a refused registration leaves no window";
  cudaFreeHost(pinned);
  cudaFree(managed);
  // Windows of all four ranks, then misuse of the handles.
  std::vector<ncclWindow_t> win(kN, nullptr);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kN; r++)
    ASSERT_EQ(ncclCommWindowRegister(R.comms[r], R.send[r], kCap, &win[r], NCCL_WIN_COLL_SYMMETRIC),
              ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < kN; r++) ASSERT_NE(win[r], nullptr);
  expectInvalid(ncclCommWindowDeregister(R.comms[1], win[0]), "another comm's window",
                "another communicator");
  int junk = 0;
  expectInvalid(ncclCommWindowDeregister(c0, reinterpret_cast<ncclWindow_t>(&junk)), "junk",
                "not a window");
  EXPECT_EQ(ncclCommWindowDeregister(c0, nullptr), ncclSuccess) << "NULL: a no-op, as NCCL";
  for (int r = 0; r < kN; r++) EXPECT_EQ(ncclCommWindowDeregister(R.comms[r], win[r]), ncclSuccess);
  expectInvalid(ncclCommWindowDeregister(c0, win[0]), "double deregister", "not a window");
  // Still usable: a zero-copy-sized AllGather on plain buffers (zero-copy in one process).
  ASSERT_EQ(runCase(R, {C::kAllGather, ncclFloat32, Op::kSum, kBig, false, 0, 0, nullptr, true}),
            "");
}

// Register / use / deregister 30 times: no device memory, fd or handle left behind.
TEST_F(CollWindow, CyclesDoNotLeak) {
  Ranks R(Mode::kPlain);
  ASSERT_EQ(R.error, "");
  auto cycle = [&](int i) -> std::string {
    std::vector<ncclWindow_t> ws(kN, nullptr), wr(kN, nullptr);
    if (ncclGroupStart() != ncclSuccess) return "group";
    for (int r = 0; r < kN; r++) {
      ncclCommWindowRegister(R.comms[r], R.send[r], kCap, &ws[r], NCCL_WIN_COLL_SYMMETRIC);
      ncclCommWindowRegister(R.comms[r], R.recv[r], kCap, &wr[r], NCCL_WIN_COLL_SYMMETRIC);
    }
    if (ncclGroupEnd() != ncclSuccess) return std::string("register: ") + ncclGetLastError(nullptr);
    std::string e =
        runCase(R, {C::kAllGather, ncclInt32, Op::kSum, 70001, false, 0, 0, nullptr, true});
    for (int r = 0; r < kN; r++)
      if (ncclCommWindowDeregister(R.comms[r], ws[r]) != ncclSuccess ||
          ncclCommWindowDeregister(R.comms[r], wr[r]) != ncclSuccess)
        return "deregister";
    return e.empty() ? "" : "cycle " + std::to_string(i) + ": " + e;
  };
  ASSERT_EQ(cycle(0), "");  // warm-up
  size_t free0 = 0, free1 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  const int fds0 = mktest::countOpenFds();
  for (int i = 1; i <= 30; i++) ASSERT_EQ(cycle(i), "");
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_GE(free1 + (32u << 20), free0) << "device memory lost over 30 cycles";
  EXPECT_EQ(mktest::countOpenFds(), fds0);
}

// ncclGroupSimulateEnd prices a group by the paths its operations would take: the ReduceScatter
// and AllGather of ranks of one process on one GPU run zero-copy on any buffers (above), so the
// estimate is the zero-copy one (collUs kZeroCopy), not the staged copies' (kDirect). Nothing
// is launched.
TEST(CollSimulate, ZeroCopyReduceScatterAndAllGatherEstimates) {
  MKTEST_REQUIRE_GPU();
  Clique& q = clique(4);
  ASSERT_TRUE(q.ok) << q.why;
  const size_t count = 16u << 20;  // bf16 elements of a rank's block: 32 MiB
  const uint64_t bytes = (uint64_t)count * 2;
  void* send = nullptr;
  void* recv = nullptr;
  ASSERT_EQ(cudaMalloc(&send, 4 * bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&recv, 4 * bytes), cudaSuccess);
  for (int rs = 1; rs >= 0; --rs) {
    SCOPED_TRACE(rs ? "ReduceScatter" : "AllGather");
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 4; ++r)
      ASSERT_EQ(
          rs ? ncclReduceScatter(send, recv, count, ncclBfloat16, ncclSum, q.comms[r], q.streams[r])
             : ncclAllGather(send, recv, count, ncclBfloat16, q.comms[r], q.streams[r]),
          ncclSuccess);
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    ASSERT_EQ(ncclGroupSimulateEnd(&sim), ncclSuccess) << ncclGetLastError(nullptr);
    const mk::CollType t = rs ? mk::CollType::kReduceScatter : mk::CollType::kAllGather;
    const double zc = mk::collUs(t, mk::Algo::kZeroCopy, bytes, 4);
    EXPECT_NEAR(sim.estimatedTime, zc, 1e-4 * zc);
    EXPECT_LT(sim.estimatedTime, mk::collUs(t, mk::Algo::kDirect, bytes, 4));
  }
  EXPECT_EQ(cudaFree(send), cudaSuccess);
  EXPECT_EQ(cudaFree(recv), cudaSuccess);
}

}  // namespace
