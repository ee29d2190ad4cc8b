// The rate limit for repeated warnings (base/debug.h): a call site hammered from several
// threads prints about one line per interval, and the lines account for every call.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <gtest/gtest.h>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include <atomic>
#include <chrono>

#include "base/debug.h"
#include "common/test_util.h"

namespace {

void hammer(std::atomic<long>* calls) {
  MK_WARN_RATELIMITED(400, "abuse-log flood warning %ld", calls->fetch_add(1));
}

}  // namespace

TEST(AbuseLog, RateLimitedWarningPrintsOncePerIntervalAndCountsTheRest) {
  char path[] = "/tmp/mk_abuse_log_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::atomic<long> calls{0};
  {
    mktest::ScopedEnv level("NCCL_DEBUG", "WARN");
    mktest::ScopedEnv file("NCCL_DEBUG_FILE", path);
    mk::logReset();
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> th;
    for (int t = 0; t < 4; t++)
      th.emplace_back([&] {
        while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1000)) {
          for (int i = 0; i < 50; i++) hammer(&calls);
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      });
    for (auto& t : th) t.join();
    std::this_thread::sleep_for(std::chrono::milliseconds(450));
    hammer(&calls);  // prints, with the count of everything suppressed since the last line
  }
  mk::logReset();  // back to the environment without the file
  std::ifstream in(path);
  std::string line;
  int printed = 0;
  long suppressed = 0;
  while (std::getline(in, line)) {
    if (line.find("abuse-log flood warning") == std::string::npos) continue;
    printed++;
    size_t p = line.find("(suppressed ");
    if (p != std::string::npos) suppressed += atol(line.c_str() + p + 12);
  }
  unlink(path);
  printf("[log] %ld calls in 1.45 s: %d lines printed, %ld suppressed\n", calls.load(), printed,
         suppressed);
  EXPECT_GT(calls.load(), 1000);
  EXPECT_GE(printed, 3);  // 0, 400, 800 ms and the last call
  EXPECT_LE(printed, 5);
  EXPECT_EQ(printed + suppressed, calls.load());
}
