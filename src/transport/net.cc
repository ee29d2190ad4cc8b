// Backend selection and the blocking helpers shared by every user of the net interface.
#include "transport/net.h"

#include <cstdint>
#include <memory>
#include <sched.h>
#include <strings.h>

#include <chrono>

#include "base/checks.h"
#include "base/param.h"

namespace mk {

static int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t netTimeoutMs() {
  int64_t s = MK_PARAM_INT(NetTimeoutS);
  return s > 0 ? s * 1000 : 120000;
}

static ncclResult_t tryBackend(const char* which, std::unique_ptr<Net>* out) {
  ncclResult_t res;
  if (strcasecmp(which, "socket") == 0) {
    res = netCreateSocket(out);
  } else if (strcasecmp(which, "verbs") == 0 || strcasecmp(which, "ib") == 0) {
    res = netCreateVerbs(out);
  } else if (strcasecmp(which, "plugin") == 0) {
    const char* p = MK_PARAM_STR(NetPlugin);
    if (p[0] == '\0') {
      MK_WARN("MKERNEL_NET=plugin but NCCL_NET_PLUGIN is not set");
      return ncclInvalidArgument;
    }
    res = netLoadPlugin(p, out);
  } else {
    MK_WARN("MKERNEL_NET=%s: unknown backend (socket, verbs, plugin)", which);
    return ncclInvalidArgument;
  }
  if (res != ncclSuccess) return res;
  int ndev = 0;
  if ((*out)->devices(&ndev) != ncclSuccess || ndev <= 0) {
    MK_INFO(kNet, "net backend %s has no device", which);
    out->reset();
    return ncclSystemError;
  }
  MK_INFO(kNet, "net backend %s: %d device(s)", (*out)->name(), ndev);
  return ncclSuccess;
}

ncclResult_t netCreate(std::unique_ptr<Net>* out) {
  const char* forced = MK_PARAM_STR(Net);
  if (forced[0] != '\0') return tryBackend(forced, out);
  const char* plugin = MK_PARAM_STR(NetPlugin);
  if (plugin[0] != '\0' && strcasecmp(plugin, "none") != 0) {
    if (tryBackend("plugin", out) == ncclSuccess) return ncclSuccess;
    MK_INFO(kNet, "NCCL_NET_PLUGIN=%s could not be used; trying internal backends", plugin);
  }
  if (MK_PARAM_INT(IbDisable) == 0 && tryBackend("verbs", out) == ncclSuccess) return ncclSuccess;
  return tryBackend("socket", out);
}

template <typename F>
static ncclResult_t loopUntil(F step, void** comm, int64_t timeoutMs,
                              const volatile uint32_t* abortFlag, const char* what) {
  int64_t deadline = nowMs() + timeoutMs;
  *comm = nullptr;
  for (int spin = 0;; spin++) {
    NCCLCHECK(step(comm));
    if (*comm != nullptr) return ncclSuccess;
    if (abortFlag && *abortFlag) {
      MK_WARN("net %s aborted", what);
      return ncclRemoteError;
    }
    if (nowMs() > deadline) {
      MK_WARN("net %s: no peer after %lld ms", what, (long long)timeoutMs);
      return ncclRemoteError;
    }
    if (spin > 100) sched_yield();
  }
}

ncclResult_t netConnectBlocking(Net* net, int dev, void* handle, void** sendComm, int64_t timeoutMs,
                                const volatile uint32_t* abortFlag) {
  return loopUntil([&](void** c) { return net->connect(dev, handle, c); }, sendComm, timeoutMs,
                   abortFlag, "connect");
}

ncclResult_t netAcceptBlocking(Net* net, void* listenComm, void** recvComm, int64_t timeoutMs,
                               const volatile uint32_t* abortFlag) {
  return loopUntil([&](void** c) { return net->accept(listenComm, c); }, recvComm, timeoutMs,
                   abortFlag, "accept");
}

ncclResult_t netWaitRequest(Net* net, void* request, size_t* sizes, int64_t timeoutMs) {
  int64_t deadline = nowMs() + timeoutMs;
  for (int spin = 0;; spin++) {
    int done = 0;
    NCCLCHECK(net->test(request, &done, sizes));
    if (done) return ncclSuccess;
    if (nowMs() > deadline) {
      MK_WARN("net request %p not complete after %lld ms", request, (long long)timeoutMs);
      return ncclRemoteError;
    }
    if (spin > 100) sched_yield();
  }
}

}  // namespace mk
