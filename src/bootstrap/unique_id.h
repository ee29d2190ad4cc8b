// The bootstrap's ncclUniqueId: what a rank needs to find and authenticate to the root.
//
// Layout of the 128 bytes (little endian):
//   [0..3]    magic "MKBS"           [4..5]  protocol version   [6..7] flags
//   [8..15]   64-bit secret          [16..39] root address (SocketWireAddress)
//   [40..119] zero                   [120..127] checksum of bytes 0..119
// Encoding and decoding are pure functions; decode rejects anything it did not write.
#pragma once
#include <cstddef>
#include <cstdint>

#include <nccl.h>

#include "bootstrap/socket.h"

namespace mk {

constexpr uint32_t kBootstrapIdMagic = 0x53424b4d;  // "MKBS" in memory order
// Bumped whenever the root or peer wire protocol changes; the root and peers refuse others.
constexpr uint16_t kBootstrapProtocolVersion = 1;
// The root was not started by ncclGetUniqueId: the id comes from NCCL_COMM_ID, and the first
// rank of the root's group binds the address in bootstrapInit (as NCCL's rank 0 does).
constexpr uint16_t kBootstrapIdFlagCommId = 1;

struct BootstrapId {
  uint64_t secret = 0;
  SocketAddress root{};
  uint16_t flags = 0;
};

void bootstrapIdEncode(const BootstrapId& id, ncclUniqueId* out);
// ncclInvalidArgument with a message for a bad magic, version, checksum, flags or address.
ncclResult_t bootstrapIdDecode(const ncclUniqueId* in, BootstrapId* out);

// 64-bit FNV-1a with a final avalanche; `seed` chains calls. Not cryptographic: it derives
// identities from secrets that already are random, and checksums ids.
uint64_t bootstrapHash(const void* data, size_t n, uint64_t seed = 0);
// Random bytes from getrandom(), falling back to /dev/urandom.
ncclResult_t bootstrapRandom(void* buf, size_t n);

}  // namespace mk
