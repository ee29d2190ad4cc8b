// Helpers of the device communication API tests (see test_devcomm_util.h).
#include "gpu/test_devcomm_util.h"
#include "common/test_util.h"

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "comm/comm.h"
#include "base/param.h"
#include "transport/net_state.h"

namespace dctest {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string cudaErr(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}
#define DC_CUDA(call)                                 \
  do {                                                \
    cudaError_t e_ = (call);                          \
    if (e_ != cudaSuccess) return cudaErr(#call, e_); \
  } while (0)

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
constexpr uint8_t kPoison = 0xa5;
}  // namespace

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  const char* o = getenv(name);
  had_ = o != nullptr;
  if (o) old_ = o;
  setenv(name, value, 1);
  mk::paramReset();
}
ScopedEnv::~ScopedEnv() {
  if (had_)
    setenv(name_.c_str(), old_.c_str(), 1);
  else
    unsetenv(name_.c_str());
  mk::paramReset();
}

TestEnv::TestEnv(int nodes, size_t windowBytes, int ringSlots, int timeoutMs) {
  vars.push_back(new ScopedEnv("MKERNEL_EMULATE_NODES", std::to_string(nodes).c_str()));
  vars.push_back(new ScopedEnv("MKERNEL_NET", "socket"));
  vars.push_back(new ScopedEnv("NCCL_SOCKET_IFNAME", "lo"));
  vars.push_back(new ScopedEnv("MKERNEL_SOCKET_NCONNS", "2"));
  vars.push_back(new ScopedEnv("MKERNEL_BOOTSTRAP_TIMEOUT_S", "30"));
  vars.push_back(new ScopedEnv("MKERNEL_NET_TIMEOUT_S", "30"));
  vars.push_back(new ScopedEnv("MKERNEL_WORKSPACE_BYTES", std::to_string(windowBytes).c_str()));
  vars.push_back(new ScopedEnv("MKERNEL_NET_WINDOW_BYTES", std::to_string(windowBytes).c_str()));
  vars.push_back(new ScopedEnv("MKERNEL_TIMEOUT_MS", std::to_string(timeoutMs).c_str()));
  if (ringSlots > 0)
    vars.push_back(new ScopedEnv("MKERNEL_PROXY_RING_SLOTS", std::to_string(ringSlots).c_str()));
}
TestEnv::~TestEnv() {
  for (auto it = vars.rbegin(); it != vars.rend(); ++it) delete *it;
}

ncclResult_t VnodeComms::init(int nodes, int nRanks) {
  n = nRanks;
  env.reset(new TestEnv(nodes, 1 << 20));
  comms.assign(n, nullptr);
  std::vector<int> devs(n, 0);
  ncclResult_t r = ncclCommInitAll(comms.data(), n, devs.data());
  if (r != ncclSuccess) {
    comms.clear();
    return r;
  }
  streams.resize(n);
  for (auto& s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  return ncclSuccess;
}

VnodeComms::~VnodeComms() {
  for (auto s : streams) cudaStreamDestroy(s);
  for (auto c : comms)
    if (c) ncclCommDestroy(c);
}

std::string VnodeComms::sync() {
  for (int r = 0; r < n; r++) {
    cudaError_t e = cudaStreamSynchronize(streams[r]);
    if (e != cudaSuccess) return "rank " + std::to_string(r) + ": " + cudaGetErrorString(e);
    ncclResult_t ae = ncclSuccess;
    ncclCommGetAsyncError(comms[r], &ae);
    if (ae != ncclSuccess)
      return "rank " + std::to_string(r) + ": async error " + ncclGetErrorString(ae) + ": " +
             ncclGetLastError(comms[r]);
  }
  return "";
}

std::string makeRanks(int n, Ranks* out) {
  out->n = n;
  out->comms.assign(n, nullptr);
  std::vector<int> devs(n, 0);
  ncclResult_t r = ncclCommInitAll(out->comms.data(), n, devs.data());
  if (r != ncclSuccess) {
    out->comms.clear();
    return std::string("ncclCommInitAll: ") + ncclGetErrorString(r) + ": " +
           ncclGetLastError(nullptr);
  }
  DC_CUDA(cudaSetDevice(0));
  out->streams.assign(n, nullptr);
  for (auto& s : out->streams) DC_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (out->comms[0]->topo.nNodes <= 1) return "";
  out->wired = out->comms[0]->net != nullptr;
  if (out->wired) return "";
  return "comm init did not create the inter-node state (comm->net is null)";
}

Ranks::~Ranks() {
  for (int i = 0; i < (int)comms.size(); i++) {
    ncclComm_t c = comms[i];
    if (!c) continue;
    if (broken) {
      __atomic_store_n(c->abortFlag, 1u, __ATOMIC_RELEASE);
      mk::netAbort(c);
    }
  }
  for (int i = 0; i < (int)comms.size(); i++) {
    ncclComm_t c = comms[i];
    if (!c) continue;
    if (i < (int)streams.size() && streams[i]) streamDone(streams[i], 10);
    if (!wired) mk::netFini(c);
    if (broken)
      ncclCommAbort(c);
    else
      ncclCommDestroy(c);
  }
  for (auto s : streams)
    if (s) cudaStreamDestroy(s);
}

void killRank(Ranks& r, int rank, double waitS) {
  ncclComm_t c = r.comms[rank];
  if (!c) return;
  __atomic_store_n(c->abortFlag, 1u, __ATOMIC_RELEASE);
  mk::netAbort(c);
  streamDone(r.streams[rank], waitS);
  if (!r.wired) mk::netFini(c);
  ncclCommAbort(c);
  r.comms[rank] = nullptr;
}

Launch::~Launch() {
  if (stream) streamDone(stream, 10);
  for (void* p : {src, sends, recvs, out, status})
    if (p) cudaFree(p);
}

std::string startPlan(Ranks& r, int rank, const Plan& p, Launch* l) {
  l->rank = rank;
  l->stream = r.streams[rank];
  l->grid = p.grid;
  l->outBytes = p.outBytes;
  mk::NetTestArgs a{};
  ncclResult_t res = mk::netDevView(r.comms[rank], &a.d);
  if (res != ncclSuccess) return std::string("netDevView: ") + ncclGetLastError(nullptr);
  auto upload = [&](void** dst, const void* data, size_t bytes) -> std::string {
    DC_CUDA(cudaMalloc(dst, bytes ? bytes : 16));
    if (bytes) DC_CUDA(mktest::syncMemcpy(*dst, data, bytes, cudaMemcpyHostToDevice));
    return "";
  };
  std::string e;
  if (!(e = upload(&l->src, p.src.data(), p.src.size())).empty()) return e;
  if (!(e = upload(&l->sends, p.sends.data(), p.sends.size() * sizeof(mk::NetTestOp))).empty())
    return e;
  if (!(e = upload(&l->recvs, p.recvs.data(), p.recvs.size() * sizeof(mk::NetTestOp))).empty())
    return e;
  DC_CUDA(cudaMalloc(&l->out, p.outBytes ? p.outBytes : 16));
  DC_CUDA(mktest::syncMemset(l->out, kPoison, p.outBytes ? p.outBytes : 16));
  DC_CUDA(cudaMalloc(&l->status, sizeof(int) * p.grid));
  DC_CUDA(mktest::syncMemset(l->status, 0, sizeof(int) * p.grid));
  a.sends = static_cast<const mk::NetTestOp*>(l->sends);
  a.nSends = (int)p.sends.size();
  a.recvs = static_cast<const mk::NetTestOp*>(l->recvs);
  a.nRecvs = (int)p.recvs.size();
  a.src = static_cast<const char*>(l->src);
  a.out = static_cast<char*>(l->out);
  a.status = static_cast<int*>(l->status);
  a.quietAtEnd = p.quietAtEnd ? 1 : 0;
  a.warpScope = p.warpScope ? 1 : 0;
  DC_CUDA(mk::launchNetTest(a, p.grid, p.threads, l->stream));
  return "";
}

bool streamDone(cudaStream_t s, double timeoutS) {
  auto t0 = Clock::now();
  for (;;) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) return true;  // an error: nothing runs any more
    if (since(t0) > timeoutS) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string finishPlan(Launch& l, std::vector<uint8_t>* out, std::vector<int>* status) {
  DC_CUDA(cudaStreamSynchronize(l.stream));
  if (out) {
    out->resize(l.outBytes);
    if (l.outBytes)
      DC_CUDA(mktest::syncMemcpy(out->data(), l.out, l.outBytes, cudaMemcpyDeviceToHost));
  }
  if (status) {
    status->resize(l.grid);
    DC_CUDA(
        mktest::syncMemcpy(status->data(), l.status, sizeof(int) * l.grid, cudaMemcpyDeviceToHost));
  }
  return "";
}

ncclResult_t asyncError(ncclComm_t c, std::string* msg) {
  mk::netPollAsyncError(c);
  ncclResult_t res = ncclSuccess;
  if (ncclCommGetAsyncError(c, &res) != ncclSuccess) res = ncclInternalError;
  if (msg) {
    std::lock_guard<std::mutex> g(c->asyncMu);
    *msg = c->asyncMsg;
  }
  return res;
}

std::string runPlans(Ranks& r, const std::vector<Plan>& plans, double timeoutS,
                     std::vector<std::vector<uint8_t>>* outs) {
  std::vector<Launch> ls(r.n);
  for (int i = 0; i < r.n; i++) {
    std::string e = startPlan(r, i, plans[i], &ls[i]);
    if (!e.empty()) {
      r.broken = true;
      return "rank " + std::to_string(i) + ": " + e;
    }
  }
  // Wait for every rank; an async error on any rank (proxy failure, device record) ends
  // the wait early: the other ranks' kernels would only hit their deadline.
  auto t0 = Clock::now();
  std::string why;
  for (;;) {
    bool all = true;
    for (int i = 0; i < r.n; i++) all &= cudaStreamQuery(r.streams[i]) != cudaErrorNotReady;
    if (all) break;
    for (int i = 0; i < r.n && why.empty(); i++) {
      std::string m;
      ncclResult_t a = asyncError(r.comms[i], &m);
      if (a != ncclSuccess && a != ncclInProgress)
        why = "rank " + std::to_string(i) + " reported " + ncclGetErrorString(a) + ": " + m;
    }
    if (why.empty() && since(t0) > timeoutS) why = "kernels still running after the timeout";
    if (!why.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (!why.empty()) {
    r.broken = true;
    for (int i = 0; i < r.n; i++) {
      if (cudaStreamQuery(r.streams[i]) == cudaErrorNotReady)
        why += "; rank " + std::to_string(i) + " still running";
      __atomic_store_n(r.comms[i]->abortFlag, 1u, __ATOMIC_RELEASE);
    }
  }
  std::string all = why;
  outs->assign(r.n, {});
  for (int i = 0; i < r.n; i++) {
    if (!streamDone(r.streams[i], 15)) {
      all += "; rank " + std::to_string(i) + " did not stop after the abort";
      ls[i].stream = nullptr;  // leak its buffers rather than block in cudaFree
      for (void** p : {&ls[i].src, &ls[i].sends, &ls[i].recvs, &ls[i].out, &ls[i].status})
        *p = nullptr;
      continue;
    }
    std::vector<int> st;
    std::string e = finishPlan(ls[i], &(*outs)[i], &st);
    if (!e.empty()) all += "; rank " + std::to_string(i) + ": " + e;
    for (int b = 0; b < (int)st.size(); b++)
      if (st[b] != 0) {
        all += "; rank " + std::to_string(i) + " CTA " + std::to_string(b) + " failed at step " +
               std::to_string(st[b]);
        r.broken = true;
      }
    std::string m;
    ncclResult_t a = asyncError(r.comms[i], &m);
    if (a != ncclSuccess && a != ncclInProgress)
      all += "; rank " + std::to_string(i) + " async error " + ncclGetErrorString(a) + ": " + m;
  }
  return all;
}

Exchange makeExchange(int n, size_t windowBytes, uint64_t seed, int iter, bool warpScope) {
  Exchange x;
  x.n = n;
  x.region = windowBytes / n / 4096 * 4096;
  x.size.assign(n, std::vector<size_t>(n, 0));
  x.mis.assign(n, std::vector<size_t>(n, 0));
  std::mt19937_64 rng(splitmix(seed ^ ((uint64_t)iter << 32)));
  const size_t maxBytes = x.region - 16;
  for (int s = 0; s < n; s++)
    for (int d = 0; d < n; d++) {
      size_t b = 0;
      switch (rng() % 6) {
        case 0:
          b = rng() % 64;
          break;
        case 1:
          b = 1 + rng() % 4096;
          break;
        case 2:
          b = 1 + rng() % 65536;
          break;
        case 3:
          b = maxBytes;
          break;
        default:
          b = 1 + rng() % maxBytes;
          break;
      }
      x.size[s][d] = b;
      // A quarter of the pairs land at an odd offset: the copies' byte path.
      x.mis[s][d] = rng() % 4 == 0 ? 1 + rng() % 15 : 0;
    }
  x.plans.resize(n);
  for (int s = 0; s < n; s++) {
    Plan& p = x.plans[s];
    p.src.resize(n * x.region);
    for (size_t i = 0; i < p.src.size(); i += 8) {
      uint64_t w = splitmix(seed ^ ((uint64_t)s << 48) ^ ((uint64_t)iter << 40) ^ i);
      memcpy(&p.src[i], &w, std::min<size_t>(8, p.src.size() - i));
    }
    p.outBytes = n * x.region;
    p.warpScope = warpScope;
    p.grid = warpScope ? 2 : 4;
    p.threads = warpScope ? 128 : 256;
    for (int d = 0; d < n; d++) {
      mk::NetTestOp op{};
      op.peer = d;
      uint64_t kind = rng() % 4;
      op.flags = mk::kNetTestSignal | (kind == 1 ? mk::kNetTestZeroCopy : 0) |
                 (kind == 2 ? mk::kNetTestSplit : 0);
      op.srcOff = d * x.region;
      op.dstOff = s * x.region + x.mis[s][d];
      op.bytes = x.size[s][d];
      op.slot = (uint32_t)s;
      op.value = iter + 1;
      p.sends.push_back(op);
      mk::NetTestOp add{};
      add.peer = d;
      add.flags = mk::kNetTestSignal | mk::kNetTestAdd;
      add.slot = kAddSlot;
      add.value = 1;
      p.sends.push_back(add);
    }
  }
  for (int d = 0; d < n; d++) {
    Plan& p = x.plans[d];
    for (int s = 0; s < n; s++) {
      mk::NetTestOp op{};
      op.peer = s;
      op.dstOff = s * x.region + x.mis[s][d];
      op.bytes = x.size[s][d];
      op.outOff = s * x.region;
      op.slot = (uint32_t)s;
      op.value = iter + 1;
      p.recvs.push_back(op);
    }
    mk::NetTestOp all{};
    all.peer = -1;
    all.slot = kAddSlot;
    all.value = (uint64_t)n * (iter + 1);
    p.recvs.push_back(all);
  }
  return x;
}

std::string checkExchange(const Exchange& x, const std::vector<std::vector<uint8_t>>& outs,
                          bool onlyPresent) {
  std::string errs;
  int nErr = 0;
  for (int d = 0; d < x.n; d++) {
    const std::vector<uint8_t>& out = outs[d];
    if (onlyPresent && out.empty()) continue;
    if (out.size() != x.n * x.region) return "rank " + std::to_string(d) + ": no output";
    for (int s = 0; s < x.n; s++) {
      const std::vector<uint8_t>& src = x.plans[s].src;
      size_t bytes = x.size[s][d], bad = 0, first = 0;
      for (size_t i = 0; i < x.region; i++) {
        uint8_t want = i < bytes ? src[d * x.region + i] : kPoison;
        if (out[s * x.region + i] != want && bad++ == 0) first = i;
      }
      if (bad && nErr++ < 8) {
        char m[256];
        snprintf(m, sizeof(m),
                 "rank %d from rank %d: %zu of %zu bytes wrong (first at %zu: got %u want %u; "
                 "size %zu, dst misalignment %zu)\n",
                 d, s, bad, x.region, first, out[s * x.region + first],
                 first < bytes ? src[d * x.region + first] : kPoison, bytes, x.mis[s][d]);
        errs += m;
      }
    }
  }
  return errs;
}

void remoteBytes(const Exchange& x, int nodes, std::vector<uint64_t>* sent,
                 std::vector<uint64_t>* recv) {
  sent->assign(x.n, 0);
  recv->assign(x.n, 0);
  int per = x.n / nodes;
  for (int s = 0; s < x.n; s++)
    for (int d = 0; d < x.n; d++)
      if (s / per != d / per) {
        (*sent)[s] += x.size[s][d];
        (*recv)[d] += x.size[s][d];
      }
}

}  // namespace dctest
