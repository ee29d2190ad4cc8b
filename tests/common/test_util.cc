#include "common/test_util.h"

#include "core/param.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <dirent.h>
#include <mutex>
#include <unistd.h>

namespace mktest {

bool haveGpu(std::string* why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    cudaGetLastError();
    return false;
  }
  if (n == 0) {
    if (why) *why = "cudaGetDeviceCount returned 0";
    return false;
  }
  return true;
}

int gpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

static int countDir(const char* path) {
  DIR* d = opendir(path);
  if (!d) return -1;
  int n = 0;
  while (struct dirent* e = readdir(d))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

int countOpenFds() {
  return countDir("/proc/self/fd") - 1;
}  // minus the opendir fd
int countThreads() {
  return countDir("/proc/self/task");
}

uint64_t testSeed() {
  static uint64_t seed = 0;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = getenv("MKTEST_SEED");
    seed = env ? strtoull(env, nullptr, 0)
               : (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count() ^
                     ((uint64_t)getpid() << 32);
    fprintf(stderr, "[mktest] random seed %llu (set MKTEST_SEED to repeat)\n",
            (unsigned long long)seed);
  });
  return seed;
}

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  const char* o = getenv(name);
  had_ = o != nullptr;
  if (had_) old_ = o;
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
  mk::paramReset();
}

ScopedEnv::~ScopedEnv() {
  if (had_)
    setenv(name_.c_str(), old_.c_str(), 1);
  else
    unsetenv(name_.c_str());
  mk::paramReset();
}

}  // namespace mktest
