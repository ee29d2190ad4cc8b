// Communicator configuration: ncclConfig_t validated and copied like NCCL does
// (by size, magic and version, so older callers with a shorter struct still work).
#pragma once
#include <nccl.h>
#include <string>

namespace mk {

struct Config {
  bool blocking = true;
  int cgaClusterSize = 0;
  int minCTAs = 0;  // 0: automatic
  int maxCTAs = 0;  // 0: automatic (SM count / ranks sharing the GPU)
  std::string netName;
  bool splitShare = false;
  int trafficClass = -1;
  std::string commName;
  bool collnetEnable = false;
  int ctaPolicy = 0;
  bool shrinkShare = false;
  int nvlsCTAs = 0;
  int nChannelsPerNetPeer = 0;
  int nvlinkCentricSched = 0;
};

// config may be null (defaults). As NCCL: any size and version are read (a newer caller's
// extra fields are ignored, an older one's missing fields stay default); a bad magic (or a
// struct too short to hold it) or an out-of-range value gives ncclInvalidArgument + message.
ncclResult_t configParse(const ncclConfig_t* config, Config* out);
// A config for a child comm: the user's if given, else the parent's.
ncclResult_t configInherit(const ncclConfig_t* user, const Config& parent, Config* out);

}  // namespace mk
