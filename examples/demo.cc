// The main job: runs a few ranks on the available GPUs through the NCCL API that
// libmkernel exports, and prints what it did and measured. Without a GPU it says so.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <nccl.h>
#include <vector>

#include "demo_util.h"

// One thread drives every rank through ncclGroupStart/End (the nccl-tests pattern): a
// float AllReduce checked element by element against the host sum, then timed.
static void allReduceDemo(std::vector<ncclComm_t>& comms, const std::vector<int>& devs) {
  const int n = (int)comms.size();
  for (size_t count : {(size_t)1 << 10, (size_t)1 << 24}) {
    std::vector<float*> buf(n);
    std::vector<cudaStream_t> st(n);
    std::vector<std::vector<float>> in(n, std::vector<float>(count));
    for (int r = 0; r < n; r++) {
      for (size_t i = 0; i < count; i++) in[r][i] = (float)((i * 7 + r * 13) % 17) - 8.0f;
      DEMO_CUDA(cudaSetDevice(devs[r]));
      DEMO_CUDA(cudaMalloc(&buf[r], count * sizeof(float)));
      DEMO_CUDA(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
      DEMO_CUDA(cudaMemcpy(buf[r], in[r].data(), count * sizeof(float), cudaMemcpyHostToDevice));
    }
    auto issue = [&] {
      DEMO_NCCL(ncclGroupStart());
      for (int r = 0; r < n; r++)
        DEMO_NCCL(ncclAllReduce(buf[r], buf[r], count, ncclFloat, ncclSum, comms[r], st[r]));
      DEMO_NCCL(ncclGroupEnd());
      for (int r = 0; r < n; r++) DEMO_CUDA(cudaStreamSynchronize(st[r]));
    };
    issue();
    size_t wrong = 0;
    std::vector<float> out(count);
    for (int r = 0; r < n; r++) {
      DEMO_CUDA(cudaMemcpy(out.data(), buf[r], count * sizeof(float), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < count; i++) {
        float ref = 0;
        for (int q = 0; q < n; q++) ref += in[q][i];  // small integers: exact in float
        wrong += out[i] != ref;
      }
    }
    const int iters = 20;
    auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < iters; it++) issue();  // values grow; only time is read here
    double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        iters;
    double bytes = (double)count * sizeof(float);
    printf("  AllReduce %10zu B x %d ranks: %s, %.1f us, busbw %.1f GB/s\n", (size_t)bytes, n,
           wrong ? "WRONG" : "correct", us, bytes * 2.0 * (n - 1) / n / us / 1e3);
    if (wrong) exit(1);
    for (int r = 0; r < n; r++) {
      cudaFree(buf[r]);
      cudaStreamDestroy(st[r]);
    }
  }
}

int main(int argc, char** argv) {
  int version = 0;
  ncclGetVersion(&version);
  printf("mkernel demo: NCCL API version %d\n", version);
  int ndev = 0;
  cudaError_t err = cudaGetDeviceCount(&ndev);
  if (err != cudaSuccess || ndev == 0) {
    printf(
        "mkernel demo: no GPU on this machine (%s); nothing to run. The library, its CPU "
        "tests and the bootstrap work here; run the demo on a machine with a GPU.\n",
        err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 0;
  }
  int nranks = argc > 1 ? atoi(argv[1]) : 4;
  std::vector<int> devs(nranks);
  for (int i = 0; i < nranks; i++) devs[i] = i % ndev;
  printf("mkernel demo: %d ranks on %d GPU(s)\n", nranks, ndev);
  std::vector<ncclComm_t> comms(nranks);
  auto t0 = std::chrono::steady_clock::now();
  DEMO_NCCL(ncclCommInitAll(comms.data(), nranks, devs.data()));
  auto t1 = std::chrono::steady_clock::now();
  printf("  ncclCommInitAll: %.1f ms\n",
         std::chrono::duration<double, std::milli>(t1 - t0).count());
  for (int i = 0; i < nranks; i++) {
    int rank, count, dev;
    DEMO_NCCL(ncclCommUserRank(comms[i], &rank));
    DEMO_NCCL(ncclCommCount(comms[i], &count));
    DEMO_NCCL(ncclCommCuDevice(comms[i], &dev));
    printf("  rank %d/%d on device %d\n", rank, count, dev);
  }
  allReduceDemo(comms, devs);
  fusedDemo(comms, devs);
  for (auto c : comms) DEMO_NCCL(ncclCommDestroy(c));
  printf("mkernel demo: done\n");
  return 0;
}
