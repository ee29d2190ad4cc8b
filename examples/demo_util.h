// Error checks of the demo: print the failed call and what the library said, then exit.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#define DEMO_NCCL(cmd)                                                            \
  do {                                                                            \
    ncclResult_t r_ = (cmd);                                                      \
    if (r_ != ncclSuccess) {                                                      \
      fprintf(stderr, "demo: %s failed: %s (%s)\n", #cmd, ncclGetErrorString(r_), \
              ncclGetLastError(nullptr));                                         \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

#define DEMO_CUDA(cmd)                                                        \
  do {                                                                        \
    cudaError_t e_ = (cmd);                                                   \
    if (e_ != cudaSuccess) {                                                  \
      fprintf(stderr, "demo: %s failed: %s\n", #cmd, cudaGetErrorString(e_)); \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

// The three fused GEMM + collective calls, fused against sequential (demo_fused.cc).
void fusedDemo(const std::vector<ncclComm_t>& comms, const std::vector<int>& devs);
