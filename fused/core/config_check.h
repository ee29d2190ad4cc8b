// The versioned header every fused operator's config struct starts with (size, magic,
// version), checked as NCCL checks ncclConfig_t: a caller's struct smaller than version 1,
// another struct passed by mistake, or a version this library does not know is refused with
// ncclInvalidArgument and a message that says how to initialise the struct.
#pragma once
#include <cstddef>
#include <nccl.h>

namespace mk {
namespace fused {

struct ConfigHeaderRule {
  size_t v1Size;         // bytes of version 1 of the struct
  unsigned int magic;    // the struct's magic number
  unsigned int version;  // the newest version this library knows
  const char* type;      // e.g. "ncclFusedConfig_t"
  const char* init;      // e.g. "NCCL_FUSED_CONFIG_INITIALIZER"
};

ncclResult_t checkConfigHeader(size_t size, unsigned int magic, unsigned int version,
                               const ConfigHeaderRule& rule, const char* api);

// The same on a caller's struct T (size, magic, version first): magic and version are read
// only once size says the struct holds them.
template <class T>
ncclResult_t checkConfigHeaderOf(const T* in, const ConfigHeaderRule& rule, const char* api) {
  static_assert(offsetof(T, version) + sizeof(unsigned int) <= 16, "size, magic, version first");
  if (in->size < rule.v1Size) return checkConfigHeader(in->size, 0, 0, rule, api);
  return checkConfigHeader(in->size, in->magic, in->version, rule, api);
}

}  // namespace fused
}  // namespace mk
