// One thread per rank, every rank on GPU 0 (issue 11, point 2): each thread creates its comm
// with ncclCommInitRank from one shared id and drives it on its own non-blocking stream, the
// way nccl-tests -t and one-thread-per-device frameworks do. Between calls the threads do what
// nccl-tests does in its data initialisation and check: cudaDeviceSynchronize (and cudaFree,
// cudaFreeHost), a random skew apart. Before the host rendezvous of coll/rendezvous.h a rank's
// kernel could spin for a peer whose thread sat in such a device-wide synchronisation, which
// waited for that kernel: the deadlock nccl-tests -t 2 -g 1 showed (here ended after
// MKERNEL_TIMEOUT_MS=20 s by the kernels' timeout, so the tests fail instead of hanging). The
// send/recv patterns (ring, pairs, all-to-all) check that the rendezvous follows chains of
// waiting peers (a ring of 4 or more threads deadlocked when only direct peers were waited
// for). Every wait of the test is bounded; on failure the comms are revoked and aborted.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "gpu/test_coll_util.h"
#include "gpu/test_thread_team.h"
#include "mkernel/fused.h"

using namespace colltest;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

using gputest::kStepTimeoutS;
using gputest::Team;

// Polls the stream and the comm's async error until done or the deadline. The async error
// is read once more after the stream is done: a kernel that gives up (MKERNEL_TIMEOUT_MS)
// records its error and ends its stream within microseconds, so a poll only while the stream
// runs usually missed it and the output was then reported as wrong data (still poison).
std::string waitStream(int r, ncclComm_t comm, cudaStream_t s, double timeoutS = kStepTimeoutS) {
  auto t0 = Clock::now();
  auto asyncError = [&]() -> std::string {
    ncclResult_t a = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &a) == ncclSuccess && a != ncclSuccess && a != ncclInProgress)
      return "rank " + std::to_string(r) + ": async error " + ncclGetErrorString(a) + ": " +
             ncclGetLastError(nullptr);
    return "";
  };
  for (;;) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return asyncError();
    if (e != cudaErrorNotReady)
      return "rank " + std::to_string(r) + ": CUDA error " + cudaGetErrorString(e);
    std::string a = asyncError();
    if (!a.empty()) return a;
    if (since(t0) > timeoutS)
      return "rank " + std::to_string(r) + ": operation not done after " +
             std::to_string((int)timeoutS) + " s (deadlock)";
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::string nccl(int r, const char* what, ncclResult_t res) {
  if (res == ncclSuccess) return "";
  return "rank " + std::to_string(r) + ": " + what + ": " + ncclGetErrorString(res) + ": " +
         ncclGetLastError(nullptr);
}

// What nccl-tests does between calls (data init and check): a skew of up to maxUs, then a
// device-wide synchronisation of one of the kinds that wait for every kernel on the GPU
// (none when sync is false: the skew alone).
std::string skewAndSync(int r, uint64_t seed, int kind, int maxUs, bool sync = true) {
  std::mt19937_64 rng(seed * 1000003 + r);
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % (maxUs + 1)));
  if (!sync) return "";
  cudaError_t e = cudaSuccess;
  if (kind % 3 == 0) {
    e = cudaDeviceSynchronize();
  } else if (kind % 3 == 1) {
    void* p = nullptr;
    e = cudaMalloc(&p, 1 << 16);
    if (e == cudaSuccess) e = cudaFree(p);
  } else {
    void* h = nullptr;
    e = cudaHostAlloc(&h, 4096, cudaHostAllocMapped);
    if (e == cudaSuccess) e = cudaFreeHost(h);
  }
  return e == cudaSuccess ? "" : "rank " + std::to_string(r) + ": " + cudaGetErrorString(e);
}

// ---- one collective per call ---------------------------------------------------------
enum class K {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAlltoAll,
  kGather,
  kScatter,
  kSendRecv,       // ring: send to r+1, receive from r-1 (a chain through every rank)
  kSendRecvPairs,  // exchange with r^1 (with itself when r^1 is not a rank)
  kSendRecvAll     // every rank sends a block to every rank, each in its own order
};
struct Coll {
  K k;
  const char* algo;  // MKERNEL_ALGO for AllReduce (nullptr: automatic)
  ncclDataType_t dt;
  Op op;
  const char* name;
};
const Coll kColls[] = {
    {K::kAllReduce, nullptr, ncclFloat32, Op::kSum, "AllReduce"},
    {K::kAllReduce, "oneshot", ncclFloat32, Op::kSum, "AllReduce_oneshot"},
    {K::kAllReduce, "twoshot", ncclFloat32, Op::kSum, "AllReduce_twoshot"},
    {K::kAllReduce, "ring", ncclFloat32, Op::kSum, "AllReduce_ring"},
    {K::kAllReduce, "zerocopy", ncclFloat32, Op::kSum, "AllReduce_zerocopy"},
    {K::kAllReduce, nullptr, ncclInt64, Op::kMin, "AllReduce_int64_min"},
    {K::kBroadcast, nullptr, ncclFloat32, Op::kSum, "Broadcast"},
    {K::kReduce, nullptr, ncclFloat32, Op::kSum, "Reduce"},
    {K::kAllGather, nullptr, ncclFloat32, Op::kSum, "AllGather"},
    {K::kReduceScatter, nullptr, ncclFloat32, Op::kSum, "ReduceScatter"},
    {K::kAlltoAll, nullptr, ncclFloat32, Op::kSum, "AlltoAll"},
    {K::kGather, nullptr, ncclFloat32, Op::kSum, "Gather"},
    {K::kScatter, nullptr, ncclFloat32, Op::kSum, "Scatter"},
    {K::kSendRecv, nullptr, ncclFloat32, Op::kSum, "SendRecvRing"},
    {K::kSendRecvPairs, nullptr, ncclFloat32, Op::kSum, "SendRecvPairs"},
    {K::kSendRecvAll, nullptr, ncclFloat32, Op::kSum, "SendRecvAll"},
};

ncclRedOp_t redOf(Op op) {
  return op == Op::kMin ? ncclMin : op == Op::kMax ? ncclMax : op == Op::kProd ? ncclProd : ncclSum;
}
int rootOf(K k, int n) {
  return k == K::kBroadcast ? 1 % n : n - 1;
}
int partnerOf(int r, int n) {
  return (r ^ 1) < n ? r ^ 1 : r;
}
size_t inElems(K k, size_t count, int n) {
  return k == K::kReduceScatter || k == K::kAlltoAll || k == K::kScatter || k == K::kSendRecvAll
             ? n * count
             : count;
}
size_t outElems(K k, size_t count, int n) {
  return k == K::kAllGather || k == K::kAlltoAll || k == K::kGather || k == K::kSendRecvAll
             ? n * count
             : count;
}

// Issues rank r's part of one operation (no group around it).
ncclResult_t issue(K k, ncclDataType_t dt, Op op, const void* s, void* d, size_t count, int r,
                   int n, ncclComm_t comm, cudaStream_t st) {
  const int root = rootOf(k, n);
  switch (k) {
    case K::kAllReduce:
      return ncclAllReduce(s, d, count, dt, redOf(op), comm, st);
    case K::kBroadcast:
      return ncclBroadcast(s, d, count, dt, root, comm, st);
    case K::kReduce:
      return ncclReduce(s, d, count, dt, redOf(op), root, comm, st);
    case K::kAllGather:
      return ncclAllGather(s, d, count, dt, comm, st);
    case K::kReduceScatter:
      return ncclReduceScatter(s, d, count, dt, redOf(op), comm, st);
    case K::kAlltoAll:
      return ncclAlltoAll(s, d, count, dt, comm, st);
    case K::kGather:
      return ncclGather(s, d, count, dt, root, comm, st);
    case K::kScatter:
      return ncclScatter(s, d, count, dt, root, comm, st);
    case K::kSendRecv:       // point-to-point: always grouped (sends and receives would block
    case K::kSendRecvPairs:  // each other)
    case K::kSendRecvAll: {
      const size_t B = count * dtInfo(dt).size;
      ncclResult_t a = ncclGroupStart();
      if (k == K::kSendRecv) {
        if (a == ncclSuccess) a = ncclSend(s, count, dt, (r + 1) % n, comm, st);
        if (a == ncclSuccess) a = ncclRecv(d, count, dt, (r + n - 1) % n, comm, st);
      } else if (k == K::kSendRecvPairs) {
        if (a == ncclSuccess) a = ncclSend(s, count, dt, partnerOf(r, n), comm, st);
        if (a == ncclSuccess) a = ncclRecv(d, count, dt, partnerOf(r, n), comm, st);
      } else {
        for (int i = 0; i < n && a == ncclSuccess; i++) {
          const int q = (r + i) % n;  // every rank in another order: matching is per pair
          a = ncclSend((const char*)s + q * B, count, dt, q, comm, st);
          if (a == ncclSuccess) a = ncclRecv((char*)d + q * B, count, dt, q, comm, st);
        }
      }
      ncclResult_t b = ncclGroupEnd();
      return a != ncclSuccess ? a : b;
    }
  }
  return ncclInternalError;
}

// Rank r's output of one operation against the host reference; "" when right.
std::string check(K k, ncclDataType_t dt, Op op, size_t count, int n, int r,
                  const std::vector<HostBuf>& in, const HostBuf& got) {
  if (count == 0) return "";
  const size_t es = dtInfo(dt).size, B = count * es;
  const int root = rootOf(k, n);
  std::vector<const HostBuf*> ins;
  for (const HostBuf& h : in) ins.push_back(&h);
  std::string e;
  switch (k) {
    case K::kAllReduce:
      return checkReduction(dt, op, ins, 0, got, count, 0);
    case K::kReduce:
      return r == root ? checkReduction(dt, op, ins, 0, got, count, 0) : "";
    case K::kReduceScatter:
      return checkReduction(dt, op, ins, r * count, got, count, 0);
    case K::kBroadcast:
      return checkBytes(got, 0, in[root], 0, B, "broadcast");
    case K::kScatter:
      return checkBytes(got, 0, in[root], r * B, B, "scatter");
    case K::kSendRecv:
      return checkBytes(got, 0, in[(r + n - 1) % n], 0, B, "received");
    case K::kSendRecvPairs:
      return checkBytes(got, 0, in[partnerOf(r, n)], 0, B, "received");
    case K::kAllGather:
    case K::kAlltoAll:
    case K::kSendRecvAll:
    case K::kGather:
      if (k == K::kGather && r != root) return "";
      for (int q = 0; q < n && e.empty(); q++)
        e = checkBytes(got, q * B, in[q], k == K::kAlltoAll || k == K::kSendRecvAll ? r * B : 0, B,
                       ("block of rank " + std::to_string(q)).c_str());
      return e;
  }
  return "unknown operation";
}

// Device and host buffers of one operation on every rank.
struct OpBufs {
  std::vector<DevBuf> send, recv;
  std::vector<HostBuf> in, out;
  size_t inN = 0, outN = 0;
  OpBufs(K k, ncclDataType_t dt, Op op, size_t count, int n, uint64_t seed) {
    inN = inElems(k, count, n);
    outN = outElems(k, count, n);
    const size_t es = dtInfo(dt).size;
    in.resize(n);
    out.resize(n);
    for (int r = 0; r < n; r++) {
      fillRandom(in[r], dt, op, inN, seed + 7919 * r);
      out[r].size = es;
      out[r].bytes.assign(outN * es, 0);
      send.emplace_back(std::max<size_t>(inN * es, 16));
      recv.emplace_back(std::max<size_t>(outN * es, 16));
    }
  }
  // Upload rank r's input and poison its output, on its stream.
  std::string stage(int r, cudaStream_t s) {
    cudaError_t e = cudaSuccess;
    if (!in[r].bytes.empty())
      e = cudaMemcpyAsync(send[r].base, in[r].bytes.data(), in[r].bytes.size(),
                          cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess) e = cudaMemsetAsync(recv[r].base, 0xA5, recv[r].bytes, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    return e == cudaSuccess ? ""
                            : "rank " + std::to_string(r) + ": stage: " + cudaGetErrorString(e);
  }
  std::string fetch(int r, cudaStream_t s) {
    if (out[r].bytes.empty()) return "";
    cudaError_t e = cudaMemcpyAsync(out[r].bytes.data(), recv[r].base, out[r].bytes.size(),
                                    cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    return e == cudaSuccess ? ""
                            : "rank " + std::to_string(r) + ": fetch: " + cudaGetErrorString(e);
  }
};

const size_t kCounts[] = {0, 1, 4097, (1u << 20) + 3};

class CollThreadRanks : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
  // A deadlock ends after 20 s on the device instead of 5 minutes.
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
};

// Every collective and send/recv, a few sizes, one call per operation; ranks alternate
// between a bare call and one wrapped in ncclGroupStart/End; each thread synchronises the
// device (in one of three ways) at a random skew before the call and after it.
TEST_P(CollThreadRanks, EveryCollective) {
  const int n = GetParam();
  Team team(n);
  ASSERT_TRUE(team.ok) << team.why;
  const uint64_t seed = mktest::testSeed();
  int idx = 0;
  for (const Coll& c : kColls) {
    AlgoScope algo(c.algo);  // set while the workers wait between steps
    for (size_t count : kCounts) {
      const int caseIdx = idx++;
      SCOPED_TRACE(std::string(c.name) + " count " + sizeName(count) + " n " + std::to_string(n));
      OpBufs b(c.k, c.dt, c.op, count, n, seed + 104729ull * caseIdx);
      // Ranks that form independent parts (pairs, and a rank paired with itself, from 3
      // ranks on) do not wait for each other in the rendezvous, so a thread's synchronisation
      // before its call can fall between a peer pair's rendezvous and its launch: cudaFree /
      // cudaFreeHost / cudaMalloc then wait for the pair's first kernel while blocking the
      // second launch, until that kernel gives up after MKERNEL_TIMEOUT_MS (NCCL has the same
      // hazard). EveryCollective/n5 showed it as SendRecvPairs count 1 output left at the
      // poison value (the timeout was missed, see waitStream). Those patterns synchronise
      // before a barrier; the skew before the call stays.
      const bool parts = c.k == K::kSendRecvPairs && n > 2;
      std::string err = team.run([&](int r) -> std::string {
        std::string e = b.stage(r, team.streams[r]);
        if (e.empty() && parts) e = skewAndSync(r, seed + caseIdx, caseIdx + r, 0);
        if (e.empty() && parts && !team.barrier())
          e = "rank " + std::to_string(r) + ": a peer failed before the call";
        if (e.empty()) e = skewAndSync(r, seed + caseIdx, caseIdx + r, 2000, !parts);
        if (!e.empty()) return e;
        const bool grouped = (r + caseIdx) % 2 == 0;
        ncclResult_t res = grouped ? ncclGroupStart() : ncclSuccess;
        if (res == ncclSuccess)
          res = issue(c.k, c.dt, c.op, b.send[r].base, b.recv[r].base, count, r, n, team.comms[r],
                      team.streams[r]);
        if (grouped) {
          ncclResult_t g = ncclGroupEnd();
          if (res == ncclSuccess) res = g;
        }
        e = nccl(r, c.name, res);
        if (e.empty()) e = waitStream(r, team.comms[r], team.streams[r]);
        if (e.empty()) e = b.fetch(r, team.streams[r]);
        // A rank's kernel may finish before a peer has launched its part (a Gather sender, a
        // pair whose sends fit the slots), and that peer may still be between the rendezvous
        // and its launch. cudaFree / cudaFreeHost / cudaMalloc in this thread would then wait
        // for the peer's partner kernel while holding the lock the peer's launch needs (the
        // known NCCL hazard of freeing memory while collectives are being scheduled:
        // EveryCollective/n6,n8 timed out on "rank q did not join" and rank q then finished
        // cleanly). The rendezvous only covers syncs before a call, so the test, like a correct
        // NCCL program, lets every rank's stream finish before anyone synchronises again.
        if (e.empty() && !team.barrier()) e = "rank " + std::to_string(r) + ": a peer failed";
        if (e.empty()) e = skewAndSync(r, seed + caseIdx + 1, caseIdx + r + 1, 500);
        return e;
      });
      ASSERT_EQ(err, "");
      for (int r = 0; r < n; r++)
        ASSERT_EQ(check(c.k, c.dt, c.op, count, n, r, b.in, b.out[r]), "") << "rank " << r;
      if (c.k == K::kAllReduce && count > 0)  // same reduction order on every rank
        for (int r = 1; r < n; r++) ASSERT_TRUE(b.out[r].bytes == b.out[0].bytes) << "rank " << r;
    }
  }
}

// Several operations per thread in one ncclGroupStart/End (two AllReduces, AllGather,
// ReduceScatter, Broadcast, send/recv pairs, all-to-all and ring); the other half of the ranks
// issue them one call at a time (each send/recv pattern grouped on its own). The matching is
// by order, so both styles meet; no rank synchronises the device between its calls (a rank's
// call then depends on a grouping peer, whose kernels launch after its later calls).
TEST_P(CollThreadRanks, GroupsOfSeveralOperations) {
  const int n = GetParam();
  Team team(n);
  ASSERT_TRUE(team.ok) << team.why;
  const uint64_t seed = mktest::testSeed() ^ 0x6a09e667f3bcc908ull;
  // The send/recv patterns last: a group runs its collectives first, then one kernel for all
  // its sends and receives, so a rank issuing one call at a time must keep that order.
  const K ks[] = {K::kAllReduce, K::kAllGather,     K::kAllReduce,   K::kReduceScatter,
                  K::kBroadcast, K::kSendRecvPairs, K::kSendRecvAll, K::kSendRecv};
  const int nk = (int)(sizeof(ks) / sizeof(ks[0]));
  int idx = 0;
  for (size_t count : {(size_t)1, (size_t)4097, (size_t)(1u << 20) + 3}) {
    for (int rep = 0; rep < 2; rep++) {
      const int caseIdx = idx++;
      SCOPED_TRACE("count " + sizeName(count) + " rep " + std::to_string(rep));
      std::vector<std::unique_ptr<OpBufs>> bufs;
      for (int i = 0; i < nk; i++)
        bufs.emplace_back(
            new OpBufs(ks[i], ncclFloat32, Op::kSum, count, n, seed + 7 * caseIdx + 1000 * i));
      std::string err = team.run([&](int r) -> std::string {
        std::string e;
        for (int i = 0; i < nk && e.empty(); i++) e = bufs[i]->stage(r, team.streams[r]);
        if (e.empty()) e = skewAndSync(r, seed + caseIdx, caseIdx + r, 2000);
        if (!e.empty()) return e;
        const bool grouped = (r + rep) % 2 == 0;
        ncclResult_t res = grouped ? ncclGroupStart() : ncclSuccess;
        for (int i = 0; i < nk && res == ncclSuccess; i++)
          res = issue(ks[i], ncclFloat32, Op::kSum, bufs[i]->send[r].base, bufs[i]->recv[r].base,
                      count, r, n, team.comms[r], team.streams[r]);
        if (grouped) {
          ncclResult_t g = ncclGroupEnd();
          if (res == ncclSuccess) res = g;
        }
        e = nccl(r, "group", res);
        if (e.empty()) e = waitStream(r, team.comms[r], team.streams[r]);
        for (int i = 0; i < nk && e.empty(); i++) e = bufs[i]->fetch(r, team.streams[r]);
        return e;
      });
      ASSERT_EQ(err, "");
      for (int i = 0; i < nk; i++)
        for (int r = 0; r < n; r++)
          ASSERT_EQ(check(ks[i], ncclFloat32, Op::kSum, count, n, r, bufs[i]->in, bufs[i]->out[r]),
                    "")
              << "operation " << i << " rank " << r;
    }
  }
}

// nccl-tests -t in miniature, many short rounds: device-wide synchronisations at a random skew
// before every call, AllReduce + Broadcast + a send/recv ring (pairs on odd rounds) per round,
// on some ranks all in one group. Every 4th round is captured into a CUDA graph per thread and
// launched, as -G 1 does, alternately in thread-local and global capture mode. A device-wide
// synchronisation in one thread while another thread's stream on the same device is capturing
// is refused by CUDA whatever the capture mode ("operation not permitted when stream is
// capturing"), so, like nccl-tests, the threads capture between barriers: nobody synchronises
// the device during a capture, nobody instantiates during another thread's global capture,
// and every graph is instantiated before the first one is launched. Global mode also proves
// that mkernel's enqueue makes no capture-unsafe call (cudaMalloc, a synchronisation, an
// event query) while any thread captures.
TEST_P(CollThreadRanks, DeviceSyncBetweenCalls) {
  const int n = GetParam();
  Team team(n);
  ASSERT_TRUE(team.ok) << team.why;
  const size_t count = 8191;
  const uint64_t seed = mktest::testSeed() ^ 0xbb67ae8584caa73bull;
  std::vector<DevBuf> a, bc, rs, rr;
  for (int r = 0; r < n; r++) {
    a.emplace_back(count * 4);
    bc.emplace_back(count * 4);
    rs.emplace_back(count * 4);
    rr.emplace_back(count * 4);
  }
  std::string err = team.run([&](int r) -> std::string {
    cudaStream_t s = team.streams[r];
    ncclComm_t comm = team.comms[r];
    const std::string me = "rank " + std::to_string(r);
    std::vector<float> h(count), got(count);
    for (int it = 0; it < 48; it++) {
      const int root = it % n;
      const bool pairs = it % 2 == 1;
      const int from = pairs ? partnerOf(r, n) : (r + n - 1) % n;
      auto val = [&](int q, size_t i) {
        return (float)((seed + it * 131 + q * 977 + i * 7) % 1000);
      };
      for (size_t i = 0; i < count; i++) h[i] = val(r, i);
      cudaError_t ce = cudaMemcpyAsync(a[r].base, h.data(), count * 4, cudaMemcpyHostToDevice, s);
      if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(bc[r].base, h.data(), count * 4, cudaMemcpyHostToDevice, s);
      if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(rs[r].base, h.data(), count * 4, cudaMemcpyHostToDevice, s);
      if (ce == cudaSuccess) ce = cudaMemsetAsync(rr[r].base, 0xA5, count * 4, s);
      if (ce == cudaSuccess) ce = cudaStreamSynchronize(s);
      if (ce != cudaSuccess) return me + ": " + cudaGetErrorString(ce);
      std::string e = skewAndSync(r, seed + it, it + r, 1500);
      if (!e.empty()) return e;
      const bool graph = it % 4 == 3;
      const bool global = it % 8 == 7;
      const char* mode = global ? "global capture" : "thread-local capture";
      const std::string tag =
          " (round " + std::to_string(it) + (graph ? ", " : "") + (graph ? mode : "") + ")";
      cudaGraph_t g = nullptr;
      cudaGraphExec_t ge = nullptr;
      if (graph) {
        if (!team.barrier()) return me + ": a peer failed before the capture" + tag;
        ce = cudaStreamBeginCapture(
            s, global ? cudaStreamCaptureModeGlobal : cudaStreamCaptureModeThreadLocal);
        if (ce != cudaSuccess) return me + ": cudaStreamBeginCapture: " + cudaGetErrorString(ce);
      }
      const bool grouped = (it + r) % 3 == 0;
      ncclResult_t res = grouped ? ncclGroupStart() : ncclSuccess;
      if (res == ncclSuccess)
        res = ncclAllReduce(a[r].base, a[r].base, count, ncclFloat32, ncclSum, comm, s);
      if (res == ncclSuccess)
        res = ncclBroadcast(bc[r].base, bc[r].base, count, ncclFloat32, root, comm, s);
      if (res == ncclSuccess)
        res = issue(pairs ? K::kSendRecvPairs : K::kSendRecv, ncclFloat32, Op::kSum, rs[r].base,
                    rr[r].base, count, r, n, comm, s);
      if (grouped) {
        ncclResult_t ge2 = ncclGroupEnd();
        if (res == ncclSuccess) res = ge2;
      }
      if (graph) {
        ce = cudaStreamEndCapture(s, &g);
        bool met = team.barrier();  // every capture has ended
        if (met && ce == cudaSuccess && res == ncclSuccess) ce = cudaGraphInstantiate(&ge, g, 0);
        met = met && team.barrier();  // every graph is instantiated
        if (met && ce == cudaSuccess && res == ncclSuccess) ce = cudaGraphLaunch(ge, s);
        if (!met || ce != cudaSuccess) {
          if (ge) cudaGraphExecDestroy(ge);
          if (g) cudaGraphDestroy(g);
          return me + ": graph: " + (met ? cudaGetErrorString(ce) : "a peer failed") + tag +
                 (res == ncclSuccess ? "" : "; " + nccl(r, "round", res));
        }
      }
      e = nccl(r, "round", res);
      if (e.empty()) e = waitStream(r, comm, s);
      if (ge) cudaGraphExecDestroy(ge);
      if (g) cudaGraphDestroy(g);
      if (!e.empty()) return e + tag;
      struct Want {
        void* p;
        std::function<float(size_t)> f;
        const char* what;
      } wants[] = {
          {a[r].base,
           [&](size_t i) {
             float t = 0;
             for (int q = 0; q < n; q++) t += val(q, i);
             return t;
           },
           "AllReduce"},
          {bc[r].base, [&](size_t i) { return val(root, i); }, "Broadcast"},
          {rr[r].base, [&](size_t i) { return val(from, i); }, pairs ? "Recv (pairs)" : "Recv"},
      };
      for (const Want& w : wants) {
        if (cudaMemcpyAsync(got.data(), w.p, count * 4, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
            cudaStreamSynchronize(s) != cudaSuccess)
          return me + ": download failed";
        for (size_t i = 0; i < count; i++)
          if (got[i] != w.f(i))
            return me + tag + ": " + w.what + " element " + std::to_string(i) + " is " +
                   std::to_string(got[i]) + ", expected " + std::to_string(w.f(i));
      }
      // The next round synchronises the device before its calls: only once every rank's
      // round is done (a peer may still be between the rendezvous and its launch, see
      // EveryCollective). The skew before the next calls is what this test is about.
      if (!team.barrier()) return me + ": a peer failed after round " + std::to_string(it);
    }
    return "";
  });
  ASSERT_EQ(err, "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollThreadRanks, ::testing::Values(2, 3, 4, 5, 6, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// A kernel that gives up waiting must fail the wait, not pass it with the output left at the
// poison value: rank 0 receives from rank 1, which never sends (its thread issues nothing, so
// after the rendezvous' grace period rank 0 launches alone). The receive kernel is the only
// CTA waiting, so it records the timeout and ends its stream within microseconds; a wait that
// read the async error only while the stream ran missed it (how a device timeout of
// EveryCollective looked like lost data).
TEST(CollThreadWait, DeviceTimeoutFailsTheWait) {
  MKTEST_REQUIRE_GPU();
  mktest::ScopedEnv timeout("MKERNEL_TIMEOUT_MS", "1500");
  Team team(2);
  ASSERT_TRUE(team.ok) << team.why;
  DevBuf recv(16);
  const auto t0 = Clock::now();
  std::string err = team.run([&](int r) -> std::string {
    if (r != 0) return "";
    cudaStream_t s = team.streams[0];
    cudaError_t ce = cudaMemsetAsync(recv.base, 0xA5, recv.bytes, s);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(s);
    if (ce != cudaSuccess) return std::string("stage: ") + cudaGetErrorString(ce);
    ncclResult_t res = ncclGroupStart();
    if (res == ncclSuccess) res = ncclRecv(recv.base, 1, ncclFloat32, 1, team.comms[0], s);
    ncclResult_t g = ncclGroupEnd();
    if (res == ncclSuccess) res = g;
    if (res != ncclSuccess) return "call failed on the host: " + nccl(0, "ncclRecv", res);
    const std::string e = waitStream(0, team.comms[0], s, 30);
    return e.empty() ? "wait passed" : "timeout reported: " + e;
  });
  EXPECT_NE(err.find("timeout reported: rank 0: async error"), std::string::npos) << err;
  EXPECT_LT(since(t0), 25.0) << "the kernel's own timeout should have ended the wait";
}

// ---- ncclGemmAllReduce with one thread per rank ----------------------------------------
// The fused kernel is one operation of the comm (fusedEnqueue), so it takes the same host
// rendezvous: the *_sync cases synchronise the device at a skew right before the call.
uint16_t toBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even (inputs are finite)
  return (uint16_t)(u >> 16);
}
double fromBf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

struct FusedCase {
  int n;
  int algo;                // ncclFusedAlgo_t
  ncclDataType_t outType;  // ncclFloat32 or ncclBfloat16
  bool deviceSync;         // device-wide synchronisation at a skew before the call
};

// C = sum_r A_r B_r^T (B in the [N,K] layout), M = N = K = 128, bf16 inputs; the host
// reference in fp64 with the bound the output type allows (fp32 accumulation, and for bf16
// output each partial and each of the n-1 additions rounded). Bit-identical on every rank.
void runFused(const FusedCase& fc) {
  const int n = fc.n, M = 128, N = 128, K = 128;
  Team team(n);
  ASSERT_TRUE(team.ok) << team.why;
  const uint64_t seed = mktest::testSeed() ^ 0x3c6ef372fe94f82bull;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<std::vector<uint16_t>> A(n, std::vector<uint16_t>((size_t)M * K)),
      B(n, std::vector<uint16_t>((size_t)N * K));
  for (int r = 0; r < n; r++) {
    for (auto& x : A[r]) x = toBf16(u(rng));
    for (auto& x : B[r]) x = toBf16(u(rng));
  }
  const size_t eo = fc.outType == ncclFloat32 ? 4 : 2;
  std::vector<DevBuf> dA, dB, dC;
  std::vector<std::vector<uint8_t>> got(n, std::vector<uint8_t>((size_t)M * N * eo));
  for (int r = 0; r < n; r++) {
    dA.emplace_back((size_t)M * K * 2);
    dB.emplace_back((size_t)N * K * 2);
    dC.emplace_back((size_t)M * N * eo);
  }
  for (int rep = 0; rep < 3; rep++) {
    std::string err = team.run([&](int r) -> std::string {
      cudaStream_t s = team.streams[r];
      cudaError_t ce =
          cudaMemcpyAsync(dA[r].base, A[r].data(), A[r].size() * 2, cudaMemcpyHostToDevice, s);
      if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(dB[r].base, B[r].data(), B[r].size() * 2, cudaMemcpyHostToDevice, s);
      if (ce == cudaSuccess) ce = cudaMemsetAsync(dC[r].base, 0xA5, dC[r].bytes, s);
      if (ce == cudaSuccess) ce = cudaStreamSynchronize(s);
      if (ce != cudaSuccess) return "rank " + std::to_string(r) + ": " + cudaGetErrorString(ce);
      if (fc.deviceSync) {
        std::string e = skewAndSync(r, seed + rep, rep + r, 2000);
        if (!e.empty()) return e;
      }
      ncclFusedConfig_t cfg = NCCL_FUSED_CONFIG_INITIALIZER;
      cfg.outType = fc.outType;
      cfg.algo = fc.algo;
      std::string e = nccl(r, "ncclGemmAllReduce",
                           ncclGemmAllReduce(dA[r].base, dB[r].base, dC[r].base, M, N, K,
                                             ncclBfloat16, &cfg, team.comms[r], s));
      if (e.empty()) e = waitStream(r, team.comms[r], s);
      if (e.empty() && (cudaMemcpyAsync(got[r].data(), dC[r].base, got[r].size(),
                                        cudaMemcpyDeviceToHost, s) != cudaSuccess ||
                        cudaStreamSynchronize(s) != cudaSuccess))
        e = "rank " + std::to_string(r) + ": download failed";
      return e;
    });
    ASSERT_EQ(err, "") << "repetition " << rep;
  }
  const double u32 = std::ldexp(1.0, -24), u16 = std::ldexp(1.0, -8);
  for (int m = 0; m < M; m++)
    for (int j = 0; j < N; j++) {
      double ref = 0, absAB = 0, absPart = 0;
      for (int r = 0; r < n; r++) {
        double part = 0;
        for (int k = 0; k < K; k++) {
          double p = fromBf16(A[r][(size_t)m * K + k]) * fromBf16(B[r][(size_t)j * K + k]);
          part += p;
          absAB += std::fabs(p);
        }
        ref += part;
        absPart += std::fabs(part);
      }
      const size_t i = (size_t)m * N + j;
      double v;
      if (eo == 4) {
        float f;
        memcpy(&f, &got[0][i * 4], 4);
        v = f;
      } else {
        uint16_t b;
        memcpy(&b, &got[0][i * 2], 2);
        v = fromBf16(b);
      }
      double tol = 4.0 * (K + n) * u32 * absAB + (eo == 2 ? (n + 1) * u16 * absPart : 0) + 1e-30;
      ASSERT_LE(std::fabs(v - ref), tol)
          << "C[" << m << "," << j << "] = " << v << ", fp64 " << ref;
    }
  for (int r = 1; r < n; r++) ASSERT_TRUE(got[r] == got[0]) << "rank " << r << " differs from 0";
}

class CollThreadsFused : public ::testing::TestWithParam<FusedCase> {
 protected:
  void SetUp() override { MKTEST_REQUIRE_GPU(); }
  mktest::ScopedEnv timeout_{"MKERNEL_TIMEOUT_MS", "20000"};
};

TEST_P(CollThreadsFused, GemmAllReduce) {
  runFused(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, CollThreadsFused,
                         ::testing::Values(FusedCase{2, ncclFusedFused, ncclFloat32, false},
                                           FusedCase{4, ncclFusedFused, ncclFloat32, false},
                                           FusedCase{4, ncclFusedFused, ncclBfloat16, false},
                                           FusedCase{2, ncclFusedSequential, ncclFloat32, true},
                                           FusedCase{4, ncclFusedSequential, ncclBfloat16, true},
                                           FusedCase{4, ncclFusedAuto, ncclFloat32, false},
                                           FusedCase{2, ncclFusedFused, ncclBfloat16, true},
                                           FusedCase{4, ncclFusedFused, ncclFloat32, true},
                                           FusedCase{8, ncclFusedFused, ncclFloat32, true}),
                         [](const ::testing::TestParamInfo<FusedCase>& i) {
                           const FusedCase& c = i.param;
                           return "n" + std::to_string(c.n) +
                                  (c.algo == ncclFusedFused        ? "_fused"
                                   : c.algo == ncclFusedSequential ? "_seq"
                                                                   : "_auto") +
                                  (c.outType == ncclFloat32 ? "_f32" : "_bf16") +
                                  (c.deviceSync ? "_sync" : "");
                         });

}  // namespace
