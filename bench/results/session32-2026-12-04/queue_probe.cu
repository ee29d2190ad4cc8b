// Which of a process's streams share a hardware queue with its first one: a kernel on stream 0
// waits (bounded, ~50 ms) for a flag that a kernel on stream i sets. If the setter runs, stream i
// has a queue of its own; if the waiter times out, the setter sat behind it in stream 0's queue.
// Session 32, to learn how many queues a process gets with and without CUDA MPS (the ranks of
// one process on one GPU need one each, README "Logging and errors").
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void waiter(volatile int* flag, int* seen, long long cycles) {
  const long long t0 = clock64();
  while (*flag == 0 && clock64() - t0 < cycles) {
  }
  *seen = *flag;
}

__global__ void setter(volatile int* flag) { *flag = 1; }

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 16;
  int *flag = nullptr, *seen = nullptr, clk = 0;
  cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);  // kHz
  if (cudaMalloc(&flag, 4) != cudaSuccess || cudaMalloc(&seen, 4) != cudaSuccess) return 1;
  cudaStream_t* s = new cudaStream_t[n];
  for (int i = 0; i < n; ++i) cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking);
  printf("CUDA_DEVICE_MAX_CONNECTIONS=%s streams sharing stream 0's queue:",
         getenv("CUDA_DEVICE_MAX_CONNECTIONS") ? getenv("CUDA_DEVICE_MAX_CONNECTIONS") : "unset");
  int shared = 0;
  for (int i = 1; i < n; ++i) {
    cudaMemset(flag, 0, 4);
    cudaMemset(seen, 0, 4);
    cudaDeviceSynchronize();
    waiter<<<1, 1, 0, s[0]>>>(flag, seen, 50LL * clk);  // ~50 ms
    setter<<<1, 1, 0, s[i]>>>(flag);
    if (cudaDeviceSynchronize() != cudaSuccess) return 2;
    int v = 0;
    cudaMemcpy(&v, seen, 4, cudaMemcpyDeviceToHost);
    if (v == 0) {
      printf(" %d", i);
      ++shared;
    }
  }
  printf(" (%d of %d)\n", shared, n - 1);
  return 0;
}
