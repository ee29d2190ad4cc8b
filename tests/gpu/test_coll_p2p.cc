// Send/Recv and groups on ranks sharing GPU 0: rings, all pairs in random issue order
// with messages larger than the workspace (flow control), repeated sends to one peer,
// send to self, mixed collective + point-to-point groups, streams shared between ranks,
// several streams for one comm, one thread per rank, and ncclAllToAllv.
#include <cstdint>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "gpu/test_coll_util.h"
#include "mkernel/nccl_extra.h"

using namespace colltest;

namespace {

// One message of a p2p pattern: from -> to, the k-th between them.
struct Msg {
  int from, to, k;
  size_t bytes;
};

HostBuf payload(const Msg& m) {
  HostBuf h;
  fillRandom(h, ncclUint8, Op::kSum, m.bytes,
             mktest::testSeed() ^ ((uint64_t)m.from << 40) ^ ((uint64_t)m.to << 20) ^ m.k);
  return h;
}

// Issues every rank's sends and receives of `msgs` in one group, each rank in its own
// (shuffled if `shuffle`) order, and checks every received byte.
void runPattern(Clique& c, const std::vector<Msg>& msgs, bool shuffle, uint64_t seed,
                const char* what) {
  const int n = c.n;
  std::vector<DevBuf> sendBufs, recvBufs;
  std::vector<HostBuf> data;
  struct Op1 {
    bool send;
    int peer;
    void* ptr;
    size_t bytes;
  };
  std::vector<std::vector<Op1>> perRank(n);
  for (const Msg& m : msgs) {
    data.push_back(payload(m));
    sendBufs.emplace_back(m.bytes + 64);
    recvBufs.emplace_back(m.bytes + 64);
    upload(sendBufs.back().base, data.back(), 0, m.bytes);
    ASSERT_EQ(mktest::syncMemset(recvBufs.back().base, 0xCD, m.bytes + 64), cudaSuccess);
    perRank[m.from].push_back({true, m.to, sendBufs.back().base, m.bytes});
    perRank[m.to].push_back({false, m.from, recvBufs.back().base, m.bytes});
  }
  std::mt19937_64 rng(seed);
  if (shuffle) {
    // Any interleaving is allowed, but the k-th send to a peer must stay before the
    // (k+1)-th (NCCL matches them in order): shuffle, then restore each pair's order.
    for (int r = 0; r < n; r++) {
      auto& ops = perRank[r];
      std::vector<Op1> orig = ops;
      std::shuffle(ops.begin(), ops.end(), rng);
      for (bool s : {true, false})
        for (int q = 0; q < n; q++) {
          std::vector<size_t> pos;
          std::vector<Op1> inOrder;
          for (size_t i = 0; i < ops.size(); i++)
            if (ops[i].send == s && ops[i].peer == q) pos.push_back(i);
          for (const Op1& o : orig)
            if (o.send == s && o.peer == q) inOrder.push_back(o);
          for (size_t i = 0; i < pos.size(); i++) ops[pos[i]] = inOrder[i];
        }
    }
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; r++)
    for (const Op1& o : perRank[r]) {
      ncclResult_t res = o.send
                             ? ncclSend(o.ptr, o.bytes, ncclInt8, o.peer, c.comms[r], c.streams[r])
                             : ncclRecv(o.ptr, o.bytes, ncclInt8, o.peer, c.comms[r], c.streams[r]);
      ASSERT_EQ(res, ncclSuccess) << ncclGetLastError(nullptr);
    }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  std::string why;
  ASSERT_TRUE(syncClique(c, 120, &why)) << what << ": " << why;
  for (size_t i = 0; i < msgs.size(); i++) {
    HostBuf got;
    download(got, recvBufs[i].base, msgs[i].bytes, 1);
    EXPECT_EQ(checkBytes(got, 0, data[i], 0, msgs[i].bytes, "message"), "")
        << what << ": message " << msgs[i].from << " -> " << msgs[i].to << " #" << msgs[i].k << " ("
        << msgs[i].bytes << " bytes)";
  }
}

struct RingParam {
  int n;
  size_t bytes;
};
class CollP2pRing : public ::testing::TestWithParam<RingParam> {};

TEST_P(CollP2pRing, SendToNextRecvFromPrev) {
  MKTEST_REQUIRE_GPU();
  const RingParam p = GetParam();
  Clique& c = clique(p.n);
  ASSERT_TRUE(c.ok) << c.why;
  std::vector<Msg> msgs;
  for (int r = 0; r < p.n; r++) msgs.push_back({r, (r + 1) % p.n, 0, p.bytes});
  runPattern(c, msgs, false, 1, "ring");
}

INSTANTIATE_TEST_SUITE_P(Sizes, CollP2pRing, ::testing::ValuesIn([] {
                           std::vector<RingParam> v;
                           for (int n : {2, 3, 4, 8})
                             for (size_t b : {(size_t)1, (size_t)1023, (size_t)65537,
                                              (size_t)(1 << 20) + 3, (size_t)(48 << 20)})
                               v.push_back({n, b});
                           return v;
                         }()),
                         [](const ::testing::TestParamInfo<RingParam>& i) {
                           return "n" + std::to_string(i.param.n) + "_bytes" +
                                  std::to_string(i.param.bytes);
                         });

class CollP2pPairs : public ::testing::TestWithParam<int> {};

// Every rank sends to every other rank (sizes differ per pair, up to several MB: more than
// the workspace holds), in a shuffled order per rank: no deadlock, every byte right.
TEST_P(CollP2pPairs, AllPairsShuffledOrder) {
  MKTEST_REQUIRE_GPU();
  const int n = GetParam();
  Clique& c = clique(n);
  ASSERT_TRUE(c.ok) << c.why;
  for (size_t base : {(size_t)100, (size_t)(1 << 20)}) {
    std::vector<Msg> msgs;
    for (int s = 0; s < n; s++)
      for (int d = 0; d < n; d++)
        if (s != d) msgs.push_back({s, d, 0, base * ((s * 7 + d * 3) % 5 + 1) + s + d});
    runPattern(c, msgs, true, mktest::testSeed() + base, "all pairs");
  }
}

// Several messages to the same peer (matched in order), send to self, zero-byte messages.
TEST_P(CollP2pPairs, RepeatedPeersSelfAndEmpty) {
  MKTEST_REQUIRE_GPU();
  const int n = GetParam();
  Clique& c = clique(n);
  ASSERT_TRUE(c.ok) << c.why;
  std::vector<Msg> msgs;
  for (int r = 0; r < n; r++) {
    int next = (r + 1) % n;
    msgs.push_back({r, next, 0, 5000});
    msgs.push_back({r, next, 1, 0});
    msgs.push_back({r, next, 2, 300000});
    msgs.push_back({r, next, 3, 17});
    msgs.push_back({r, r, 4, 123457});
    msgs.push_back({r, r, 5, 9});
  }
  runPattern(c, msgs, true, mktest::testSeed(), "repeated/self");
}

// More transfers than the small argument block holds (large-args kernel).
TEST_P(CollP2pPairs, ManyTransfersInOneGroup) {
  MKTEST_REQUIRE_GPU();
  const int n = GetParam();
  Clique& c = clique(n);
  ASSERT_TRUE(c.ok) << c.why;
  std::vector<Msg> msgs;
  for (int s = 0; s < n; s++)
    for (int d = 0; d < n; d++)
      for (int k = 0; k < 4; k++) msgs.push_back({s, d, k, (size_t)(777 * (k + 1) + s)});
  runPattern(c, msgs, true, mktest::testSeed() + 99, "many transfers");
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollP2pPairs, ::testing::Values(1, 2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// ---- groups mixing collectives and point-to-point ------------------------------------------
struct MixedRun {
  size_t arCount = 100003, agCount = 4097, p2pBytes = (1 << 20) + 5;
  std::vector<HostBuf> arIn, agIn, p2pIn;
  std::vector<DevBuf> arBuf, agSend, agRecv, p2pSend, p2pRecv;
};

void prepareMixed(Clique& c, MixedRun& m, uint64_t seed) {
  const int n = c.n;
  m.arIn.resize(n);
  m.agIn.resize(n);
  m.p2pIn.resize(n);
  for (int r = 0; r < n; r++) {
    fillRandom(m.arIn[r], ncclInt32, Op::kSum, m.arCount, seed + r);
    fillRandom(m.agIn[r], ncclUint8, Op::kSum, m.agCount, seed + 100 + r);
    fillRandom(m.p2pIn[r], ncclUint8, Op::kSum, m.p2pBytes, seed + 200 + r);
    m.arBuf.emplace_back(m.arCount * 4);
    upload(m.arBuf.back().base, m.arIn[r], 0, m.arCount);
    m.agSend.emplace_back(m.agCount);
    upload(m.agSend.back().base, m.agIn[r], 0, m.agCount);
    m.agRecv.emplace_back(m.agCount * n);
    mktest::syncMemset(m.agRecv.back().base, 0xCD, m.agCount * n);
    m.p2pSend.emplace_back(m.p2pBytes);
    upload(m.p2pSend.back().base, m.p2pIn[r], 0, m.p2pBytes);
    m.p2pRecv.emplace_back(m.p2pBytes);
    mktest::syncMemset(m.p2pRecv.back().base, 0xCD, m.p2pBytes);
  }
}

void checkMixed(Clique& c, MixedRun& m) {
  const int n = c.n;
  std::vector<const HostBuf*> arPtr;
  for (auto& h : m.arIn) arPtr.push_back(&h);
  for (int r = 0; r < n; r++) {
    HostBuf got;
    download(got, m.arBuf[r].base, m.arCount, 4);
    EXPECT_EQ(checkReduction(ncclInt32, Op::kSum, arPtr, 0, got, m.arCount, 0), "")
        << "AllReduce rank " << r;
    download(got, m.agRecv[r].base, m.agCount * n, 1);
    for (int q = 0; q < n; q++)
      EXPECT_EQ(checkBytes(got, q * m.agCount, m.agIn[q], 0, m.agCount, "AllGather"), "")
          << "rank " << r << " block " << q;
    download(got, m.p2pRecv[r].base, m.p2pBytes, 1);
    EXPECT_EQ(checkBytes(got, 0, m.p2pIn[(r + n - 1) % n], 0, m.p2pBytes, "Recv"), "")
        << "rank " << r;
  }
}

// streamOf(r, k): the stream rank r uses for its k-th operation of the group.
template <typename StreamOf>
void issueMixed(Clique& c, MixedRun& m, StreamOf streamOf) {
  const int n = c.n;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; r++) {
    // Receives before sends on odd ranks: the order inside a group does not matter.
    if (r % 2)
      ASSERT_EQ(ncclRecv(m.p2pRecv[r].base, m.p2pBytes, ncclUint8, (r + n - 1) % n, c.comms[r],
                         streamOf(r, 0)),
                ncclSuccess);
    ASSERT_EQ(ncclAllReduce(m.arBuf[r].base, m.arBuf[r].base, m.arCount, ncclInt32, ncclSum,
                            c.comms[r], streamOf(r, 1)),
              ncclSuccess);
    ASSERT_EQ(
        ncclSend(m.p2pSend[r].base, m.p2pBytes, ncclUint8, (r + 1) % n, c.comms[r], streamOf(r, 2)),
        ncclSuccess);
    ASSERT_EQ(ncclAllGather(m.agSend[r].base, m.agRecv[r].base, m.agCount, ncclUint8, c.comms[r],
                            streamOf(r, 3)),
              ncclSuccess);
    if (r % 2 == 0)
      ASSERT_EQ(ncclRecv(m.p2pRecv[r].base, m.p2pBytes, ncclUint8, (r + n - 1) % n, c.comms[r],
                         streamOf(r, 4)),
                ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
}

class CollGroup : public ::testing::TestWithParam<int> {};

TEST_P(CollGroup, CollectivesAndP2pInOneGroup) {
  MKTEST_REQUIRE_GPU();
  Clique& c = clique(GetParam());
  ASSERT_TRUE(c.ok) << c.why;
  MixedRun m;
  prepareMixed(c, m, mktest::testSeed());
  issueMixed(c, m, [&](int r, int) { return c.streams[r]; });
  std::string why;
  ASSERT_TRUE(syncClique(c, 60, &why)) << why;
  checkMixed(c, m);
}

// Every rank passes the same stream (and then the legacy default stream): the library must
// still run the ranks' kernels concurrently.
TEST_P(CollGroup, OneStreamSharedByAllRanks) {
  MKTEST_REQUIRE_GPU();
  Clique& c = clique(GetParam());
  ASSERT_TRUE(c.ok) << c.why;
  cudaStream_t shared;
  ASSERT_EQ(cudaStreamCreateWithFlags(&shared, cudaStreamNonBlocking), cudaSuccess);
  for (cudaStream_t s : {shared, (cudaStream_t)0}) {
    MixedRun m;
    prepareMixed(c, m, mktest::testSeed() + (s ? 1 : 2));
    issueMixed(c, m, [&](int, int) { return s; });
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::string why;
    ASSERT_TRUE(syncClique(c, 60, &why)) << why;
    checkMixed(c, m);
  }
  cudaStreamDestroy(shared);
}

// One comm's operations of one group on several streams; then back-to-back calls on
// alternating streams (the comm orders them).
TEST_P(CollGroup, SeveralStreamsPerComm) {
  MKTEST_REQUIRE_GPU();
  Clique& c = clique(GetParam());
  ASSERT_TRUE(c.ok) << c.why;
  std::vector<cudaStream_t> extra(c.n);
  for (auto& s : extra)
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  MixedRun m;
  prepareMixed(c, m, mktest::testSeed() + 3);
  issueMixed(c, m, [&](int r, int k) { return k % 2 ? extra[r] : c.streams[r]; });
  for (auto s : extra) ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  std::string why;
  ASSERT_TRUE(syncClique(c, 60, &why)) << why;
  checkMixed(c, m);
  // 20 in-place AllReduces alternating streams, starting from 1 everywhere: n^20 (mod 2^32)
  // only if every call saw the previous one's result.
  const size_t cnt = 1024;
  DevBuf acc(4 * cnt * c.n);
  std::vector<int32_t> h(cnt * c.n, 1);
  ASSERT_EQ(mktest::syncMemcpy(acc.base, h.data(), acc.bytes, cudaMemcpyHostToDevice), cudaSuccess);
  for (int it = 0; it < 20; it++) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < c.n; r++) {
      void* p = acc.at(4 * cnt * r);
      ASSERT_EQ(ncclAllReduce(p, p, cnt, ncclInt32, ncclSum, c.comms[r],
                              it % 2 ? extra[r] : c.streams[r]),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  }
  for (auto s : extra) ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_TRUE(syncClique(c, 60, &why)) << why;
  ASSERT_EQ(mktest::syncMemcpy(h.data(), acc.base, acc.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  uint32_t want = 1;
  for (int it = 0; it < 20; it++) want *= (uint32_t)c.n;
  for (size_t i = 0; i < h.size(); i++) ASSERT_EQ((uint32_t)h[i], want) << "element " << i;
  for (auto s : extra) cudaStreamDestroy(s);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollGroup, ::testing::Values(2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "n" + std::to_string(i.param);
                         });

// One host thread per rank, no outer group: AllReduce then a ring exchange, 30 times.
TEST(CollThreads, OneThreadPerRank) {
  MKTEST_REQUIRE_GPU();
  const int n = 4;
  Clique& c = clique(n);
  ASSERT_TRUE(c.ok) << c.why;
  const size_t count = 70001;
  std::atomic<int> failures{0};
  std::vector<std::string> errs(n);
  std::vector<std::thread> th;
  for (int r = 0; r < n; r++)
    th.emplace_back([&, r] {
      cudaSetDevice(0);
      DevBuf buf(count * 4), ring(count * 4), ringIn(count * 4);
      std::vector<int32_t> h(count), in(count);
      for (int it = 0; it < 30 && !failures; it++) {
        for (size_t i = 0; i < count; i++) h[i] = (int32_t)(i * 31 + r * 7 + it);
        mktest::syncMemcpy(buf.base, h.data(), count * 4, cudaMemcpyHostToDevice);
        for (size_t i = 0; i < count; i++) in[i] = (int32_t)(i ^ (r << 8) ^ it);
        mktest::syncMemcpy(ringIn.base, in.data(), count * 4, cudaMemcpyHostToDevice);
        if (ncclAllReduce(buf.base, buf.base, count, ncclInt32, ncclSum, c.comms[r],
                          c.streams[r]) != ncclSuccess ||
            ncclGroupStart() != ncclSuccess ||
            ncclSend(ringIn.base, count, ncclInt32, (r + 1) % n, c.comms[r], c.streams[r]) ||
            ncclRecv(ring.base, count, ncclInt32, (r + n - 1) % n, c.comms[r], c.streams[r]) ||
            ncclGroupEnd() != ncclSuccess) {
          errs[r] = ncclGetLastError(nullptr);
          failures++;
          return;
        }
        if (cudaStreamSynchronize(c.streams[r]) != cudaSuccess) {
          errs[r] = "stream sync failed";
          failures++;
          return;
        }
        mktest::syncMemcpy(h.data(), buf.base, count * 4, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < count; i++) {
          int32_t want = 0;
          for (int q = 0; q < n; q++) want += (int32_t)(i * 31 + q * 7 + it);
          if (h[i] != want) {
            errs[r] = "AllReduce mismatch at " + std::to_string(i);
            failures++;
            return;
          }
        }
        mktest::syncMemcpy(h.data(), ring.base, count * 4, cudaMemcpyDeviceToHost);
        int prev = (r + n - 1) % n;
        for (size_t i = 0; i < count; i++)
          if (h[i] != (int32_t)(i ^ (prev << 8) ^ it)) {
            errs[r] = "Recv mismatch at " + std::to_string(i);
            failures++;
            return;
          }
      }
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < n; r++) EXPECT_EQ(errs[r], "") << "rank " << r;
  if (failures) dropClique(n);
}

TEST(CollP2pApi, AllToAllv) {
  MKTEST_REQUIRE_GPU();
  for (int n : {2, 3, 4}) {
    Clique& c = clique(n);
    ASSERT_TRUE(c.ok) << c.why;
    // Rank s sends (s + 2d + 1) * 1000 elements to rank d, packed in rank order.
    auto cnt = [](int s, int d) { return (size_t)(s + 2 * d + 1) * 1000; };
    std::vector<std::vector<size_t>> sc(n, std::vector<size_t>(n)), sd = sc, rc = sc, rd = sc;
    std::vector<DevBuf> sb, rb;
    std::vector<HostBuf> in(n);
    for (int r = 0; r < n; r++) {
      size_t so = 0, ro = 0;
      for (int q = 0; q < n; q++) {
        sc[r][q] = cnt(r, q);
        sd[r][q] = so;
        so += sc[r][q];
        rc[r][q] = cnt(q, r);
        rd[r][q] = ro;
        ro += rc[r][q];
      }
      fillRandom(in[r], ncclFloat32, Op::kSum, so, mktest::testSeed() + r);
      sb.emplace_back(so * 4);
      upload(sb.back().base, in[r], 0, so);
      rb.emplace_back(ro * 4);
      mktest::syncMemset(rb.back().base, 0xCD, ro * 4);
    }
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; r++)
      ASSERT_EQ(ncclAllToAllv(sb[r].base, sc[r].data(), sd[r].data(), rb[r].base, rc[r].data(),
                              rd[r].data(), ncclFloat32, c.comms[r], c.streams[r]),
                ncclSuccess)
          << ncclGetLastError(nullptr);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    std::string why;
    ASSERT_TRUE(syncClique(c, 60, &why)) << why;
    for (int r = 0; r < n; r++) {
      HostBuf got;
      size_t total = 0;
      for (int q = 0; q < n; q++) total += rc[r][q];
      download(got, rb[r].base, total, 4);
      for (int q = 0; q < n; q++)
        EXPECT_EQ(checkBytes(got, rd[r][q] * 4, in[q], sd[q][r] * 4, rc[r][q] * 4, "block"), "")
            << "n " << n << " rank " << r << " from " << q;
    }
  }
}

}  // namespace
