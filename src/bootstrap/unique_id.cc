#include "bootstrap/unique_id.h"

#include <cstdint>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/checks.h"
#include "base/debug.h"

namespace mk {
namespace {

constexpr size_t kOffMagic = 0, kOffVersion = 4, kOffFlags = 6, kOffSecret = 8, kOffAddr = 16,
                 kOffReserved = 40, kOffChecksum = 120;
static_assert(kOffAddr + sizeof(SocketWireAddress) == kOffReserved, "id layout");
static_assert(kOffChecksum + 8 == NCCL_UNIQUE_ID_BYTES, "id layout");

void putLe(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}
uint64_t getLe(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

}  // namespace

uint64_t bootstrapHash(const void* data, size_t n, uint64_t seed) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0xcbf29ce484222325ull ^ (seed * 0x9e3779b97f4a7c15ull);
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  // splitmix64 finaliser: FNV alone mixes the last bytes poorly into the high bits.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

ncclResult_t bootstrapRandom(void* buf, size_t n) {
  uint8_t* p = static_cast<uint8_t*>(buf);
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(p + got, n - got, 0);
    if (r > 0) {
      got += (size_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    break;  // ENOSYS (old kernel, seccomp): fall back
  }
  if (got == n) return ncclSuccess;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    MK_WARN("No source of random bytes: getrandom and /dev/urandom failed (%s)", strerror(errno));
    return ncclSystemError;
  }
  while (got < n) {
    ssize_t r = read(fd, p + got, n - got);
    if (r > 0) {
      got += (size_t)r;
    } else if (!(r < 0 && errno == EINTR)) {
      close(fd);
      MK_WARN("Reading /dev/urandom failed");
      return ncclSystemError;
    }
  }
  close(fd);
  return ncclSuccess;
}

void bootstrapIdEncode(const BootstrapId& id, ncclUniqueId* out) {
  memset(out, 0, sizeof(*out));
  uint8_t* b = reinterpret_cast<uint8_t*>(out->internal);
  putLe(b + kOffMagic, kBootstrapIdMagic, 4);
  putLe(b + kOffVersion, kBootstrapProtocolVersion, 2);
  putLe(b + kOffFlags, id.flags, 2);
  putLe(b + kOffSecret, id.secret, 8);
  SocketWireAddress wire;
  socketAddressToWire(&id.root, &wire);
  memcpy(b + kOffAddr, wire.bytes, sizeof(wire.bytes));
  putLe(b + kOffChecksum, bootstrapHash(b, kOffChecksum), 8);
}

ncclResult_t bootstrapIdDecode(const ncclUniqueId* in, BootstrapId* out) {
  MK_ARGCHECK(in != nullptr && out != nullptr, "bootstrapIdDecode: null argument");
  const uint8_t* b = reinterpret_cast<const uint8_t*>(in->internal);
  uint32_t magic = (uint32_t)getLe(b + kOffMagic, 4);
  MK_ARGCHECK(magic == kBootstrapIdMagic,
              "Invalid ncclUniqueId: bad magic 0x%08x (not made by mkernel's ncclGetUniqueId, "
              "or corrupted in transit)",
              magic);
  uint16_t version = (uint16_t)getLe(b + kOffVersion, 2);
  MK_ARGCHECK(version == kBootstrapProtocolVersion,
              "Invalid ncclUniqueId: protocol version %u, this library speaks %u (mixed "
              "mkernel versions?)",
              version, kBootstrapProtocolVersion);
  uint64_t sum = getLe(b + kOffChecksum, 8);
  MK_ARGCHECK(sum == bootstrapHash(b, kOffChecksum),
              "Invalid ncclUniqueId: checksum mismatch (corrupted in transit)");
  uint16_t flags = (uint16_t)getLe(b + kOffFlags, 2);
  MK_ARGCHECK((flags & ~kBootstrapIdFlagCommId) == 0, "Invalid ncclUniqueId: unknown flags 0x%x",
              flags);
  for (size_t i = kOffReserved; i < kOffChecksum; i++)
    MK_ARGCHECK(b[i] == 0, "Invalid ncclUniqueId: reserved byte %zu is not zero", i);
  SocketWireAddress wire;
  memcpy(wire.bytes, b + kOffAddr, sizeof(wire.bytes));
  BootstrapId id;
  if (socketAddressFromWire(&wire, &id.root) != ncclSuccess) {
    MK_WARN("Invalid ncclUniqueId: bad root address");
    return ncclInvalidArgument;
  }
  id.secret = getLe(b + kOffSecret, 8);
  id.flags = flags;
  *out = id;
  return ncclSuccess;
}

}  // namespace mk
