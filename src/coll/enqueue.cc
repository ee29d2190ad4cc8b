// Enqueue of collectives, groups and fused operators: plan every operation of every comm
// first, then issue them in three phases (order/fork, kernels, join/record) so that the
// host never waits for a peer. One thread may drive several comms (nccl-tests): each comm's
// kernels go to its own stream and run concurrently with the other ranks' kernels, all
// waiting on the device. A fused operator is one more kind of launch (collEnqueueFn).
#include <cstdint>
#include <functional>
#include <utility>
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "coll/algo.h"
#include "coll/coll.h"
#include "coll/coll_state.h"
#include "coll/group.h"
#include "coll/hier.h"
#include "coll/launch_plan.h"
#include "coll/rendezvous.h"
#include "coll/zc_plan.h"
#include "base/checks.h"
#include "comm/comm.h"

namespace mk {

ncclResult_t collEnqueue(const CollArgs& a) {
  if (groupActive()) return groupAddColl(a);
  std::vector<CollArgs> ops{a};
  return collLaunchGroup(ops);
}

namespace {

struct CommWork {
  ncclComm* comm = nullptr;
  std::vector<const CollArgs*> colls;  // collectives in issue order
  std::vector<CollArgs> p2p;           // sends and receives in issue order
  cudaStream_t user = nullptr;         // stream of the comm's first operation
  std::vector<cudaStream_t> extra;     // other streams of its operations
  std::vector<KernelLaunch> launches;
  std::vector<HierLaunch> hier;  // inter-node launches (coll/hier.h)
  const std::function<ncclResult_t(cudaStream_t)>* fn = nullptr;  // a fused operator
  cudaStream_t exec = nullptr;
  bool fork = false;
  // Some launch keeps state across calls (device-resident sequence numbers, workspace):
  // the comm's launches must stay ordered and finalize must be able to wait for them.
  // One-rank copies touch only the user's buffers and skip that bookkeeping (it is most of
  // the host cost of a one-rank call).
  bool stateful = false;
  unsigned long long capture = 0;  // capture id of `user` (0: not capturing)
};

bool noLaunch(const CommWork& w) {
  return w.launches.empty() && w.hier.empty() && w.fn == nullptr;
}

bool isLegacy(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy;
}

ncclResult_t commUsable(ncclComm* comm, const char* api, const CommWork& w,
                        bool continuation = false) {
  CollState* cs = comm->coll;
  if (cs == nullptr) {
    MK_WARN("%s: rank %d: collective state is not initialised", api, comm->rank);
    return ncclInvalidUsage;
  }
  NCCLCHECK(collPollAsyncError(comm));
  if (continuation) return ncclSuccess;
  int ar = comm->asyncResult.load();
  if (ar != ncclSuccess && ar != ncclInProgress) {
    std::string msg;
    {
      std::lock_guard<std::mutex> g(comm->asyncMu);
      msg = comm->asyncMsg;
    }
    MK_WARN("%s: rank %d has an asynchronous error (%d): %s", api, comm->rank, ar, msg.c_str());
    return static_cast<ncclResult_t>(ar);
  }
  return ncclSuccess;
}

// Switches the current device only when needed (and back at the end): most calls come
// from a thread already on the comm's device, and cudaSetDevice is not free.
struct DeviceSwitch {
  int saved = -1, cur = -1;
  DeviceSwitch() {
    if (cudaGetDevice(&saved) != cudaSuccess) saved = -1;
    cur = saved;
  }
  cudaError_t to(int dev) {
    if (dev == cur) return cudaSuccess;
    cur = dev;
    return cudaSetDevice(dev);
  }
  ~DeviceSwitch() {
    if (saved >= 0 && cur != saved) cudaSetDevice(saved);
  }
};

ncclResult_t issue(std::vector<CommWork>& work);
ncclResult_t phaseC(std::vector<CommWork>& work, DeviceSwitch& restore);

}  // namespace

ncclResult_t collLaunchGroup(std::vector<CollArgs>& ops) {
  if (ops.empty()) return ncclSuccess;
  // 1. Per comm, in order of first appearance; plan everything before issuing anything, so
  //    that a bad argument leaves no stream half-enqueued.
  std::vector<CommWork> work;
  for (const CollArgs& a : ops) {
    auto it =
        std::find_if(work.begin(), work.end(), [&](const CommWork& w) { return w.comm == a.comm; });
    if (it == work.end()) {
      work.emplace_back();
      it = work.end() - 1;
      it->comm = a.comm;
      it->user = a.stream;
    } else if (a.stream != it->user &&
               std::find(it->extra.begin(), it->extra.end(), a.stream) == it->extra.end()) {
      it->extra.push_back(a.stream);
    }
    if (a.type == CollType::kSend || a.type == CollType::kRecv)
      it->p2p.push_back(a);
    else
      it->colls.push_back(&a);
  }
  for (CommWork& w : work) {
    const char* api = w.colls.empty() ? "ncclSend/ncclRecv" : collName(w.colls[0]->type);
    NCCLCHECK(commUsable(w.comm, api, w));
    // Collectives first, in issue order (all ranks issue them in the same order), then all
    // point-to-point operations as one kernel whose streams progress independently.
    if (w.comm->coll->interNode) {
      // Comms spanning (virtual) nodes: everything goes through the device communication
      // API (coll/hier.h), collectives and point-to-point alike.
      NCCLCHECK(hierPlanWork(w.comm, w.colls, w.p2p, &w.hier));
      continue;
    }
    for (const CollArgs* a : w.colls) {
      KernelLaunch l;
      bool empty = false;
      NCCLCHECK(planColl(w.comm, *a, &l, &empty));
      if (!empty) w.launches.push_back(std::move(l));
    }
    if (!w.p2p.empty()) {
      KernelLaunch l;
      bool empty = false;
      NCCLCHECK(planP2p(w.comm, w.p2p, &l, &empty));
      if (!empty) w.launches.push_back(std::move(l));
    }
  }
  return issue(work);
}

ncclResult_t collEnqueueFn(ncclComm* comm, cudaStream_t stream, const char* api,
                           const std::function<ncclResult_t(cudaStream_t)>& launch,
                           bool continuation) {
  NCCLCHECK(commCheck(comm, api));
  if (!continuation) NCCLCHECK(commCheckReady(comm, api));
  if (groupActive()) {
    MK_WARN("%s: rank %d: fused operations inside ncclGroupStart/ncclGroupEnd are not supported",
            api, comm->rank);
    return ncclInvalidUsage;
  }
  std::vector<CommWork> work(1);
  work[0].comm = comm;
  work[0].user = stream;
  work[0].fn = &launch;
  NCCLCHECK(commUsable(comm, api, work[0], continuation));
  return issue(work);
}

namespace {

// Phases A to C of every planned comm of a call or group.
ncclResult_t issue(std::vector<CommWork>& work) {
  // 1b. Ranks of this process on the same GPU driven by other threads: wait (on the host)
  //     until they have issued their matching calls, so that no kernel of ours spins for a
  //     thread that may be blocked in a device-wide synchronisation (coll/rendezvous.h).
  std::vector<RdvWork> rdv;
  std::string api = "ncclGroupEnd";
  for (CommWork& w : work) {
    if (w.comm->coll == nullptr || !w.comm->coll->rdv) continue;
    RdvWork r;
    r.comm = w.comm;
    r.colls = w.colls.size() + (w.fn ? 1 : 0);
    r.p2p = &w.p2p;
    r.launches = !noLaunch(w);
    rdv.push_back(r);
    if (work.size() > 1) continue;
    if (w.fn)
      api = "fused operator";
    else if (w.colls.empty())
      api = "ncclSend/ncclRecv";
    else if (w.colls.size() == 1)
      api = std::string("nccl") + collName(w.colls[0]->type);
  }
  if (!rdv.empty()) NCCLCHECK(rdvArrive(rdv, api.c_str()));
  // Peers must not wait for launches that an error below skips.
  struct LaunchMark {
    const std::vector<RdvWork>& rdv;
    bool done = false;
    ~LaunchMark() {
      if (!done && !rdv.empty()) rdvLaunched(rdv, false);
    }
  } mark{rdv};
  // 2. A rank's kernels must be able to run concurrently with its peers' kernels: the
  //    legacy default stream, or one stream shared by several comms of this group, would
  //    serialise them (deadlock), so those launches go to the comm's internal stream.
  std::map<cudaStream_t, int> users;
  if (work.size() > 1)
    for (CommWork& w : work)
      if (!noLaunch(w)) users[w.user]++;
  DeviceSwitch restore;
  // Phase A: cross-call ordering and fork.
  for (CommWork& w : work) {
    if (noLaunch(w)) continue;
    CollState* cs = w.comm->coll;
    CUDACHECK(restore.to(w.comm->cudaDev));
    w.stateful = !w.hier.empty() || w.fn != nullptr;
    for (const KernelLaunch& l : w.launches) w.stateful |= l.kind != KernelLaunch::kMemcpy;
    if (w.stateful) {
      cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
      CUDACHECK(cudaStreamGetCaptureInfo(w.user, &st, &w.capture));
      if (st != cudaStreamCaptureStatusActive) w.capture = 0;
    }
    w.fork = isLegacy(w.user) || (work.size() > 1 && users[w.user] > 1);
    w.exec = w.fork ? cs->internal : w.user;
    if (w.fork) {
      CUDACHECK(cudaEventRecord(cs->forkEvent, w.user));
      CUDACHECK(cudaStreamWaitEvent(w.exec, cs->forkEvent, 0));
    }
    for (cudaStream_t s : w.extra) {
      CUDACHECK(cudaEventRecord(cs->forkEvent, s));
      CUDACHECK(cudaStreamWaitEvent(w.exec, cs->forkEvent, 0));
    }
    // The comm's previous launch went to another stream: keep the comm's operations in
    // order (the device-resident sequence numbers assume it). Only within one capture, or
    // outside of any.
    if (w.stateful && cs->haveLast && cs->lastStream != w.exec && cs->lastCapture == w.capture)
      CUDACHECK(cudaStreamWaitEvent(w.exec, cs->lastEvent, 0));
  }
  // Phase B: the kernels, the i-th launch of every comm before any (i+1)-th: streams that
  // share a hardware queue (more streams than CUDA_DEVICE_MAX_CONNECTIONS) then never hold a
  // rank's first kernel behind another rank's second, which waits for it.
  // A failure part way still runs phase C: what was enqueued on a forked stream must be
  // joined back into the user's stream and recorded as the comm's last work, or a free on
  // the user's stream (a callback's scratch) and the comm's next operation would not be
  // ordered after it.
  auto phaseB = [&]() -> ncclResult_t {
    size_t rounds = 0;
    for (CommWork& w : work) rounds = std::max(rounds, w.launches.size());
    for (size_t i = 0; i < rounds; i++)
      for (CommWork& w : work) {
        if (i >= w.launches.size()) continue;
        CUDACHECK(restore.to(w.comm->cudaDev));
        NCCLCHECK(runLaunch(w.comm, w.launches[i], w.exec));
      }
    // The inter-node launches too, round by round (AllGather, Broadcast and two-node
    // ReduceScatter take two: one comm's second must not queue ahead of another's first).
    size_t hierRounds = 0;
    for (CommWork& w : work)
      if (!noLaunch(w)) hierRounds = std::max(hierRounds, w.hier.size());
    for (size_t i = 0; i < hierRounds; i++)
      for (CommWork& w : work) {
        if (noLaunch(w) || i >= w.hier.size()) continue;
        CUDACHECK(restore.to(w.comm->cudaDev));
        NCCLCHECK(hierRun(w.comm, w.hier[i], w.exec));
      }
    for (CommWork& w : work) {
      if (noLaunch(w) || !w.fn) continue;
      CUDACHECK(restore.to(w.comm->cudaDev));
      NCCLCHECK((*w.fn)(w.exec));
    }
    return ncclSuccess;
  };
  const ncclResult_t launched = phaseB();
  if (launched == ncclSuccess) {
    // Phase B': the joins below wait for our kernels; queue them only behind the in-process
    // peers' matching kernels (coll/rendezvous.h, rdvLaunched).
    if (!rdv.empty()) rdvLaunched(rdv, true);
    mark.done = true;
  }
  // Phase C: join the user's streams and record completion.
  const ncclResult_t joined = phaseC(work, restore);
  return launched != ncclSuccess ? launched : joined;
}

// Phase C of issue(): join the user's streams and record completion of what was enqueued.
ncclResult_t phaseC(std::vector<CommWork>& work, DeviceSwitch& restore) {
  for (CommWork& w : work) {
    if (noLaunch(w)) continue;
    CollState* cs = w.comm->coll;
    CUDACHECK(restore.to(w.comm->cudaDev));
    if (w.stateful) {
      cs->lastEvent = w.capture == 0 ? cs->doneEvent : cs->orderEvent;
      CUDACHECK(cudaEventRecord(cs->lastEvent, w.exec));
      cs->lastStream = w.exec;
      cs->lastCapture = w.capture;
      cs->haveLast = true;
      if (w.capture == 0) cs->haveDone = true;
    }
    if (w.fork || !w.extra.empty()) {
      CUDACHECK(cudaEventRecord(cs->joinEvent, w.exec));
      if (w.fork) CUDACHECK(cudaStreamWaitEvent(w.user, cs->joinEvent, 0));
      for (cudaStream_t s : w.extra) CUDACHECK(cudaStreamWaitEvent(s, cs->joinEvent, 0));
    }
  }
  return ncclSuccess;
}

}  // namespace

ncclResult_t collEstimateGroup(const std::vector<CollArgs>& ops, float* usec) {
  // Operations of one comm run one after the other; different comms run concurrently.
  std::map<ncclComm*, double> perComm;
  for (const CollArgs& a : ops) {
    int n = a.comm ? a.comm->nRanks : 1;
    uint64_t bytes = (uint64_t)a.count * dtypeSize(a.dtype);
    Algo algo = Algo::kDirect;
    const bool zc = a.comm && a.comm->coll && a.comm->coll->zeroCopy;
    if (a.type == CollType::kAllReduce)
      algo = allReduceAlgo(bytes, n, collForcedAlgo(), zc);
    else if ((a.type == CollType::kReduceScatter || a.type == CollType::kAllGather) && zc &&
             zcSizeAllows(zcRemoteOf(a, n).msgBytes, n))
      algo = Algo::kZeroCopy;  // one process on one GPU: any buffers (zc_plan.h, step 2)
    perComm[a.comm] += collUs(a.type, algo, bytes, n);
  }
  double t = 0;
  for (auto& kv : perComm) t = std::max(t, kv.second);
  *usec = (float)t;
  return ncclSuccess;
}

}  // namespace mk
