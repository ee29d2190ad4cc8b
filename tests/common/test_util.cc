#include "common/test_util.h"

#include "base/param.h"

#include <cstdint>
#include <string>
#include <vector>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <dirent.h>
#include <mutex>
#include <csignal>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

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

cudaError_t syncMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  cudaError_t e = cudaMemcpy(dst, src, bytes, kind);
  return e != cudaSuccess ? e : cudaStreamSynchronize(cudaStreamLegacy);
}

cudaError_t syncMemset(void* dst, int value, size_t bytes) {
  cudaError_t e = cudaMemset(dst, value, bytes);
  return e != cudaSuccess ? e : cudaStreamSynchronize(cudaStreamLegacy);
}

std::string selfDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, (size_t)n);
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

pid_t spawnSelf(const std::string& gtestFilter, const std::vector<std::string>& extraEnv) {
  std::vector<std::string> env;
  for (char** e = environ; *e; e++) env.push_back(*e);
  for (const auto& e : extraEnv) env.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(&e[0]);
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", filter = "--gtest_filter=" + gtestFilter;
  char* argv[] = {&exe[0], &filter[0], nullptr};
  pid_t pid = fork();
  if (pid == 0) {
    execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  return pid;
}

std::string waitChildren(const std::vector<pid_t>& pids, int timeoutS) {
  std::string err;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutS);
  for (size_t i = 0; i < pids.size(); i++) {
    int status = 0;
    for (;;) {
      pid_t r = waitpid(pids[i], &status, WNOHANG);
      if (r == pids[i]) break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pids[i], SIGKILL);
        waitpid(pids[i], &status, 0);
        err += "child " + std::to_string(i) + " timed out; ";
        break;
      }
      usleep(10000);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      err += "child " + std::to_string(i) + " failed (status " + std::to_string(status) +
             ", its output above says why); ";
  }
  return err;
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
