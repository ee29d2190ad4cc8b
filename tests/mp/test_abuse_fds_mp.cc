// A bootstrap root in a process that ran out of file descriptors: a child with a low
// RLIMIT_NOFILE (soft and hard, so nothing can raise it again) makes an id, uses up every fd
// while a rank connects to its root, then frees them and joins as rank 0. The root must neither
// flood the log (accept() fails with EMFILE as long as the connection waits) nor spin, and the
// rendezvous must complete once fds are back.
#include <cstdint>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/checks.h"
#include "base/debug.h"
#include "bootstrap/bootstrap.h"
#include "mp/mp_util.h"

using namespace mk;
using namespace mktest;

namespace {

constexpr int kExhaustedMs = 3000;

// One rank's life: init, allgather, check, close.
ncclResult_t rankRun(const ncclUniqueId& id, int r, int n) {
  Bootstrap* b = nullptr;
  NCCLCHECK(bootstrapInit(&id, 1, r, n, nullptr, &b));
  std::vector<int> v(n, -1);
  v[r] = 40 + r;
  ncclResult_t res = bootstrapAllGather(b, v.data(), sizeof(int));
  for (int i = 0; i < n && res == ncclSuccess; i++)
    if (v[i] != 40 + i) res = ncclInternalError;
  ncclResult_t c = bootstrapClose(b);
  return res != ncclSuccess ? res : c;
}

}  // namespace

TEST(AbuseFdsChild, DISABLED_Root) {
  if (!mpIsChild()) GTEST_SKIP() << "only runs as a child of the mp tests";
  const std::string dir = mpEnv("MKTEST_ABUSE_DIR");
  rlimit rl{128, 128};
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
  logLevel();  // opens NCCL_DEBUG_FILE now, while an fd is still to be had
  ncclUniqueId id;
  ASSERT_EQ(bootstrapGetUniqueId(&id), ncclSuccess);
  // The id is published only once every fd is taken (its file was opened before), so the
  // rank's connection always meets a root that cannot accept it: publishing first let a fast
  // machine (16 cores) accept the connection before the fds ran out, and nothing was logged.
  const int idFd = open((dir + "/id.tmp").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(idFd, 0);
  std::vector<int> held;
  for (int fd; (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) held.push_back(fd);
  ASSERT_EQ(errno, EMFILE);
  const std::string hex = hexEncode(&id, sizeof(id));
  ASSERT_EQ(write(idFd, hex.data(), hex.size()), (ssize_t)hex.size());
  ASSERT_EQ(rename((dir + "/id.tmp").c_str(), (dir + "/id").c_str()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(kExhaustedMs));
  for (int fd : held) close(fd);
  close(idFd);
  EXPECT_EQ(rankRun(id, 0, 2), ncclSuccess);
}

TEST(AbuseFds, RootOutOfFdsWarnsRarelyAndRecovers) {
  char tmpl[] = "/tmp/mk_abuse_fds_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, log = dir + "/log";
  auto pids = mpSpawn("AbuseFdsChild.DISABLED_Root", 1,
                      {"MKTEST_ABUSE_DIR=" + dir, "NCCL_DEBUG=WARN", "NCCL_DEBUG_FILE=" + log,
                       "MKERNEL_BOOTSTRAP_TIMEOUT_S=20"});
  ASSERT_EQ(pids.size(), 1u);
  ncclUniqueId id;
  bool haveId = false;
  for (int i = 0; i < 1000 && !haveId; i++) {
    std::ifstream f(dir + "/id");
    std::string hex;
    if (f >> hex) haveId = hexDecode(hex, &id, sizeof(id));
    if (!haveId) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ncclResult_t mine = ncclInternalError;
  if (haveId) mine = rankRun(id, 1, 2);  // waits in the root's accept queue meanwhile
  auto res = mpWait(pids, 30000);
  ASSERT_TRUE(haveId) << mpDescribe(res);
  EXPECT_EQ(mine, ncclSuccess);
  EXPECT_TRUE(res[0].exited && res[0].code == 0) << mpDescribe(res);

  // Every accept() failure is either printed or counted in a "suppressed" note.
  std::ifstream f(log);
  std::string line;
  int printed = 0;
  long suppressed = 0;
  std::string sample;
  while (std::getline(f, line)) {
    if (line.find("accept()") == std::string::npos) continue;
    printed++;
    if (sample.empty()) sample = line;
    size_t p = line.find("suppressed ");
    if (p != std::string::npos) suppressed += atol(line.c_str() + p + strlen("suppressed "));
  }
  printf("[fds] %d accept() warnings printed, %ld suppressed, in %d ms without fds\n", printed,
         suppressed, kExhaustedMs);
  if (!sample.empty()) printf("[fds] e.g. %s\n", sample.c_str());
  EXPECT_GE(printed, 1) << "the failure was not reported at all";
  EXPECT_LE(printed, kExhaustedMs / 1000 + 2);                    // rate-limited: one a second
  EXPECT_LE(printed + suppressed, 4 * kExhaustedMs / 1000 + 12);  // backed off: no spinning
  unlink(log.c_str());
  unlink((dir + "/id").c_str());
  rmdir(dir.c_str());
}
