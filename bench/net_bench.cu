// Inter-node path of the device communication API on one GPU: 2 virtual nodes x 4 ranks
// (MKERNEL_EMULATE_NODES=2, socket backend on loopback).
//   bandwidth: ranks 0-3 put to ranks 4-7 (pair i -> i+4) with put_signal, zero-copy (source
//              in the proxy's window) and staged (source anywhere in device memory), against
//              the raw TCP loopback throughput of the same pairs and connection count,
//              measured here with plain sockets (target: put >= 70% of raw);
//   latency:   GPU put_signal -> data landed and signalled at the peer (ping-pong / 2,
//              %globaltimer inside the kernel), against a host-driven send of the same size
//              (cudaMemcpy D2H + TCP send -> recv + cudaMemcpy H2D, ping-pong / 2), and raw
//              TCP ping-pong.
// Writes JSON (command, commit, device, date) and prints tables.
//   bench_net_bench [--iters N] [--ctas C] [--sizes 65536,1048576,...] [--out file.json]
//                   [--commit SHA]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include "core/comm.h"
#include "core/param.h"
#include "device/net/devcomm.cuh"
#include "transport/net_state.h"

namespace dn = mk::dev::net;

namespace {

#define CK(call)                                                                            \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)
#define NK(call)                                                                                \
  do {                                                                                          \
    ncclResult_t r_ = (call);                                                                   \
    if (r_ != ncclSuccess) {                                                                    \
      fprintf(stderr, "%s:%d %s: %s (%s)\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_), \
              ncclGetLastError(nullptr));                                                       \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

using Clock = std::chrono::steady_clock;
double now() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// ---- kernels -----------------------------------------------------------------------------
// Sender: CTA b puts slice b of the message `iters` times, adding 1 to the peer's slot each
// time; t0 = the earliest start.
__global__ void bwSend(mk::NetDev d, const char* src, int peer, uint64_t bytes, int iters,
                       uint32_t slot, unsigned long long* t0, int* ok) {
  if (threadIdx.x == 0) atomicMin(t0, (unsigned long long)mk::dev::globalTimerNs());
  uint64_t per = (bytes / gridDim.x + 15) / 16 * 16;
  uint64_t lo = per * blockIdx.x < bytes ? per * blockIdx.x : bytes;
  uint64_t hi = lo + per < bytes ? lo + per : bytes;
  bool good = true;
  for (int i = 0; i < iters && good; i++)
    good = dn::put_signal(d, src + lo, peer, lo, hi - lo, slot, 1, mk::kSignalAdd);
  if (good) good = dn::quiet(d);
  if (!good && threadIdx.x == 0) *ok = 0;
}

// Receiver: waits for every slice of every iteration; t1 = when the last one landed.
__global__ void bwRecv(mk::NetDev d, uint32_t slot, uint64_t target, int from,
                       unsigned long long* t1, int* ok) {
  bool good = dn::wait_signal(d, slot, target, from);
  if (threadIdx.x == 0) {
    *t1 = mk::dev::globalTimerNs();
    if (!good) *ok = 0;
  }
}

// Ping-pong: the initiator puts, the responder waits then puts back. Timed after `warm`
// round trips.
__global__ void pingPong(mk::NetDev d, const char* src, int peer, uint64_t bytes, int iters,
                         int warm, int initiator, uint32_t slotIn, uint32_t slotOut,
                         unsigned long long* ns, int* ok) {
  bool good = true;
  uint64_t t = 0;
  for (int i = 0; i < warm + iters && good; i++) {
    if (i == warm) t = mk::dev::globalTimerNs();
    if (initiator) {
      good = dn::put_signal(d, src, peer, 0, bytes, slotOut, i + 1) &&
             dn::wait_signal(d, slotIn, i + 1, peer);
    } else {
      good = dn::wait_signal(d, slotIn, i + 1, peer) &&
             dn::put_signal(d, src, peer, 0, bytes, slotOut, i + 1);
    }
  }
  if (threadIdx.x == 0) {
    *ns = mk::dev::globalTimerNs() - t;
    if (!good) *ok = 0;
  }
}

// ---- plain TCP ---------------------------------------------------------------------------
int listenLoopback(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(fd, (sockaddr*)&a, sizeof(a)) != 0 || listen(fd, 256) != 0) {
    perror("bind/listen");
    exit(1);
  }
  socklen_t l = sizeof(a);
  getsockname(fd, (sockaddr*)&a, &l);
  *port = ntohs(a.sin_port);
  return fd;
}
// A connected pair of TCP sockets over loopback: {sender end, receiver end}.
std::pair<int, int> tcpPair(int lfd, int port) {
  int c = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(c, (sockaddr*)&a, sizeof(a)) != 0) {
    perror("connect");
    exit(1);
  }
  int s = accept(lfd, nullptr, nullptr);
  int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return {c, s};
}
void sendAll(int fd, const char* p, size_t n) {
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) {
      perror("send");
      exit(1);
    }
    p += k, n -= (size_t)k;
  }
}
void recvAll(int fd, char* p, size_t n) {
  while (n) {
    ssize_t k = recv(fd, p, n, 0);
    if (k <= 0) {
      perror("recv");
      exit(1);
    }
    p += k, n -= (size_t)k;
  }
}

// pairs x conns connections, each moving bytesPerPair / conns; GB/s of the whole.
double rawTcpBandwidth(int pairs, int conns, size_t bytesPerPair) {
  int port = 0, lfd = listenLoopback(&port);
  std::vector<std::pair<int, int>> fds;
  for (int i = 0; i < pairs * conns; i++) fds.push_back(tcpPair(lfd, port));
  size_t per = bytesPerPair / conns;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> th;
  for (auto& f : fds) {
    th.emplace_back([&, f] {
      std::vector<char> buf(4 << 20, 1);
      ready++;
      while (!go.load()) std::this_thread::yield();
      for (size_t left = per; left;) {
        size_t n = std::min(left, buf.size());
        sendAll(f.first, buf.data(), n);
        left -= n;
      }
    });
    th.emplace_back([&, f] {
      std::vector<char> buf(4 << 20);
      ready++;
      while (!go.load()) std::this_thread::yield();
      for (size_t left = per; left;) {
        size_t n = std::min(left, buf.size());
        recvAll(f.second, buf.data(), n);
        left -= n;
      }
    });
  }
  while (ready.load() < (int)th.size()) std::this_thread::yield();
  double t0 = now();
  go = true;
  for (auto& t : th) t.join();
  double dt = now() - t0;
  for (auto& f : fds) close(f.first), close(f.second);
  close(lfd);
  return (double)per * conns * pairs / dt / 1e9;
}

// One-way latency (us) of a host-driven transfer: ping-pong over one TCP connection, with
// (withCopies) the GPU<->host copies a host-driven transport needs on both ends.
double hostPingPongUs(size_t bytes, int iters, int warm, bool withCopies) {
  int port = 0, lfd = listenLoopback(&port);
  auto f = tcpPair(lfd, port);
  double result = 0;
  auto side = [&](int fd, bool initiator) {
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    char *h = nullptr, *dev = nullptr;
    CK(cudaHostAlloc((void**)&h, std::max<size_t>(bytes, 1), cudaHostAllocDefault));
    CK(cudaMalloc((void**)&dev, std::max<size_t>(bytes, 1)));
    double t0 = 0;
    for (int i = 0; i < warm + iters; i++) {
      if (i == warm) t0 = now();
      auto out = [&] {
        if (withCopies) {
          CK(cudaMemcpyAsync(h, dev, bytes, cudaMemcpyDeviceToHost, s));
          CK(cudaStreamSynchronize(s));
        }
        sendAll(fd, h, bytes);
      };
      auto in = [&] {
        recvAll(fd, h, bytes);
        if (withCopies) {
          CK(cudaMemcpyAsync(dev, h, bytes, cudaMemcpyHostToDevice, s));
          CK(cudaStreamSynchronize(s));
        }
      };
      if (initiator)
        out(), in();
      else
        in(), out();
    }
    if (initiator) result = (now() - t0) / iters / 2 * 1e6;
    cudaFreeHost(h);
    cudaFree(dev);
    cudaStreamDestroy(s);
  };
  std::thread b(side, f.second, false);
  side(f.first, true);
  b.join();
  close(f.first), close(f.second), close(lfd);
  return result;
}

std::string gitCommit() {
  FILE* p = popen("git rev-parse --short HEAD 2>/dev/null", "r");
  if (!p) return "unknown";
  char buf[64] = {};
  std::string s = fgets(buf, sizeof(buf), p) ? buf : "unknown";
  pclose(p);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.empty() ? "unknown" : s;
}

void setDefault(const char* name, const char* value) {
  if (!getenv(name)) setenv(name, value, 1);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20, ctas = 4, latIters = 200;
  std::vector<size_t> sizes = {64 << 10, 1 << 20, 4 << 20, 16 << 20};
  std::vector<size_t> latSizes = {8, 1024, 65536, 1 << 20};
  std::string out = "bench/results/net-bench.json", commit;
  std::string cmd = argv[0];
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    cmd += " " + a;
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", a.c_str());
        exit(2);
      }
      cmd += std::string(" ") + argv[i + 1];
      return argv[++i];
    };
    if (a == "--iters")
      iters = atoi(next().c_str());
    else if (a == "--ctas")
      ctas = atoi(next().c_str());
    else if (a == "--lat-iters")
      latIters = atoi(next().c_str());
    else if (a == "--out")
      out = next();
    else if (a == "--commit")
      commit = next();
    else if (a == "--sizes") {
      sizes.clear();
      std::string s = next();
      for (size_t p = 0; p < s.size();) {
        size_t q = s.find(',', p);
        sizes.push_back(strtoull(s.substr(p, q - p).c_str(), nullptr, 10));
        p = q == std::string::npos ? s.size() : q + 1;
      }
    } else {
      fprintf(stderr,
              "usage: %s [--iters N] [--ctas C] [--lat-iters N] [--sizes a,b] "
              "[--out file] [--commit SHA]\n",
              argv[0]);
      return 2;
    }
  }
  if (commit.empty()) commit = gitCommit();
  setDefault("MKERNEL_EMULATE_NODES", "2");
  setDefault("MKERNEL_NET", "socket");
  setDefault("NCCL_SOCKET_IFNAME", "lo");
  setDefault("MKERNEL_WORKSPACE_BYTES", "33554432");
  mk::paramReset();
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("no GPU: nothing to measure\n");
    return 0;
  }
  CK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int n = 8, pairs = 4;
  std::vector<ncclComm_t> comms(n);
  std::vector<int> devs(n, 0);
  NK(ncclCommInitAll(comms.data(), n, devs.data()));
  CK(cudaSetDevice(0));
  bool wired = comms[0]->net != nullptr;
  if (!wired) {  // core/init.cc does not call netInit yet
    std::vector<std::thread> th;
    for (int i = 0; i < n; i++)
      th.emplace_back([&, i] {
        cudaSetDevice(0);
        NK(mk::netInit(comms[i]));
      });
    for (auto& t : th) t.join();
  }
  std::vector<mk::NetDev> view(n);
  for (int i = 0; i < n; i++) NK(mk::netDevView(comms[i], &view[i]));
  size_t maxSize = 0;
  for (size_t s : sizes) maxSize = std::max(maxSize, s);
  for (size_t s : sizes)
    if (s > view[0].windowBytes) {
      fprintf(stderr, "size %zu exceeds the window (%llu bytes; MKERNEL_WORKSPACE_BYTES)\n", s,
              (unsigned long long)view[0].windowBytes);
      return 2;
    }
  std::vector<cudaStream_t> st(n);
  std::vector<char*> src(n);
  for (int i = 0; i < n; i++) {
    CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
    CK(cudaMalloc((void**)&src[i], std::max<size_t>(maxSize, 1 << 20)));
    CK(cudaMemset(src[i], i + 1, std::max<size_t>(maxSize, 1 << 20)));
  }
  // Timestamps and the success flag live in device memory (GPU atomics on mapped host
  // memory are not guaranteed over PCIe) and are copied back after each run.
  unsigned long long* dtm = nullptr;  // [2n]: senders' start, receivers' end
  int* dok = nullptr;
  std::vector<unsigned long long> tm(2 * n);
  CK(cudaMalloc((void**)&dtm, sizeof(unsigned long long) * 2 * n));
  CK(cudaMalloc((void**)&dok, sizeof(int)));
  auto resetTimes = [&] {
    for (int i = 0; i < n; i++) tm[i] = ~0ull, tm[n + i] = 0;
    int one = 1;
    CK(cudaMemcpy(dtm, tm.data(), sizeof(unsigned long long) * 2 * n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dok, &one, sizeof(int), cudaMemcpyHostToDevice));
  };
  auto readTimes = [&]() -> bool {
    int good = 0;
    CK(cudaMemcpy(tm.data(), dtm, sizeof(unsigned long long) * 2 * n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&good, dok, sizeof(int), cudaMemcpyDeviceToHost));
    return good != 0;
  };
  const int conns = (int)mk::paramInt(mk::ParamId::SocketNConns);
  uint32_t slot = 16;

  struct BwRow {
    size_t bytes;
    double zc, staged, raw;
  };
  std::vector<BwRow> bw;
  printf("# inter-node bandwidth, %d pairs (rank i -> i+4), %d CTAs per sender, %d iterations\n",
         pairs, ctas, iters);
  printf("%12s %14s %14s %14s %8s\n", "bytes", "put zc GB/s", "put stg GB/s", "raw TCP GB/s",
         "zc/raw");
  for (size_t bytes : sizes) {
    BwRow row{bytes, 0, 0, 0};
    for (int mode = 0; mode < 2; mode++) {
      resetTimes();
      uint32_t s = slot++;
      for (int i = 0; i < pairs; i++)
        bwRecv<<<1, 32, 0, st[i + pairs]>>>(view[i + pairs], s, (uint64_t)ctas * iters, i,
                                            &dtm[n + i], dok);
      for (int i = 0; i < pairs; i++) {
        // Zero-copy: the source is the user part of the proxy's source window.
        const char* from = mode == 0 ? view[i].sendBase : src[i];
        bwSend<<<ctas, 256, 0, st[i]>>>(view[i], from, i + pairs, bytes, iters, s, &dtm[i], dok);
      }
      for (int i = 0; i < n; i++) CK(cudaStreamSynchronize(st[i]));
      if (!readTimes()) {
        fprintf(stderr, "a transfer failed\n");
        for (int i = 0; i < n; i++) mk::netPollAsyncError(comms[i]);
        return 1;
      }
      unsigned long long t0 = ~0ull, t1 = 0;
      for (int i = 0; i < pairs; i++) t0 = std::min(t0, tm[i]), t1 = std::max(t1, tm[n + i]);
      double gbs = (double)bytes * iters * pairs / (double)(t1 - t0);
      (mode == 0 ? row.zc : row.staged) = gbs;
    }
    row.raw = rawTcpBandwidth(pairs, conns, bytes * iters);
    printf("%12zu %14.2f %14.2f %14.2f %8.2f\n", bytes, row.zc, row.staged, row.raw,
           row.zc / row.raw);
    bw.push_back(row);
  }

  struct LatRow {
    size_t bytes;
    double gpu, host, tcp;
  };
  std::vector<LatRow> lat;
  const int warm = 20;
  printf("# one-way latency (ping-pong / 2), rank 0 <-> rank 4, %d iterations\n", latIters);
  printf("%12s %14s %16s %14s\n", "bytes", "GPU put us", "host-driven us", "raw TCP us");
  for (size_t bytes : latSizes) {
    uint32_t a = slot++, b = slot++;
    resetTimes();
    pingPong<<<1, 256, 0, st[4]>>>(view[4], src[4], 0, bytes, latIters, warm, 0, a, b, &dtm[1],
                                   dok);
    pingPong<<<1, 256, 0, st[0]>>>(view[0], src[0], 4, bytes, latIters, warm, 1, b, a, &dtm[0],
                                   dok);
    CK(cudaStreamSynchronize(st[0]));
    CK(cudaStreamSynchronize(st[4]));
    if (!readTimes()) {
      fprintf(stderr, "ping-pong failed\n");
      for (int i = 0; i < n; i++) mk::netPollAsyncError(comms[i]);
      return 1;
    }
    LatRow r{bytes, (double)tm[0] / latIters / 2 / 1e3, hostPingPongUs(bytes, latIters, warm, true),
             hostPingPongUs(bytes, latIters, warm, false)};
    printf("%12zu %14.2f %16.2f %14.2f\n", bytes, r.gpu, r.host, r.tcp);
    lat.push_back(r);
  }

  time_t t = time(nullptr);
  char date[64];
  strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
  FILE* f = fopen(out.c_str(), "w");
  if (!f) {
    perror(out.c_str());
  } else {
    double worst = 1e9;
    for (auto& r : bw) worst = std::min(worst, std::max(r.zc, r.staged) / r.raw);
    fprintf(f, "{\n  \"benchmark\": \"net\",\n  \"command\": \"%s\",\n  \"git_commit\": \"%s\",\n",
            cmd.c_str(), commit.c_str());
    fprintf(f, "  \"device\": \"%s\",\n  \"date\": \"%s\",\n", prop.name, date);
    fprintf(f,
            "  \"setup\": \"2 virtual nodes x 4 ranks on one GPU, MKERNEL_NET=%s, "
            "MKERNEL_SOCKET_NCONNS=%d, iters %d, CTAs %d\",\n",
            mk::paramStr(mk::ParamId::Net), conns, iters, ctas);
    fprintf(f, "  \"target_put_over_raw\": 0.70,\n  \"min_put_over_raw\": %.3f,\n", worst);
    fprintf(f, "  \"bandwidth\": [\n");
    for (size_t i = 0; i < bw.size(); i++)
      fprintf(f,
              "    {\"bytes\": %zu, \"put_zero_copy_gbs\": %.3f, \"put_staged_gbs\": %.3f, "
              "\"raw_tcp_gbs\": %.3f, \"zero_copy_over_raw\": %.3f}%s\n",
              bw[i].bytes, bw[i].zc, bw[i].staged, bw[i].raw, bw[i].zc / bw[i].raw,
              i + 1 < bw.size() ? "," : "");
    fprintf(f, "  ],\n  \"latency_us\": [\n");
    for (size_t i = 0; i < lat.size(); i++)
      fprintf(f,
              "    {\"bytes\": %zu, \"gpu_put\": %.2f, \"host_driven\": %.2f, \"raw_tcp\": "
              "%.2f}%s\n",
              lat[i].bytes, lat[i].gpu, lat[i].host, lat[i].tcp, i + 1 < lat.size() ? "," : "");
    fprintf(f, "  ]\n}\n");
    fclose(f);
    printf("wrote %s\n", out.c_str());
  }
  for (int i = 0; i < n; i++) {
    if (!wired) mk::netFini(comms[i]);
    ncclCommDestroy(comms[i]);
  }
  return 0;
}
