// Running N copies of the test binary as child processes (real processes, fresh address spaces:
// fork + exec, so no thread or lock state of the parent leaks into them).
//
// A child runs exactly one gtest, normally a DISABLED_ one that only does something when
// mpIsChild(); it reads its rank and inputs from the environment. The parent waits for all of
// them with a bound and kills stragglers.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mktest {

struct MpResult {
  bool exited = false;  // normal exit, code valid
  int code = -1;
  bool signaled = false;  // killed by `signal`
  int signal = 0;
  bool timedOut = false;  // still running at the deadline: we killed it with SIGKILL
  double seconds = 0;     // from spawn to exit
  std::string output;     // the child's stdout+stderr (tail), kept when it did not exit 0
};

// Starts n children running `gtestName` ("Suite.DISABLED_Name"), child r with MKTEST_MP_RANK=r,
// MKTEST_MP_NRANKS=n and the extra "NAME=value" entries of env. GTEST_* variables of the
// parent (filters, output files, sharding) are not passed on. The children's output goes to
// temporary files, shown by mpDescribe for children that failed.
std::vector<pid_t> mpSpawn(const std::string& gtestName, int n,
                           const std::vector<std::string>& env);
// Waits until every child exited or timeoutMs passed; stragglers get SIGKILL and are reaped.
std::vector<MpResult> mpWait(const std::vector<pid_t>& pids, int64_t timeoutMs);
// Human-readable "rank r: exit 0 after 0.3 s" lines (plus the output of failed children),
// for assertion messages.
std::string mpDescribe(const std::vector<MpResult>& results);

bool mpIsChild();
int mpRank();
int mpNRanks();
// Value of an environment variable passed by the parent ("" if unset).
std::string mpEnv(const char* name);

std::string hexEncode(const void* data, size_t n);
bool hexDecode(const std::string& hex, void* out, size_t n);

}  // namespace mktest
