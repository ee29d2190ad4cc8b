#include "comm/config.h"

#include <climits>
#include <cstddef>

#include "base/checks.h"

namespace mk {
namespace {
constexpr unsigned kConfigMagic = 0xcafebeef;
// Oldest ncclConfig_t layout we accept (NCCL 2.14 introduced the struct).
constexpr unsigned kMinConfigVersion = NCCL_VERSION(2, 14, 0);

bool has(const ncclConfig_t* c, size_t offset, size_t sz) {
  return c->size >= offset + sz;
}
#define MK_HAS(c, field) has(c, offsetof(ncclConfig_t, field), sizeof(c->field))
#define MK_SET(field) (MK_HAS(config, field) && config->field != NCCL_CONFIG_UNDEF_INT)
}  // namespace

ncclResult_t configParse(const ncclConfig_t* config, Config* out) {
  *out = Config();
  if (config == nullptr) return ncclSuccess;
  MK_ARGCHECK(config->magic == kConfigMagic,
              "Invalid config: bad magic 0x%x (initialize it with NCCL_CONFIG_INITIALIZER)",
              config->magic);
  MK_ARGCHECK(config->version >= kMinConfigVersion && config->version <= NCCL_VERSION_CODE,
              "Invalid config: version %u not in [%u, %u]", config->version, kMinConfigVersion,
              (unsigned)NCCL_VERSION_CODE);
  MK_ARGCHECK(config->size >= offsetof(ncclConfig_t, cgaClusterSize) &&
                  config->size <= sizeof(ncclConfig_t),
              "Invalid config: size %zu (expected at most %zu)", config->size,
              sizeof(ncclConfig_t));
  if (MK_SET(blocking)) {
    MK_ARGCHECK(config->blocking == 0 || config->blocking == 1,
                "Invalid config: blocking must be 0 or 1, got %d", config->blocking);
    out->blocking = config->blocking == 1;
  }
  if (MK_SET(cgaClusterSize)) {
    MK_ARGCHECK(config->cgaClusterSize >= 0 && config->cgaClusterSize <= 8,
                "Invalid config: cgaClusterSize %d not in [0, 8]", config->cgaClusterSize);
    out->cgaClusterSize = config->cgaClusterSize;
  }
  if (MK_SET(minCTAs)) {
    MK_ARGCHECK(config->minCTAs >= 1, "Invalid config: minCTAs %d < 1", config->minCTAs);
    out->minCTAs = config->minCTAs;
  }
  if (MK_SET(maxCTAs)) {
    MK_ARGCHECK(config->maxCTAs >= 1, "Invalid config: maxCTAs %d < 1", config->maxCTAs);
    out->maxCTAs = config->maxCTAs;
  }
  if (out->minCTAs && out->maxCTAs)
    MK_ARGCHECK(out->minCTAs <= out->maxCTAs, "Invalid config: minCTAs %d > maxCTAs %d",
                out->minCTAs, out->maxCTAs);
  if (MK_HAS(config, netName) && config->netName) out->netName = config->netName;
  if (MK_SET(splitShare)) out->splitShare = config->splitShare != 0;
  if (MK_SET(trafficClass)) out->trafficClass = config->trafficClass;
  if (MK_HAS(config, commName) && config->commName) out->commName = config->commName;
  if (MK_SET(collnetEnable)) out->collnetEnable = config->collnetEnable != 0;
  if (MK_SET(CTAPolicy)) {
    MK_ARGCHECK(config->CTAPolicy >= 0 && config->CTAPolicy <= 2,
                "Invalid config: CTAPolicy %d not in [0, 2]", config->CTAPolicy);
    out->ctaPolicy = config->CTAPolicy;
  }
  if (MK_SET(shrinkShare)) out->shrinkShare = config->shrinkShare != 0;
  if (MK_SET(nvlsCTAs)) out->nvlsCTAs = config->nvlsCTAs;
  if (MK_SET(nChannelsPerNetPeer)) out->nChannelsPerNetPeer = config->nChannelsPerNetPeer;
  if (MK_SET(nvlinkCentricSched)) out->nvlinkCentricSched = config->nvlinkCentricSched;
  return ncclSuccess;
}

ncclResult_t configInherit(const ncclConfig_t* user, const Config& parent, Config* out) {
  if (user == nullptr) {
    *out = parent;
    return ncclSuccess;
  }
  return configParse(user, out);
}

}  // namespace mk
