#include "mp/mp_util.h"

#include <cstdint>
#include <string>
#include <vector>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace mktest {
namespace {

double nowSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct Spawned {
  pid_t pid;
  double start;
  std::string log;
};
std::vector<Spawned>& spawned() {
  static std::vector<Spawned> s;
  return s;
}

}  // namespace

std::vector<pid_t> mpSpawn(const std::string& gtestName, int n,
                           const std::vector<std::string>& env) {
  // Everything exec needs is built before fork: the child may only call async-signal-safe
  // functions until exec (other threads of the parent may hold malloc or logging locks).
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return {};
  self[len] = '\0';
  std::string filter = "--gtest_filter=" + gtestName;
  std::vector<std::string> base;
  for (char** e = environ; *e; e++) {
    if (strncmp(*e, "GTEST_", 6) == 0 || strncmp(*e, "MKTEST_MP_", 10) == 0) continue;
    base.push_back(*e);
  }
  for (const std::string& e : env) base.push_back(e);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; r++) {
    std::vector<std::string> envs = base;
    envs.push_back("MKTEST_MP_RANK=" + std::to_string(r));
    envs.push_back("MKTEST_MP_NRANKS=" + std::to_string(n));
    std::vector<char*> envp;
    for (auto& s : envs) envp.push_back(const_cast<char*>(s.c_str()));
    envp.push_back(nullptr);
    const char* argv[] = {self, filter.c_str(), "--gtest_also_run_disabled_tests",
                          "--gtest_brief=1", nullptr};
    char log[] = "/tmp/mk_mp_child_XXXXXX";
    int logFd = mkstemp(log);
    double t0 = nowSeconds();
    pid_t pid = fork();
    if (pid == 0) {
      if (logFd >= 0) {
        dup2(logFd, 1);
        dup2(logFd, 2);
      }
      execve(self, const_cast<char* const*>(argv), envp.data());
      _exit(127);
    }
    if (logFd >= 0) close(logFd);
    if (pid > 0) {
      pids.push_back(pid);
      spawned().push_back({pid, t0, logFd >= 0 ? log : ""});
    } else if (logFd >= 0) {
      unlink(log);
    }
  }
  return pids;
}

std::vector<MpResult> mpWait(const std::vector<pid_t>& pids, int64_t timeoutMs) {
  std::vector<MpResult> res(pids.size());
  std::vector<bool> done(pids.size(), false);
  double deadline = nowSeconds() + timeoutMs / 1000.0;
  auto startOf = [](pid_t pid) {
    for (auto& s : spawned())
      if (s.pid == pid) return s.start;
    return nowSeconds();
  };
  // Collects (when failed) and removes the child's log file.
  auto finish = [](pid_t pid, MpResult* r) {
    auto& all = spawned();
    for (size_t k = 0; k < all.size(); k++) {
      if (all[k].pid != pid) continue;
      if (!all[k].log.empty()) {
        if (!(r->exited && r->code == 0)) {
          FILE* f = fopen(all[k].log.c_str(), "r");
          if (f) {
            char buf[4096];
            size_t n;
            while ((n = fread(buf, 1, sizeof(buf), f)) > 0) r->output.append(buf, n);
            fclose(f);
            if (r->output.size() > 6000)
              r->output = "..." + r->output.substr(r->output.size() - 6000);
          }
        }
        unlink(all[k].log.c_str());
      }
      all.erase(all.begin() + k);
      return;
    }
  };
  size_t left = pids.size();
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); i++) {
      if (done[i]) continue;
      int st = 0;
      pid_t r = waitpid(pids[i], &st, WNOHANG);
      if (r == pids[i] || r < 0) {
        done[i] = true;
        left--;
        res[i].seconds = nowSeconds() - startOf(pids[i]);
        if (r == pids[i] && WIFEXITED(st)) {
          res[i].exited = true;
          res[i].code = WEXITSTATUS(st);
        } else if (r == pids[i] && WIFSIGNALED(st)) {
          res[i].signaled = true;
          res[i].signal = WTERMSIG(st);
        }
        finish(pids[i], &res[i]);
      }
    }
    if (left == 0) break;
    if (nowSeconds() >= deadline) {
      for (size_t i = 0; i < pids.size(); i++) {
        if (done[i]) continue;
        kill(pids[i], SIGKILL);
        int st = 0;
        waitpid(pids[i], &st, 0);
        res[i].timedOut = true;
        res[i].signaled = true;
        res[i].signal = SIGKILL;
        res[i].seconds = nowSeconds() - startOf(pids[i]);
        finish(pids[i], &res[i]);
      }
      break;
    }
    usleep(5000);
  }
  return res;
}

std::string mpDescribe(const std::vector<MpResult>& results) {
  std::string s;
  char line[160];
  for (size_t i = 0; i < results.size(); i++) {
    const MpResult& r = results[i];
    if (r.timedOut)
      snprintf(line, sizeof(line), "rank %zu: TIMED OUT, killed after %.1f s\n", i, r.seconds);
    else if (r.exited)
      snprintf(line, sizeof(line), "rank %zu: exit %d after %.2f s\n", i, r.code, r.seconds);
    else if (r.signaled)
      snprintf(line, sizeof(line), "rank %zu: signal %d after %.2f s\n", i, r.signal, r.seconds);
    else
      snprintf(line, sizeof(line), "rank %zu: unknown status\n", i);
    s += line;
    if (!r.output.empty()) s += "---- output of rank " + std::to_string(i) + " ----\n" + r.output;
  }
  return s;
}

bool mpIsChild() {
  return getenv("MKTEST_MP_RANK") != nullptr;
}
int mpRank() {
  return atoi(mpEnv("MKTEST_MP_RANK").c_str());
}
int mpNRanks() {
  return atoi(mpEnv("MKTEST_MP_NRANKS").c_str());
}
std::string mpEnv(const char* name) {
  const char* v = getenv(name);
  return v ? v : "";
}

std::string hexEncode(const void* data, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; i++) {
    s += d[p[i] >> 4];
    s += d[p[i] & 15];
  }
  return s;
}

bool hexDecode(const std::string& hex, void* out, size_t n) {
  if (hex.size() != 2 * n) return false;
  unsigned char* p = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < n; i++) {
    unsigned v = 0;
    if (sscanf(hex.c_str() + 2 * i, "%2x", &v) != 1) return false;
    p[i] = (unsigned char)v;
  }
  return true;
}

}  // namespace mktest
