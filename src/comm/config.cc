#include "comm/config.h"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstring>

#include "base/checks.h"

namespace mk {
namespace {
constexpr unsigned kConfigMagic = 0xcafebeef;
// The largest CGA cluster the hardware launches (NCCL_MAX_CGA_CLUSTER_SIZE).
constexpr int kMaxCgaClusterSize = 8;
// NCCL's MAXCHANNELS: the bound of nChannelsPerNetPeer.
constexpr int kMaxChannels = 64;

bool set(int v) {
  return v != NCCL_CONFIG_UNDEF_INT;
}
bool setNot01(int v) {
  return set(v) && v != 0 && v != 1;
}

// NCCL's handling of a caller's struct of another version: read only the bytes both the
// caller's layout and ours have (a newer nccl.h's larger struct is accepted and its extra
// fields ignored; a shorter one leaves ours at their defaults), and forget the fields the
// caller's version did not have yet, whatever its bytes say.
ncclConfig_t readConfig(const ncclConfig_t* config) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  const ncclConfig_t def = NCCL_CONFIG_INITIALIZER;
  c.magic = 0;  // a struct too short to hold the magic is refused like a bad magic
  size_t size = 0;
  memcpy(&size, config, sizeof(size));
  memcpy(&c, config, std::min(size, sizeof(c)));
  if (c.version < NCCL_VERSION(2, 14, 0)) c.blocking = def.blocking;
  if (c.version < NCCL_VERSION(2, 17, 0)) {
    c.cgaClusterSize = def.cgaClusterSize;
    c.minCTAs = def.minCTAs;
    c.maxCTAs = def.maxCTAs;
    c.netName = def.netName;
  }
  if (c.version < NCCL_VERSION(2, 25, 0)) c.trafficClass = def.trafficClass;
  if (c.version < NCCL_VERSION(2, 27, 0)) {
    c.collnetEnable = def.collnetEnable;
    c.CTAPolicy = def.CTAPolicy;
    c.shrinkShare = def.shrinkShare;
    c.nvlsCTAs = def.nvlsCTAs;
  }
  if (c.version < NCCL_VERSION(2, 28, 0)) {
    c.nChannelsPerNetPeer = def.nChannelsPerNetPeer;
    c.nvlinkCentricSched = def.nvlinkCentricSched;
  }
  return c;
}
}  // namespace

ncclResult_t configParse(const ncclConfig_t* config, Config* out) {
  *out = Config();
  if (config == nullptr) return ncclSuccess;
  const ncclConfig_t c = readConfig(config);
  MK_ARGCHECK(c.magic == kConfigMagic,
              "Invalid config: bad magic 0x%x or size %zu (initialize it with "
              "NCCL_CONFIG_INITIALIZER)",
              c.magic, config->size);
  MK_ARGCHECK(!setNot01(c.blocking), "Invalid config: blocking must be 0 or 1, got %d", c.blocking);
  if (set(c.blocking)) out->blocking = c.blocking == 1;
  if (set(c.cgaClusterSize)) {
    MK_ARGCHECK(c.cgaClusterSize >= 0, "Invalid config: cgaClusterSize %d < 0", c.cgaClusterSize);
    out->cgaClusterSize = c.cgaClusterSize;
    // NCCL accepts any size here; a launch with a larger cluster than the hardware has would
    // fail, so keep the largest one that works.
    if (c.cgaClusterSize > kMaxCgaClusterSize) {
      MK_WARN_ADVISORY("config: cgaClusterSize %d is larger than %d, using %d", c.cgaClusterSize,
                       kMaxCgaClusterSize, kMaxCgaClusterSize);
      out->cgaClusterSize = kMaxCgaClusterSize;
    }
  }
  if (set(c.minCTAs)) {
    MK_ARGCHECK(c.minCTAs >= 1, "Invalid config: minCTAs %d < 1", c.minCTAs);
    out->minCTAs = c.minCTAs;
  }
  if (set(c.maxCTAs)) {
    MK_ARGCHECK(c.maxCTAs >= 1, "Invalid config: maxCTAs %d < 1", c.maxCTAs);
    out->maxCTAs = c.maxCTAs;
  }
  if (out->minCTAs && out->maxCTAs)
    MK_ARGCHECK(out->minCTAs <= out->maxCTAs, "Invalid config: minCTAs %d > maxCTAs %d",
                out->minCTAs, out->maxCTAs);
  MK_ARGCHECK(!setNot01(c.splitShare), "Invalid config: splitShare must be 0 or 1, got %d",
              c.splitShare);
  MK_ARGCHECK(!setNot01(c.collnetEnable), "Invalid config: collnetEnable must be 0 or 1, got %d",
              c.collnetEnable);
  MK_ARGCHECK(!setNot01(c.shrinkShare), "Invalid config: shrinkShare must be 0 or 1, got %d",
              c.shrinkShare);
  MK_ARGCHECK(!setNot01(c.nvlinkCentricSched),
              "Invalid config: nvlinkCentricSched must be 0 or 1, got %d", c.nvlinkCentricSched);
  MK_ARGCHECK(!set(c.nvlsCTAs) || c.nvlsCTAs > 0, "Invalid config: nvlsCTAs %d must be > 0",
              c.nvlsCTAs);
  MK_ARGCHECK(!set(c.nChannelsPerNetPeer) ||
                  (c.nChannelsPerNetPeer >= 1 && c.nChannelsPerNetPeer <= kMaxChannels),
              "Invalid config: nChannelsPerNetPeer %d not in [1, %d]", c.nChannelsPerNetPeer,
              kMaxChannels);
  if (set(c.CTAPolicy)) {
    MK_ARGCHECK(c.CTAPolicy >= NCCL_CTA_POLICY_DEFAULT && c.CTAPolicy <= NCCL_CTA_POLICY_ZERO,
                "Invalid config: CTAPolicy %d not in [0, 2]", c.CTAPolicy);
    out->ctaPolicy = c.CTAPolicy;
  }
  if (c.netName) out->netName = c.netName;
  if (set(c.splitShare)) out->splitShare = c.splitShare != 0;
  if (set(c.trafficClass)) out->trafficClass = c.trafficClass;
  if (c.commName) out->commName = c.commName;
  if (set(c.collnetEnable)) out->collnetEnable = c.collnetEnable != 0;
  if (set(c.shrinkShare)) out->shrinkShare = c.shrinkShare != 0;
  if (set(c.nvlsCTAs)) out->nvlsCTAs = c.nvlsCTAs;
  if (set(c.nChannelsPerNetPeer)) out->nChannelsPerNetPeer = c.nChannelsPerNetPeer;
  if (set(c.nvlinkCentricSched)) out->nvlinkCentricSched = c.nvlinkCentricSched;
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
