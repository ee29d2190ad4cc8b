// A comm object for CPU tests of the host-side API checks (test_api_args.cc,
// test_abuse_group.cc, test_zero_copy.cc).
#pragma once
#include "coll/redop.h"
#include "comm/comm.h"

namespace unittest {

// A comm that never touched a GPU (no peer memory, no collective state): its calls pass the
// argument checks, and launching them would fail, so a test also sees whether a group ran
// its work.
struct FakeComm {
  ncclComm* c;
  FakeComm(int rank, int nranks) {
    c = new ncclComm();
    c->rank = rank;
    c->nRanks = nranks;
    c->state.store(mk::CommState::kReady);
    mk::redOpTableInit(c);
    mk::commRegister(c);
  }
  ~FakeComm() {
    mk::commUnregister(c);
    mk::redOpFreeAll(c);
    delete c;
  }
};

}  // namespace unittest
