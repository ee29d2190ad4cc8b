// Unique id encoding (pure) and ncclGetUniqueId's two modes.
#include <cstdint>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "bootstrap/bootstrap.h"
#include "bootstrap/unique_id.h"
#include "common/test_util.h"
#include "base/debug.h"
#include "base/param.h"

using namespace mk;

namespace {

BootstrapId makeId(const char* addr, uint64_t secret, uint16_t flags = 0) {
  BootstrapId id;
  EXPECT_EQ(socketAddressFromString(addr, &id.root), ncclSuccess);
  id.secret = secret;
  id.flags = flags;
  return id;
}

// Re-seals an id after a deliberate edit, so that decode gets past the checksum.
void reseal(ncclUniqueId* u) {
  uint8_t* b = reinterpret_cast<uint8_t*>(u->internal);
  uint64_t sum = bootstrapHash(b, 120);
  for (int i = 0; i < 8; i++) b[120 + i] = (uint8_t)(sum >> (8 * i));
}

void expectRejected(const ncclUniqueId& u, const char* msgPart) {
  BootstrapId out;
  EXPECT_EQ(bootstrapIdDecode(&u, &out), ncclInvalidArgument);
  std::string err = lastError();
  EXPECT_NE(err.find(msgPart), std::string::npos) << err;
}

using mktest::ScopedEnv;

}  // namespace

TEST(BootstrapId, RoundTrip) {
  std::mt19937_64 rng(mktest::testSeed());
  for (const char* addr : {"10.2.3.4:5555", "[2001:db8::7]:1", "[fe80::3%lo]:65535"}) {
    BootstrapId in = makeId(addr, rng(), 0), out;
    ncclUniqueId u;
    bootstrapIdEncode(in, &u);
    ASSERT_EQ(bootstrapIdDecode(&u, &out), ncclSuccess);
    EXPECT_EQ(out.secret, in.secret);
    EXPECT_EQ(out.flags, 0);
    EXPECT_TRUE(socketAddressEqual(&out.root, &in.root)) << addr;
  }
  BootstrapId in = makeId("127.0.0.1:9", 7, kBootstrapIdFlagCommId), out;
  ncclUniqueId u;
  bootstrapIdEncode(in, &u);
  ASSERT_EQ(bootstrapIdDecode(&u, &out), ncclSuccess);
  EXPECT_EQ(out.flags, kBootstrapIdFlagCommId);
  static_assert(sizeof(ncclUniqueId) == 128, "NCCL 2.28 id size");
}

TEST(BootstrapId, Rejections) {
  ncclUniqueId good;
  bootstrapIdEncode(makeId("10.0.0.1:1234", 0x1122334455667788ull), &good);
  ncclUniqueId u;

  memset(&u, 0, sizeof(u));
  expectRejected(u, "bad magic");  // an all-zero id (e.g. never filled in)
  u = good;
  u.internal[0] ^= 1;
  expectRejected(u, "bad magic");
  u = good;
  u.internal[4] = 99;  // version
  expectRejected(u, "protocol version");
  u = good;
  u.internal[4] = 99;
  reseal(&u);
  expectRejected(u, "protocol version");
  u = good;
  u.internal[9] ^= 0x40;  // secret, checksum not updated
  expectRejected(u, "checksum");
  u = good;
  u.internal[127] ^= 1;
  expectRejected(u, "checksum");
  u = good;
  u.internal[6] = 0x80;  // unknown flag
  reseal(&u);
  expectRejected(u, "flags");
  u = good;
  u.internal[50] = 1;  // reserved
  reseal(&u);
  expectRejected(u, "reserved");
  u = good;
  u.internal[16] = 5;  // address family byte
  reseal(&u);
  expectRejected(u, "root address");
  BootstrapId out;
  EXPECT_EQ(bootstrapIdDecode(nullptr, &out), ncclInvalidArgument);
  EXPECT_EQ(bootstrapIdDecode(&good, &out), ncclSuccess);
}

TEST(BootstrapId, HashIsStableAndSensitive) {
  const char a[] = "abcdef";
  EXPECT_EQ(bootstrapHash(a, 6), bootstrapHash(a, 6));
  EXPECT_NE(bootstrapHash(a, 6), bootstrapHash(a, 5));
  EXPECT_NE(bootstrapHash(a, 6, 1), bootstrapHash(a, 6, 2));
  uint64_t r1 = 0, r2 = 0;
  ASSERT_EQ(bootstrapRandom(&r1, 8), ncclSuccess);
  ASSERT_EQ(bootstrapRandom(&r2, 8), ncclSuccess);
  EXPECT_NE(r1, r2);
}

TEST(BootstrapId, GetUniqueIdStartsARootPerId) {
  ScopedEnv noCommId("NCCL_COMM_ID", nullptr);
  ncclUniqueId u1, u2;
  ASSERT_EQ(bootstrapGetUniqueId(&u1), ncclSuccess);
  ASSERT_EQ(bootstrapGetUniqueId(&u2), ncclSuccess);
  BootstrapId d1, d2;
  ASSERT_EQ(bootstrapIdDecode(&u1, &d1), ncclSuccess);
  ASSERT_EQ(bootstrapIdDecode(&u2, &d2), ncclSuccess);
  EXPECT_NE(d1.secret, d2.secret);
  EXPECT_EQ(d1.flags, 0);
  EXPECT_NE(socketAddressPort(&d1.root), 0);
  EXPECT_FALSE(socketAddressEqual(&d1.root, &d2.root));
  // Use both roots (a single-rank communicator each) so that their threads end now.
  for (ncclUniqueId* u : {&u1, &u2}) {
    Bootstrap* b = nullptr;
    ASSERT_EQ(bootstrapInit(u, 1, 0, 1, nullptr, &b), ncclSuccess);
    EXPECT_EQ(bootstrapRank(b), 0);
    EXPECT_EQ(bootstrapNRanks(b), 1);
    EXPECT_EQ(bootstrapBarrier(b), ncclSuccess);
    EXPECT_EQ(bootstrapClose(b), ncclSuccess);
  }
  EXPECT_EQ(bootstrapRootsWait(5000), 0);
  EXPECT_EQ(bootstrapGetUniqueId(nullptr), ncclInvalidArgument);
}

TEST(BootstrapId, CommIdModeIsDeterministic) {
  {
    ScopedEnv e("NCCL_COMM_ID", "127.0.0.1:29517");
    ncclUniqueId u1, u2;
    ASSERT_EQ(bootstrapGetUniqueId(&u1), ncclSuccess);
    ASSERT_EQ(bootstrapGetUniqueId(&u2), ncclSuccess);
    EXPECT_EQ(memcmp(&u1, &u2, sizeof(u1)), 0);
    BootstrapId d;
    ASSERT_EQ(bootstrapIdDecode(&u1, &d), ncclSuccess);
    EXPECT_EQ(d.flags, kBootstrapIdFlagCommId);
    EXPECT_EQ(socketAddressPort(&d.root), 29517);
    EXPECT_EQ(bootstrapRootsWait(0), 0);  // no root until a rank binds it
  }
  for (const char* bad : {"127.0.0.1", "127.0.0.1:0", "[::1:5", "::1:80"}) {
    ScopedEnv e("NCCL_COMM_ID", bad);
    ncclUniqueId u;
    EXPECT_EQ(bootstrapGetUniqueId(&u), ncclInvalidArgument) << bad;
    EXPECT_NE(std::string(lastError()).find("NCCL_COMM_ID"), std::string::npos);
  }
}
