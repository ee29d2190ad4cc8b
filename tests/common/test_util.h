// Helpers shared by the test binaries.
#pragma once
#include <cstdint>
#include <string>

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
