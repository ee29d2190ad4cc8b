// How many of a process's streams can hold waiting kernels at once, each on a hardware queue of
// its own (the ranks of one process on one GPU need that, README "Logging and errors").
// Mode "pair" (call D of session 32): a kernel on stream 0 waits (bounded, ~50 ms) for a flag
// that a kernel on stream i sets; stream 0 is idle again before the next i. Mode "many" (written
// after call D, run in session 33: 16 of 16 side by side with and without MPS): waiters on streams
// 0..k-2 at once, the setter on stream k-1; the largest k whose waiters all saw the flag is how
// many streams with pending work ran side by side. Every wait ends after ~50 ms, so a shared queue
// costs a timeout, never a hang.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void waiter(volatile int* flag, int* seen, long long cycles) {
  const long long t0 = clock64();
  while (*flag == 0 && clock64() - t0 < cycles) {
  }
  *seen = *flag;
}

__global__ void setter(volatile int* flag) {
  *flag = 1;
}

__global__ void waiterMany(volatile int* flag, int* seen, int i, long long cycles) {
  const long long t0 = clock64();
  while (*flag == 0 && clock64() - t0 < cycles) {
  }
  seen[i] = *flag;
}

// Waiters on streams 0..k-2, the setter on stream k-1: whether every waiter saw the flag.
bool manyFit(cudaStream_t* s, int k, int* flag, int* seen, int clk) {
  cudaMemset(flag, 0, 4);
  cudaMemset(seen, 0, 4 * k);
  cudaDeviceSynchronize();
  for (int i = 0; i + 1 < k; ++i) waiterMany<<<1, 1, 0, s[i]>>>(flag, seen, i, 50LL * clk);
  setter<<<1, 1, 0, s[k - 1]>>>(flag);
  if (cudaDeviceSynchronize() != cudaSuccess) return false;
  int v[64] = {};
  cudaMemcpy(v, seen, 4 * (k - 1), cudaMemcpyDeviceToHost);
  for (int i = 0; i + 1 < k; ++i)
    if (v[i] == 0) return false;
  return true;
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 16;
  const bool many = argc > 2 && argv[2][0] == 'm';
  if (n < 2 || n > 64) return 1;
  int *flag = nullptr, *seen = nullptr, clk = 0;
  cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);  // kHz
  if (cudaMalloc(&flag, 4) != cudaSuccess || cudaMalloc(&seen, 4 * 64) != cudaSuccess) return 1;
  cudaStream_t* s = new cudaStream_t[n];
  for (int i = 0; i < n; ++i) cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking);
  // Warm-up: the first launches load the kernels (a lazy load may wait for the device, which
  // made stream 1 look shared in call D's pair mode).
  waiter<<<1, 1, 0, s[0]>>>(flag, seen, 1);
  setter<<<1, 1, 0, s[0]>>>(flag);
  waiterMany<<<1, 1, 0, s[0]>>>(flag, seen, 0, 1);
  cudaDeviceSynchronize();
  if (many) {
    const char* env = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    int fit = 1;
    for (int k = 2; k <= n; ++k) {
      if (!manyFit(s, k, flag, seen, clk)) break;
      fit = k;
    }
    printf("CUDA_DEVICE_MAX_CONNECTIONS=%s streams with pending kernels side by side: %d%s\n",
           env ? env : "unset", fit, fit == n ? " (all tried)" : "");
    return 0;
  }
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
