// Every collective and send/recv on comms spanning virtual nodes (MKERNEL_EMULATE_NODES):
// rail-aligned forms on 2x2, 2x4, 4x2, flat forms on 3 ranks over 2 nodes and 5 over 2.
// Random inputs, poisoned outputs, every element checked (double-precision reference for
// reductions, exact for integers, bytes for copies), reductions bit-identical across ranks;
// 20 back-to-back mixed operations; one CUDA graph replayed several times.
#include <cstdint>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/test_coll_util.h"
#include "gpu/test_devcomm_util.h"

using namespace colltest;

namespace {

enum class K {
  kAllGather,
  kBroadcast,
  kReduce,
  kReduceScatter,
  kAllReduce,
  kAlltoAll,
  kGather,
  kScatter,
  kSendRecv
};
const char* kName[] = {"AllGather", "Broadcast", "Reduce",  "ReduceScatter", "AllReduce",
                       "AlltoAll",  "Gather",    "Scatter", "SendRecv"};
bool isRed(K k) {
  return k == K::kReduce || k == K::kReduceScatter || k == K::kAllReduce;
}

// One operation on every rank: buffers, inputs, issue, check.
struct OpCase {
  K k;
  ncclDataType_t dt;
  Op op;
  size_t c;  // NCCL's count
  bool inplace;
  int root, off;  // off: elements added to the user pointers (not 16-byte aligned)
  uint64_t seed;
  int n = 0;
  size_t es = 0;
  std::vector<HostBuf> in;
  std::vector<DevBuf> sendb, recvb;
  std::vector<ncclRedOp_t> ops;
  std::vector<DevBuf> scal;
  std::vector<uint64_t> scalars;  // PreMulSum: every rank its own (as nccl-tests)

  std::string name() const {
    return std::string(kName[(int)k]) + " " + dtInfo(dt).name + " " + (isRed(k) ? opName(op) : "") +
           " count " + std::to_string(c) + (inplace ? " in-place" : "") + " root " +
           std::to_string(root) + " off " + std::to_string(off);
  }
  size_t inElems(int r) const {
    if (k == K::kReduceScatter || k == K::kAlltoAll || (k == K::kScatter && r == root))
      return n * c;
    return k == K::kSendRecv ? 2 * c : c;
  }
  size_t outElems() const {
    if (k == K::kAllGather || k == K::kAlltoAll || k == K::kGather) return n * c;
    return k == K::kSendRecv ? 2 * c : c;
  }
  bool gatherLike() const { return k == K::kAllGather || k == K::kGather; }
  bool scatterLike() const { return k == K::kReduceScatter || k == K::kScatter; }
  // In-place layouts as NCCL defines them; the input is uploaded where sendPtr points.
  char* sendPtr(int r) const {
    if (inplace && gatherLike()) return recvb[r].at((off + r * c) * es);
    if (inplace && !scatterLike()) return recvb[r].at(off * es);
    return sendb[r].at(off * es);
  }
  char* recvPtr(int r) const {
    if (inplace && scatterLike()) return sendb[r].at((off + r * c) * es);
    return recvb[r].at(off * es);
  }

  void prepare(const std::vector<ncclComm_t>& comms) {
    n = (int)comms.size();
    es = dtInfo(dt).size;
    in.assign(n, HostBuf());
    scalars.assign(n, 0);
    for (int r = 0; r < n; r++) scalars[r] = scalarFor(dt, seed + 7919 * r);
    for (int r = 0; r < n; r++) {
      const size_t sb = (off + n * c * 2 + 1) * es, rb = (off + n * c * 2 + 1) * es;
      sendb.emplace_back(sb);
      recvb.emplace_back(rb);
      mktest::syncMemset(sendb[r].base, 0x5A, sb);
      mktest::syncMemset(recvb[r].base, 0xA5, rb);  // poison
      fillRandom(in[r], dt, op, inElems(r), seed + 977 * r);
      if (inElems(r)) upload(sendPtr(r), in[r], 0, inElems(r));
      ops.push_back(ncclSum);
      if (!isRed(k)) continue;
      if (op == Op::kPreMulHost || op == Op::kPreMulDev) {
        uint64_t s = scalars[r];
        void* sp = &s;
        ncclScalarResidence_t res = ncclScalarHostImmediate;
        if (op == Op::kPreMulDev) {
          scal.emplace_back(8);
          mktest::syncMemcpy(scal.back().base, &s, 8, cudaMemcpyHostToDevice);
          sp = scal.back().base, res = ncclScalarDevice;
        }
        EXPECT_EQ(ncclRedOpCreatePreMulSum(&ops[r], sp, dt, res, comms[r]), ncclSuccess);
      } else {
        ops[r] = op == Op::kProd  ? ncclProd
                 : op == Op::kMax ? ncclMax
                 : op == Op::kMin ? ncclMin
                 : op == Op::kAvg ? ncclAvg
                                  : ncclSum;
      }
    }
    cudaDeviceSynchronize();
  }
  void release(const std::vector<ncclComm_t>& comms) {
    for (int r = 0; r < n && isRed(k); r++)
      if (op == Op::kPreMulHost || op == Op::kPreMulDev) ncclRedOpDestroy(ops[r], comms[r]);
  }
  // Issues rank r's part (inside the caller's group).
  ncclResult_t issue(int r, ncclComm_t comm, cudaStream_t s) const {
    const void* sp = sendPtr(r);
    void* rp = recvPtr(r);
    switch (k) {
      case K::kAllGather:
        return ncclAllGather(sp, rp, c, dt, comm, s);
      case K::kBroadcast:
        return ncclBroadcast(sp, rp, c, dt, root, comm, s);
      case K::kReduce:
        return ncclReduce(sp, rp, c, dt, ops[r], root, comm, s);
      case K::kReduceScatter:
        return ncclReduceScatter(sp, rp, c, dt, ops[r], comm, s);
      case K::kAllReduce:
        return ncclAllReduce(sp, rp, c, dt, ops[r], comm, s);
      case K::kAlltoAll:
        return ncclAlltoAll(sp, rp, c, dt, comm, s);
      case K::kGather:
        return ncclGather(sp, rp, c, dt, root, comm, s);
      case K::kScatter:
        return ncclScatter(sp, rp, c, dt, root, comm, s);
      case K::kSendRecv:
        break;
    }
    // Message 0 to r+1, message 1 to r+2 (itself when n == 2); odd ranks post the receives
    // first: any order must work.
    const char* sc = static_cast<const char*>(sp);
    char* rc = static_cast<char*>(rp);
    for (int pass = 0; pass < 2; pass++) {
      if ((pass == 0) == (r % 2 == 0)) {
        for (int m = 0; m < 2; m++) {
          ncclResult_t e = ncclSend(sc + m * c * es, c, dt, (r + 1 + m) % n, comm, s);
          if (e != ncclSuccess) return e;
        }
      } else {
        for (int m = 0; m < 2; m++) {
          ncclResult_t e = ncclRecv(rc + m * c * es, c, dt, (r + 2 * n - 1 - m) % n, comm, s);
          if (e != ncclSuccess) return e;
        }
      }
    }
    return ncclSuccess;
  }
  // "" or what differs (rank, element index, got / expected).
  std::string check() const {
    if (c == 0) return "";
    std::vector<const HostBuf*> inp;
    for (auto& b : in) inp.push_back(&b);
    HostBuf first;
    for (int r = 0; r < n; r++) {
      if ((k == K::kReduce || k == K::kGather) && r != root) continue;
      HostBuf got;
      download(got, recvPtr(r), outElems(), es);
      std::string bad;
      const std::string who = "rank " + std::to_string(r) + ": ";
      if (isRed(k)) {
        bad = checkReduction(dt, op, inp, k == K::kReduceScatter ? r * c : 0, got, c, scalars);
        if (bad.empty() && k == K::kAllReduce) {
          if (first.bytes.empty()) first = got;
          if (got.bytes != first.bytes) bad = "differs from the lowest rank's bits";
        }
      }
      for (int p = 0; p < n && bad.empty(); p++) {
        if (k == K::kAllGather || k == K::kGather)
          bad = checkBytes(got, p * c * es, in[p], 0, c * es, "block");
        else if (k == K::kAlltoAll)
          bad = checkBytes(got, p * c * es, in[p], r * c * es, c * es, "block");
        else if (p > 0)
          break;
        else if (k == K::kBroadcast)
          bad = checkBytes(got, 0, in[root], 0, c * es, "data");
        else if (k == K::kScatter)
          bad = checkBytes(got, 0, in[root], r * c * es, c * es, "data");
        else if (k == K::kSendRecv) {
          bad = checkBytes(got, 0, in[(r + n - 1) % n], 0, c * es, "message from r-1");
          if (bad.empty())
            bad = checkBytes(got, c * es, in[(r + 2 * n - 2) % n], c * es, c * es,
                             "message from r-2");
        }
        if (!bad.empty()) bad = "from rank " + std::to_string(p) + ": " + bad;
      }
      if (!bad.empty()) return who + bad;
    }
    return "";
  }
};

// Issues cases as one group each, back to back, then waits once and checks them all.
void runCases(dctest::VnodeComms& h, std::vector<OpCase>& cases) {
  for (auto& oc : cases) oc.prepare(h.comms);
  for (auto& oc : cases) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < h.n; r++)
      ASSERT_EQ(oc.issue(r, h.comms[r], h.streams[r]), ncclSuccess) << oc.name() << " rank " << r;
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << oc.name();
  }
  std::string err = h.sync();
  ASSERT_EQ(err, "") << "after " << cases.size() << " operations, first " << cases[0].name();
  for (auto& oc : cases) EXPECT_EQ(oc.check(), "") << oc.name();
  for (auto& oc : cases) oc.release(h.comms);
}

// Every dtype appears with a rotating op, so all 12 dtypes and all 7 ops are covered.
const ncclDataType_t kDts[12] = {ncclFloat32, ncclFloat16, ncclBfloat16,   ncclFloat64,
                                 ncclInt32,   ncclUint8,   ncclInt8,       ncclUint32,
                                 ncclInt64,   ncclUint64,  ncclFloat8e4m3, ncclFloat8e5m2};

struct Shape {
  int nodes, ranks;
};

class HierOps : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    MKTEST_REQUIRE_GPU();
    ASSERT_EQ(h.init(GetParam().nodes, GetParam().ranks), ncclSuccess);
  }
  dctest::VnodeComms h;
};

TEST_P(HierOps, EveryOperationSmallCounts) {
  const uint64_t seed = mktest::testSeed();
  const int n = h.n;
  int i = 0;
  for (int ki = 0; ki <= (int)K::kSendRecv; ki++) {
    const K k = (K)ki;
    for (size_t c : {size_t(0), size_t(1), size_t(7), size_t(1023)}) {
      for (int rep = 0; rep < (isRed(k) ? 12 : 2); rep++, i++) {
        for (bool inplace : {false, true}) {
          if (inplace && (k == K::kAlltoAll || k == K::kSendRecv)) continue;
          std::vector<OpCase> one;
          one.push_back(OpCase{k, kDts[(rep + ki) % 12], kAllOps[(rep + c) % 7], c, inplace,
                               (i * 5) % n, i % 3 == 1 ? 1 : 0, seed + 31 * i});
          runCases(h, one);
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST_P(HierOps, EveryOperationLargeCount) {
  const size_t c = (1u << 20) + 3;  // several chunks of every channel and of the AllReduce
  const uint64_t seed = mktest::testSeed() + 5;
  for (int ki = 0; ki <= (int)K::kSendRecv; ki++) {
    const K k = (K)ki;
    const ncclDataType_t dt = isRed(k) ? (ki % 2 ? ncclFloat32 : ncclBfloat16) : ncclUint8;
    const bool inplace = ki % 2 == 0 && k != K::kAlltoAll && k != K::kSendRecv;
    std::vector<OpCase> one;
    one.push_back(
        OpCase{k, dt, ki == 2 ? Op::kAvg : Op::kSum, c, inplace, h.n - 1, ki % 3 == 0, seed + ki});
    runCases(h, one);
    if (HasFailure()) return;
  }
}

// PreMulSum with a different scalar on every rank (as nccl-tests), several chunks per
// channel: raw inputs leave pre-scaled by their owner, partials are not scaled again.
TEST_P(HierOps, PreMulSumPerRankScalarsLargeCount) {
  const uint64_t seed = mktest::testSeed() + 23;
  const ncclDataType_t dts[3] = {ncclFloat32, ncclBfloat16, ncclInt32};
  int i = 0;
  for (K k : {K::kReduce, K::kReduceScatter, K::kAllReduce}) {
    for (Op op : {Op::kPreMulHost, Op::kPreMulDev}) {
      std::vector<OpCase> one;
      one.push_back(
          OpCase{k, dts[i % 3], op, 100003, i % 2 == 0, (i * 3) % h.n, i % 3 == 2, seed + i});
      i++;
      runCases(h, one);
      if (HasFailure()) return;
    }
  }
}

TEST_P(HierOps, TwentyBackToBackMixed) {
  const uint64_t seed = mktest::testSeed() + 11;
  std::vector<OpCase> cases;
  for (int i = 0; i < 20; i++) {
    const K k = (K)(i % 9);
    const size_t c = i % 4 == 3 ? 70001 : 1 + 37 * i;
    cases.push_back(OpCase{k, kDts[i % 12], kAllOps[i % 7], c,
                           i % 2 == 1 && k != K::kAlltoAll && k != K::kSendRecv, i % h.n, i % 2,
                           seed + i});
  }
  runCases(h, cases);
}

// Small AllReduces (at most 4 KiB without PreMulSum take the small kernel, which skips the
// all-gather when a node has several ranks; up to 8 bytes its rail put rides in the proxy
// command) and general ones back to back with no synchronisation between them: both kernels
// share the sequence word, banks, signals and acks, so their calls must interleave on the
// wire. Counts: 1 and 2 floats, 7 and 8 bytes (inline), 1023 floats (4092 bytes, staged),
// 70001 bf16 and 5000 halves (general).
TEST_P(HierOps, SmallAndGeneralAllReduceBackToBack) {
  const uint64_t seed = mktest::testSeed() + 13;
  std::vector<OpCase> cases;
  const size_t counts[] = {1, 1023, 7, 70001, 2, 1, 5000, 8};
  const ncclDataType_t dts[] = {ncclFloat32, ncclFloat32, ncclInt8,    ncclBfloat16,
                                ncclFloat32, ncclFloat64, ncclFloat16, ncclUint8};
  for (int i = 0; i < 8; i++)
    cases.push_back(OpCase{K::kAllReduce, dts[i], i % 3 == 2 ? Op::kAvg : Op::kSum, counts[i],
                           i == 2 || i == 6, 0, 0, seed + i});
  runCases(h, cases);
}

// The small kernel skips its slot acquires when the previous AllReduce had one chunk
// (hier_allreduce.cu: the peers' puts of that chunk imply the acks); after a general call of
// several chunks it must wait for them. Small calls right after multi-chunk ones (6-8 MB
// floats: two or more chunks of the default 32 MiB window at every shape here), and runs of
// small ones, back to back with no synchronisation: a skipped wait that was needed would
// let a rail or local put overwrite a bank its owner still reads (wrong sums).
TEST_P(HierOps, SmallAfterMultiChunkAllReduce) {
  const uint64_t seed = mktest::testSeed() + 19;
  const size_t counts[] = {1, 1500000, 3, 2, 1, 1750001, 1000, 1, 2000000, 5, 7, 1023};
  const ncclDataType_t dts[] = {ncclFloat32, ncclFloat32, ncclInt32,   ncclFloat64,
                                ncclUint8,   ncclFloat32, ncclFloat16, ncclInt64,
                                ncclFloat32, ncclInt32,   ncclInt8,    ncclFloat32};
  std::vector<OpCase> cases;
  for (int i = 0; i < 12; i++)
    cases.push_back(OpCase{K::kAllReduce, dts[i], i % 4 == 3 ? Op::kMax : Op::kSum, counts[i],
                           i == 4, 0, 0, seed + i});
  runCases(h, cases);
}

// The small kernel's edges, back to back with no synchronisation (helper-50's review): 9
// bytes (the first staged rail put), 24-byte fp64 in place at an odd offset, exactly 4096
// bytes, the first general sizes above it (1025 floats, 513 doubles), several staged small
// calls in a row, in-place Max / Avg at offsets.
TEST_P(HierOps, SmallKernelEdgesBackToBack) {
  const uint64_t seed = mktest::testSeed() + 17;
  struct E {
    ncclDataType_t dt;
    Op op;
    size_t c;
    bool inplace;
    int off;
  };
  const E es[] = {
      {ncclUint8, Op::kSum, 9, false, 0},        {ncclFloat64, Op::kAvg, 3, true, 1},
      {ncclFloat32, Op::kMax, 1024, false, 0},   {ncclFloat32, Op::kSum, 1025, false, 0},
      {ncclFloat64, Op::kMin, 513, true, 1},     {ncclBfloat16, Op::kAvg, 2048, true, 1},
      {ncclInt32, Op::kSum, 1000, false, 0},     {ncclInt32, Op::kMax, 999, true, 0},
      {ncclInt32, Op::kSum, 1001, false, 1},     {ncclFloat16, Op::kProd, 7, false, 0},
      {ncclFloat8e4m3, Op::kMax, 4000, true, 3}, {ncclUint64, Op::kSum, 512, false, 0}};
  std::vector<OpCase> cases;
  int i = 0;
  for (const E& e : es) {
    cases.push_back(OpCase{K::kAllReduce, e.dt, e.op, e.c, e.inplace, 0, e.off, seed + i});
    i++;
  }
  runCases(h, cases);
}

TEST_P(HierOps, GraphReplayedFourTimes) {
  const int n = h.n;
  const uint64_t seed = mktest::testSeed() + 17;
  // In-place only where a replay leaves the inputs as they were (Broadcast).
  std::vector<OpCase> cases;
  cases.push_back(OpCase{K::kAllGather, ncclFloat32, Op::kSum, 3001, false, 0, 0, seed});
  cases.push_back(OpCase{K::kReduceScatter, ncclInt32, Op::kSum, 5000, false, 0, 1, seed + 1});
  cases.push_back(OpCase{K::kAllReduce, ncclFloat32, Op::kMax, 70001, false, 0, 0, seed + 2});
  cases.push_back(OpCase{K::kSendRecv, ncclUint8, Op::kSum, 9999, false, 0, 0, seed + 3});
  cases.push_back(OpCase{K::kBroadcast, ncclFloat64, Op::kSum, 777, true, n - 1, 0, seed + 4});
  cases.push_back(
      OpCase{K::kReduceScatter, ncclFloat32, Op::kPreMulDev, 20001, false, 0, 0, seed + 5});
  for (auto& oc : cases) oc.prepare(h.comms);
  std::vector<cudaGraph_t> graphs(n);
  std::vector<cudaGraphExec_t> execs(n);
  for (int r = 0; r < n; r++)
    ASSERT_EQ(cudaStreamBeginCapture(h.streams[r], cudaStreamCaptureModeThreadLocal), cudaSuccess);
  for (auto& oc : cases) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; r++) ASSERT_EQ(oc.issue(r, h.comms[r], h.streams[r]), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  }
  std::vector<cudaError_t> ended(n);
  for (int r = 0; r < n; r++) ended[r] = cudaStreamEndCapture(h.streams[r], &graphs[r]);
  for (int r = 0; r < n; r++) ASSERT_EQ(ended[r], cudaSuccess) << "rank " << r;
  for (int r = 0; r < n; r++) ASSERT_EQ(cudaGraphInstantiate(&execs[r], graphs[r], 0), cudaSuccess);
  for (int it = 0; it < 4 && !HasFailure(); it++) {
    for (auto& oc : cases)  // poison the outputs that are not also inputs
      for (int r = 0; r < n; r++)
        if (!oc.inplace) mktest::syncMemset(oc.recvb[r].base, 0xA5 ^ it, oc.recvb[r].bytes);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int r = 0; r < n; r++) ASSERT_EQ(cudaGraphLaunch(execs[r], h.streams[r]), cudaSuccess);
    ASSERT_EQ(h.sync(), "") << "replay " << it;
    for (auto& oc : cases) EXPECT_EQ(oc.check(), "") << oc.name() << " replay " << it;
  }
  for (int r = 0; r < n; r++) {
    cudaGraphExecDestroy(execs[r]);
    cudaGraphDestroy(graphs[r]);
  }
  for (auto& oc : cases) oc.release(h.comms);
}

// MKERNEL_PROXY_INLINE_CMD=2 (the default since session 18; set before the comms exist: it
// is read at init): rail puts of 9..64 bytes ride in the proxy command plus a continuation
// slot; =1 (only up to 8 bytes inline, 9..64 staged) keeps its cases too. Every size 1..80 bytes
// (both sides of 8 and of 64) of AllReduce (small kernel) and SendRecv (small puts), several
// dtypes, back to back in batches with no synchronisation between calls, every element
// checked against the reference. Rings of 2 and 3 slots (MKERNEL_PROXY_RING_SLOTS) make every
// group of two slots wait for its last slot and wrap around the slot array (header in the last
// slot, continuation in slot 0), which the default 1024 slots may never do.
struct InlineShape {
  int nodes, ranks, ringSlots;
  int inlineCmd = 2;
};
class HierInline64 : public ::testing::TestWithParam<InlineShape> {
 protected:
  void SetUp() override {
    MKTEST_REQUIRE_GPU();
    ASSERT_EQ(h.init(GetParam().nodes, GetParam().ranks), ncclSuccess);
  }
  mktest::ScopedEnv env{"MKERNEL_PROXY_INLINE_CMD", std::to_string(GetParam().inlineCmd).c_str()};
  mktest::ScopedEnv ring{"MKERNEL_PROXY_RING_SLOTS", std::to_string(GetParam().ringSlots).c_str()};
  dctest::VnodeComms h;  // after the environment: built with it, destroyed before it
};

TEST_P(HierInline64, AllReduceAndSendRecv1To80Bytes) {
  const uint64_t seed = mktest::testSeed() + 41;
  std::vector<OpCase> cases;
  int i = 0;
  for (size_t b = 1; b <= 80; b++) {
    // The widest dtype that divides b, rotating so every width sees sizes around 8 and 64.
    ncclDataType_t dt = ncclUint8;
    if (b % 8 == 0 && b % 3 != 0)
      dt = b % 16 == 0 ? ncclFloat64 : ncclInt64;
    else if (b % 4 == 0)
      dt = b % 8 == 4 ? ncclFloat32 : ncclInt32;
    else if (b % 2 == 0)
      dt = b % 4 == 2 ? ncclBfloat16 : ncclFloat16;
    const size_t c = b / dtInfo(dt).size;
    cases.push_back(OpCase{K::kAllReduce, dt, i % 3 == 2 ? Op::kMax : Op::kSum, c, b % 5 == 0, 0,
                           (int)(b % 2), seed + i});
    i++;
    cases.push_back(
        OpCase{K::kSendRecv, ncclUint8, Op::kSum, b, false, 0, (int)(b % 3 == 1), seed + i});
    i++;
    if (cases.size() >= 40) {
      runCases(h, cases);
      if (HasFailure()) return;
      cases.clear();
    }
  }
  if (!cases.empty()) runCases(h, cases);
}

// 2over2: one rank per node (2x1); 4over2: 2x2; 6over2: odd local count; ring of 1024 slots
// (the default), then of 2 and 3 (wrap-around and back-pressure on every group).
INSTANTIATE_TEST_SUITE_P(Shapes, HierInline64,
                         ::testing::Values(InlineShape{2, 2, 1024}, InlineShape{2, 4, 1024},
                                           InlineShape{2, 6, 1024}, InlineShape{2, 2, 2},
                                           InlineShape{2, 4, 3}, InlineShape{2, 2, 1024, 1},
                                           InlineShape{2, 4, 1024, 1}, InlineShape{2, 4, 3, 1}),
                         [](const ::testing::TestParamInfo<InlineShape>& i) {
                           return std::to_string(i.param.ranks) + "over" +
                                  std::to_string(i.param.nodes) + "ring" +
                                  std::to_string(i.param.ringSlots) +
                                  (i.param.inlineCmd == 2 ? "" : "inl1");
                         });

INSTANTIATE_TEST_SUITE_P(Shapes, HierOps,
                         // 2over2, 3over3: one rank per node (ReduceScatter's direct form);
                         // 6over2: two nodes of three (its two-launch form, odd local count).
                         ::testing::Values(Shape{2, 4}, Shape{2, 8}, Shape{4, 8}, Shape{2, 3},
                                           Shape{2, 5}, Shape{2, 2}, Shape{3, 3}, Shape{2, 6}),
                         [](const ::testing::TestParamInfo<Shape>& i) {
                           return std::to_string(i.param.ranks) + "over" +
                                  std::to_string(i.param.nodes);
                         });

}  // namespace
