// The main job: runs a few ranks on the available GPUs through the NCCL API that
// libmkernel exports, and prints what it did and measured. Without a GPU it says so.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <nccl.h>
#include <vector>

#define CHECK_NCCL(cmd)                                                           \
  do {                                                                            \
    ncclResult_t r_ = (cmd);                                                      \
    if (r_ != ncclSuccess) {                                                      \
      fprintf(stderr, "demo: %s failed: %s (%s)\n", #cmd, ncclGetErrorString(r_), \
              ncclGetLastError(nullptr));                                         \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

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
  CHECK_NCCL(ncclCommInitAll(comms.data(), nranks, devs.data()));
  auto t1 = std::chrono::steady_clock::now();
  printf("  ncclCommInitAll: %.1f ms\n",
         std::chrono::duration<double, std::milli>(t1 - t0).count());
  for (int i = 0; i < nranks; i++) {
    int rank, count, dev;
    CHECK_NCCL(ncclCommUserRank(comms[i], &rank));
    CHECK_NCCL(ncclCommCount(comms[i], &count));
    CHECK_NCCL(ncclCommCuDevice(comms[i], &dev));
    printf("  rank %d/%d on device %d\n", rank, count, dev);
  }
  for (auto c : comms) CHECK_NCCL(ncclCommDestroy(c));
  printf("mkernel demo: done\n");
  return 0;
}
