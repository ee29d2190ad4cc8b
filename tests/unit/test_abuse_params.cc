// Numeric environment parameters under careless or hostile values: overflow, INT64_MAX,
// negative numbers, text, trailing junk. Every value ends in the parameter's range with a
// warning that names the variable and the value used, and no deadline derived from a
// parameter wraps around.
#include <cstdint>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "base/debug.h"
#include "base/param.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/root.h"
#include "bootstrap/socket.h"
#include "common/test_util.h"

using mktest::ScopedEnv;

namespace {

constexpr const char* kBootVar = "MKERNEL_BOOTSTRAP_TIMEOUT_S";
constexpr int64_t kBootMaxS = 1000000;  // the range declared in params.def

bool warned(const std::string& what) {
  return std::string(mk::lastError()).find(what) != std::string::npos;
}

}  // namespace

TEST(AbuseParams, BootstrapTimeoutTooLargeIsClampedWithWarning) {
  for (const char* v : {"9223372036854775", "9223372036854775807", "99999999999999999999999"}) {
    mk::setLastError("");
    ScopedEnv e(kBootVar, v);
    int64_t ms = mk::bootstrapTimeoutMs();
    EXPECT_EQ(ms, kBootMaxS * 1000) << v;
    EXPECT_EQ(MK_PARAM_INT(BootstrapTimeoutS), kBootMaxS) << v;
    EXPECT_TRUE(warned(kBootVar) && warned(std::to_string(kBootMaxS)) && warned(v))
        << v << ": " << mk::lastError();
  }
}

TEST(AbuseParams, NegativeAndZeroAreClampedToTheMinimum) {
  for (const char* v : {"-5", "0", "-9223372036854775808", "-99999999999999999999"}) {
    mk::setLastError("");
    ScopedEnv e(kBootVar, v);
    EXPECT_EQ(MK_PARAM_INT(BootstrapTimeoutS), 1) << v;
    EXPECT_EQ(mk::bootstrapTimeoutMs(), 1000) << v;
    EXPECT_TRUE(warned(kBootVar) && warned(v)) << v << ": " << mk::lastError();
  }
}

TEST(AbuseParams, GarbageAndTrailingJunkFallBackToTheDefault) {
  for (const char* v : {"abc", "", " ", "10s", "12abc", "1e3", "0x", "--3", "3 4", "7.5"}) {
    mk::setLastError("");
    ScopedEnv e(kBootVar, v);
    EXPECT_EQ(MK_PARAM_INT(BootstrapTimeoutS), 120) << "'" << v << "'";
    EXPECT_TRUE(warned(kBootVar) && warned("120")) << "'" << v << "': " << mk::lastError();
  }
  // Accepted forms stay accepted, silently.
  for (auto [v, want] : std::vector<std::pair<const char*, int64_t>>{
           {"7", 7}, {"+7", 7}, {" 7 ", 7}, {"010", 10}, {"0x10", 16}, {"1000000", kBootMaxS}}) {
    mk::setLastError("");
    ScopedEnv e(kBootVar, v);
    EXPECT_EQ(MK_PARAM_INT(BootstrapTimeoutS), want) << v;
    EXPECT_FALSE(warned(kBootVar)) << v << ": " << mk::lastError();
  }
}

// With the largest timeouts a rendezvous still works: nothing times out at once (a deadline
// that wrapped negative) and nothing waits forever (checked with an abort flag as the bound).
TEST(AbuseParams, RendezvousWorksWithHugeTimeouts) {
  for (const char* v : {"9223372036854775", "9223372036854775807"}) {
    ScopedEnv e(kBootVar, v);
    ncclUniqueId id;
    ASSERT_EQ(mk::bootstrapGetUniqueId(&id), ncclSuccess);
    uint32_t flag = 0;
    std::atomic<bool> done{false};
    std::thread guard([&] {
      for (int i = 0; i < 1000 && !done; i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      __atomic_store_n(&flag, 1, __ATOMIC_RELEASE);  // 10 s: the old code hung here
    });
    std::vector<ncclResult_t> res(2, ncclInternalError);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; r++)
      ranks.emplace_back([&, r] {
        mk::Bootstrap* b = nullptr;
        res[r] = mk::bootstrapInit(&id, 1, r, 2, &flag, &b);
        if (res[r] == ncclSuccess) {
          int x[2] = {-1, -1};
          x[r] = r;
          res[r] = mk::bootstrapAllGather(b, x, sizeof(int));
          if (res[r] == ncclSuccess && (x[0] != 0 || x[1] != 1)) res[r] = ncclInternalError;
          mk::bootstrapClose(b);
        }
      });
    for (auto& t : ranks) t.join();
    done = true;
    guard.join();
    EXPECT_EQ(res[0], ncclSuccess) << v;
    EXPECT_EQ(res[1], ncclSuccess) << v;
    EXPECT_EQ(mk::bootstrapRootsWait(5000), 0);
  }
}

// A connect whose bound is INT64_MAX ms, to a port nobody listens on (refusals are retried until
// the deadline): the deadline saturates instead of wrapping into the past, so the connect keeps
// retrying (here until the abort) rather than timing out at once.
TEST(AbuseParams, SocketDeadlineSaturates) {
  mk::Socket probe;
  mk::socketInit(&probe, nullptr, 2000);
  mk::SocketAddress any;
  ASSERT_EQ(mk::socketAddressFromString("127.0.0.1:0", &any), ncclSuccess);
  ASSERT_EQ(mk::socketListen(&probe, &any), ncclSuccess);
  mk::SocketAddress closed = probe.addr;
  mk::socketClose(&probe);
  for (int64_t bound : {INT64_MAX, INT64_MAX / 2, (int64_t)9223372036854775000ll}) {
    uint32_t flag = 0;
    mk::Socket c;
    mk::socketInit(&c, &flag, bound);
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      __atomic_store_n(&flag, 1, __ATOMIC_RELEASE);
    });
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(mk::socketConnect(&c, &closed, /*retryRefused=*/true), ncclInternalError)
        << bound << ": timed out at once instead of retrying until the abort";
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    aborter.join();
    EXPECT_GE(s, 0.25) << bound;
    EXPECT_LT(s, 2.0) << bound;
    mk::socketClose(&c);
  }
}

// Every INT parameter of params.def: a range that holds its default, and the same treatment
// of overflow, bounds, bounds +- 1, text and trailing junk.
TEST(AbuseParams, EveryIntParameterIsClampedToItsRange) {
  int checked = 0;
  for (int i = 0; i < static_cast<int>(mk::ParamId::kCount); i++) {
    const auto id = static_cast<mk::ParamId>(i);
    const mk::ParamInfo& p = mk::paramInfo(id);
    if (std::string(p.type) != "INT") continue;
    checked++;
    const int64_t def = strtoll(p.defaultValue, nullptr, 10);
    EXPECT_LT(p.min, p.max) << p.env;
    EXPECT_TRUE(p.min <= def && def <= p.max) << p.env << " default " << def;
    // Milliseconds or bytes of any value stay far from overflow in the code that uses them.
    EXPECT_LE(p.max, int64_t(1) << 40) << p.env;
    EXPECT_GE(p.min, -(int64_t(1) << 40)) << p.env;
    struct Case {
      std::string value;
      int64_t want;
      bool warn;
    } cases[] = {
        {"99999999999999999999", p.max, true},
        {"9223372036854775807", p.max, true},
        {"-99999999999999999999", p.min, true},
        {"-9223372036854775808", p.min, true},
        {std::to_string(p.max), p.max, false},
        {std::to_string(p.min), p.min, false},
        {std::to_string(p.max + 1), p.max, true},
        {std::to_string(p.min - 1), p.min, true},
        {"not a number", def, true},
        {std::to_string(p.max) + "junk", def, true},
    };
    for (const Case& c : cases) {
      mk::setLastError("");
      ScopedEnv e(p.env, c.value.c_str());
      EXPECT_EQ(mk::paramInt(id), c.want) << p.env << "=" << c.value;
      EXPECT_EQ(std::string(mk::paramStr(id)), std::to_string(c.want)) << p.env << "=" << c.value;
      EXPECT_EQ(warned(p.env), c.warn) << p.env << "=" << c.value << ": " << mk::lastError();
      if (c.warn)
        EXPECT_TRUE(warned(c.value) && warned(std::to_string(c.want)))
            << p.env << "=" << c.value << ": " << mk::lastError();
    }
  }
  EXPECT_GE(checked, 10);
}

TEST(AbuseParams, SaturatingArithmetic) {
  EXPECT_EQ(mk::saturatingAdd(INT64_MAX - 5, 10), INT64_MAX);
  EXPECT_EQ(mk::saturatingAdd(INT64_MIN + 5, -10), INT64_MIN);
  EXPECT_EQ(mk::saturatingAdd(1000, INT64_MAX), INT64_MAX);
  EXPECT_EQ(mk::saturatingAdd(-3, 5), 2);
  EXPECT_EQ(mk::saturatingMul(9223372036854775, 1000), 9223372036854775000);
  EXPECT_EQ(mk::saturatingMul(9223372036854776, 1000), INT64_MAX);
  EXPECT_EQ(mk::saturatingMul(INT64_MAX, 1000), INT64_MAX);
  EXPECT_EQ(mk::saturatingMul(INT64_MIN, 2), INT64_MIN);
  EXPECT_EQ(mk::saturatingMul(-INT64_MAX, 2), INT64_MIN);
  EXPECT_EQ(mk::saturatingMul(INT64_MIN, -1), INT64_MAX);
  EXPECT_EQ(mk::saturatingMul(-7, 6), -42);
}
