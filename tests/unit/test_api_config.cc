// ncclConfig_t parsing (NCCL 2.28.9's parseCommConfig): any size and version are read, fields
// the caller's version lacked are defaults, a newer struct's extra bytes are ignored; only a
// bad magic and out-of-range values are refused (ncclInvalidArgument + message).
#include <climits>
#include <cstddef>
#include <cstring>
#include <gtest/gtest.h>
#include <nccl.h>
#include <string>

#include "base/debug.h"
#include "comm/config.h"

namespace {

ncclConfig_t initialized() {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  return c;
}

ncclResult_t parse(const ncclConfig_t& c, mk::Config* out) {
  mk::setLastError("");
  return mk::configParse(&c, out);
}

void expectRefused(const ncclConfig_t& c, const char* needle) {
  mk::Config out;
  EXPECT_EQ(parse(c, &out), ncclInvalidArgument) << needle;
  std::string msg = mk::lastError();
  EXPECT_NE(msg.find(needle), std::string::npos) << msg;
}

}  // namespace

// A program built with a newer nccl.h passes a larger struct of a newer version.
TEST(ApiConfig, NewerHeaderIsAccepted) {
  struct Newer {
    ncclConfig_t base;
    int laterFields[8];  // fields a later NCCL added: ignored
  } n;
  memset(&n, 0x7f, sizeof(n));
  n.base = initialized();
  n.base.size = sizeof(Newer);
  n.base.version = NCCL_VERSION(2, 30, 7);
  n.base.blocking = 0;
  n.base.nvlsCTAs = 16;
  mk::Config out;
  ASSERT_EQ(parse(n.base, &out), ncclSuccess) << mk::lastError();
  EXPECT_FALSE(out.blocking);
  EXPECT_EQ(out.nvlsCTAs, 16);
}

// Fields newer than the caller's version hold whatever its bytes say: they are defaults.
TEST(ApiConfig, OlderVersionsGetDefaultsForFieldsTheyLack) {
  mk::Config out;
  ncclConfig_t c = initialized();
  c.version = 1;  // before NCCL 2.14: every field is a default
  c.blocking = 7;
  c.minCTAs = -3;
  c.CTAPolicy = 99;
  c.nChannelsPerNetPeer = 1000;
  ASSERT_EQ(parse(c, &out), ncclSuccess) << mk::lastError();
  EXPECT_TRUE(out.blocking);
  EXPECT_EQ(out.minCTAs, 0);
  EXPECT_EQ(out.ctaPolicy, 0);
  EXPECT_EQ(out.nChannelsPerNetPeer, 0);

  c = initialized();
  c.version = NCCL_VERSION(2, 26, 0);  // has blocking and the CTA bounds, not collnetEnable
  c.blocking = 0;
  c.maxCTAs = 4;
  c.collnetEnable = 5;
  c.nvlsCTAs = -1;
  ASSERT_EQ(parse(c, &out), ncclSuccess) << mk::lastError();
  EXPECT_FALSE(out.blocking);
  EXPECT_EQ(out.maxCTAs, 4);
  EXPECT_FALSE(out.collnetEnable);
  EXPECT_EQ(out.nvlsCTAs, 0);
  c.version = NCCL_VERSION(2, 27, 0);  // now collnetEnable is read, and checked
  expectRefused(c, "collnetEnable");
}

// A shorter struct: the bytes past its size are not read.
TEST(ApiConfig, ShorterStructIsReadUpToItsSize) {
  mk::Config out;
  ncclConfig_t c = initialized();
  c.size = offsetof(ncclConfig_t, minCTAs);
  c.blocking = 0;
  c.minCTAs = -3;  // past the size: ignored
  ASSERT_EQ(parse(c, &out), ncclSuccess) << mk::lastError();
  EXPECT_FALSE(out.blocking);
  EXPECT_EQ(out.minCTAs, 0);
  // Too short to hold the magic: refused like a bad magic, as NCCL.
  c = initialized();
  c.size = offsetof(ncclConfig_t, magic);
  expectRefused(c, "magic");
  c = initialized();
  c.magic = 0xcafe;
  expectRefused(c, "magic");
}

TEST(ApiConfig, RangeChecksOfNccl) {
  struct Bad {
    const char* field;
    void (*set)(ncclConfig_t&);
  } cases[] = {
      {"blocking", [](ncclConfig_t& c) { c.blocking = 2; }},
      {"cgaClusterSize", [](ncclConfig_t& c) { c.cgaClusterSize = -1; }},
      {"minCTAs", [](ncclConfig_t& c) { c.minCTAs = 0; }},
      {"maxCTAs", [](ncclConfig_t& c) { c.maxCTAs = -4; }},
      {"splitShare", [](ncclConfig_t& c) { c.splitShare = 2; }},
      {"splitShare", [](ncclConfig_t& c) { c.splitShare = -1; }},
      {"collnetEnable", [](ncclConfig_t& c) { c.collnetEnable = 2; }},
      {"CTAPolicy", [](ncclConfig_t& c) { c.CTAPolicy = 3; }},
      {"shrinkShare", [](ncclConfig_t& c) { c.shrinkShare = 5; }},
      {"nvlsCTAs", [](ncclConfig_t& c) { c.nvlsCTAs = 0; }},
      {"nvlsCTAs", [](ncclConfig_t& c) { c.nvlsCTAs = -2; }},
      {"nChannelsPerNetPeer", [](ncclConfig_t& c) { c.nChannelsPerNetPeer = 0; }},
      {"nChannelsPerNetPeer", [](ncclConfig_t& c) { c.nChannelsPerNetPeer = 65; }},
      {"nvlinkCentricSched", [](ncclConfig_t& c) { c.nvlinkCentricSched = 2; }},
  };
  for (const Bad& b : cases) {
    ncclConfig_t c = initialized();
    b.set(c);
    expectRefused(c, b.field);
  }
  // The bounds themselves, and NCCL_CONFIG_UNDEF_INT everywhere (the initializer), pass.
  mk::Config out;
  ncclConfig_t c = initialized();
  ASSERT_EQ(parse(c, &out), ncclSuccess);
  c.splitShare = 1;
  c.shrinkShare = 0;
  c.collnetEnable = 1;
  c.nvlinkCentricSched = 1;
  c.nvlsCTAs = 1;
  c.nChannelsPerNetPeer = 64;
  ASSERT_EQ(parse(c, &out), ncclSuccess) << mk::lastError();
  EXPECT_TRUE(out.splitShare);
  EXPECT_TRUE(out.collnetEnable);
  EXPECT_EQ(out.nvlinkCentricSched, 1);
  EXPECT_EQ(out.nChannelsPerNetPeer, 64);
  c.nChannelsPerNetPeer = 1;
  EXPECT_EQ(parse(c, &out), ncclSuccess);
}

// NCCL takes any cgaClusterSize >= 0; more than the hardware launches is clamped, with an
// advisory warning that is no error of the call.
TEST(ApiConfig, LargeCgaClusterSizeIsClamped) {
  mk::Config out;
  ncclConfig_t c = initialized();
  c.cgaClusterSize = 16;
  ASSERT_EQ(parse(c, &out), ncclSuccess);
  EXPECT_EQ(out.cgaClusterSize, 8);
  EXPECT_STREQ(mk::lastError(), "");
  c.cgaClusterSize = 8;
  ASSERT_EQ(parse(c, &out), ncclSuccess);
  EXPECT_EQ(out.cgaClusterSize, 8);
  c.cgaClusterSize = 0;
  ASSERT_EQ(parse(c, &out), ncclSuccess);
  EXPECT_EQ(out.cgaClusterSize, 0);
}
