// Fake comms for the CPU tests of the host rendezvous (coll/rendezvous.h): n ranks of one comm
// in this process on "GPU 0", each with the collective state that the rendezvous uses, and
// helpers that issue a rank's part of a call.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "coll/coll_state.h"
#include "coll/rendezvous.h"
#include "comm/comm.h"

namespace rdvtest {

// Rank `other` (if >= 0) lives in another process; `hash` tells comms apart.
struct FakeComms {
  std::vector<std::unique_ptr<ncclComm>> c;
  std::vector<uint32_t> abortWords;
  explicit FakeComms(int n, int other = -1, uint64_t hash = 0x5eed) : abortWords(n, 0) {
    for (int r = 0; r < n; r++) {
      c.emplace_back(new ncclComm());
      ncclComm* comm = c.back().get();
      comm->rank = r;
      comm->nRanks = n;
      comm->cudaDev = 0;
      comm->commHash = hash;
      comm->abortFlag = &abortWords[r];
      comm->peerInfo.resize(n);
      for (int q = 0; q < n; q++) {
        comm->peerInfo[q].hostHash = 1;
        comm->peerInfo[q].pidHash = q == other ? 3 : 2;
        comm->peerInfo[q].cudaDev = 0;
      }
      comm->coll = new mk::CollState();
    }
    for (int r = 0; r < n; r++) {
      if (r == other) continue;
      mk::CollState* cs = c[r]->coll;
      EXPECT_EQ(mk::rdvJoin(c[r].get(), &cs->rdv, &cs->rdvSlot), ncclSuccess);
    }
  }
  ~FakeComms() {
    for (auto& p : c) {
      mk::rdvLeave(p->coll->rdv, p->coll->rdvSlot);
      delete p->coll;
    }
  }
  FakeComms(const FakeComms&) = delete;
  FakeComms& operator=(const FakeComms&) = delete;
  ncclComm* operator[](int r) { return c[r].get(); }
  void abortAll() {
    for (auto& w : abortWords) __atomic_store_n(&w, 1u, __ATOMIC_RELEASE);
  }
};

// One element sent to / received from peer.
inline mk::CollArgs p2pOp(mk::CollType type, int peer) {
  mk::CollArgs a{};
  a.type = type;
  a.root = peer;
  a.count = 1;
  return a;
}
inline mk::CollArgs sendTo(int peer) {
  return p2pOp(mk::CollType::kSend, peer);
}
inline mk::CollArgs recvFrom(int peer) {
  return p2pOp(mk::CollType::kRecv, peer);
}

// One comm's part of a call: n collectives and the point-to-point operations.
inline mk::RdvWork work(ncclComm* comm, uint64_t colls, const std::vector<mk::CollArgs>* p2p,
                        bool launches = true) {
  mk::RdvWork w;
  w.comm = comm;
  w.colls = colls;
  w.p2p = p2p;
  w.launches = launches;
  return w;
}

inline ncclResult_t coll(ncclComm* comm, uint64_t n = 1) {
  return mk::rdvArrive({work(comm, n, nullptr)}, "test");
}

inline ncclResult_t p2p(ncclComm* comm, const std::vector<mk::CollArgs>& ops) {
  return mk::rdvArrive({work(comm, 0, &ops)}, "test");
}

}  // namespace rdvtest
