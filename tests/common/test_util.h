// Helpers shared by the test binaries.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include <string>
#include <sys/types.h>
#include <vector>

namespace mktest {

// True when a CUDA device is usable; otherwise `why` says what is missing.
bool haveGpu(std::string* why);
// Number of CUDA devices (0 without a GPU).
int gpuCount();
// Open file descriptors and threads of this process (for leak checks).
int countOpenFds();
int countThreads();
// Seed for random inputs: fresh per run unless MKTEST_SEED is set; printed once.
uint64_t testSeed();

// cudaMemcpy / cudaMemset followed by a wait for the legacy default stream. cudaMemset, and
// cudaMemcpy from pageable host memory to the device, may return before the device has
// the data; the collectives run on non-blocking streams, which do not wait for the legacy
// stream, so a test must not launch them on data that may still be in flight.
cudaError_t syncMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t syncMemset(void* dst, int value, size_t bytes);
// Folder of this test binary (from /proc/self/exe).
std::string selfDir();
// Starts this test binary again (fresh CUDA state) running only `gtestFilter`, with this
// process's environment plus `extraEnv` ("NAME=value"). Returns the pid, or -1.
pid_t spawnSelf(const std::string& gtestFilter, const std::vector<std::string>& extraEnv);
// Waits for every child, killing those still running after timeoutS. Returns "" when all
// exited with status 0, else a description of the failures.
std::string waitChildren(const std::vector<pid_t>& pids, int timeoutS);

// Sets (or, with v == nullptr, unsets) an environment variable for the scope and re-reads
// mkernel's parameters, restoring both afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_;
};

}  // namespace mktest

// Skips a GPU test with a printed reason when no GPU is present.
#define MKTEST_REQUIRE_GPU()                                               \
  do {                                                                     \
    std::string mkWhy_;                                                    \
    if (!::mktest::haveGpu(&mkWhy_)) GTEST_SKIP() << "no GPU: " << mkWhy_; \
  } while (0)
