// Checks of the versioned header of the fused operators' config structs (config_check.h).
#include "fused/core/config_check.h"

#include "base/checks.h"

namespace mk {
namespace fused {

ncclResult_t checkConfigHeader(size_t size, unsigned int magic, unsigned int version,
                               const ConfigHeaderRule& r, const char* api) {
  MK_ARGCHECK(size >= r.v1Size,
              "%s: config->size=%zu is smaller than the first version of %s (%zu bytes): "
              "initialise it with %s",
              api, size, r.type, r.v1Size, r.init);
  MK_ARGCHECK(magic == r.magic,
              "%s: config->magic=0x%x is not the magic of %s: initialise it with %s", api, magic,
              r.type, r.init);
  MK_ARGCHECK(version >= 1 && version <= r.version,
              "%s: config->version=%u unknown (this library knows versions 1..%u of %s)", api,
              version, r.version, r.type);
  return ncclSuccess;
}

}  // namespace fused
}  // namespace mk
