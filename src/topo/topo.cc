#include "topo/topo.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>
#include <fstream>
#include <hwloc.h>
#include <map>
#include <mutex>
#include <utility>
#include <unistd.h>

#include "base/checks.h"

namespace mk {
namespace {
uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}
std::string readFirstLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}
}  // namespace

uint64_t hostHash() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  // The boot id separates containers that share a hostname across machines.
  return fnv1a(std::string(host) + "|" + readFirstLine("/proc/sys/kernel/random/boot_id"));
}

uint64_t pidHash() {
  char ns[256] = {};
  ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  if (n < 0) ns[0] = '\0';
  return fnv1a(std::string(ns) + "|" + std::to_string(getpid()));
}

ncclResult_t topoLocalInfo(ncclComm* comm, RankInfo* info) {
  info->hostHash = hostHash();
  info->pidHash = pidHash();
  info->pid = getpid();
  info->cudaDev = comm->cudaDev;
  char bus[64] = {};
  CUDACHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), comm->cudaDev));
  unsigned dom = 0, b = 0, d = 0, f = 0;
  sscanf(bus, "%x:%x:%x.%x", &dom, &b, &d, &f);
  info->busId = ((int64_t)dom << 20) | (b << 12) | (d << 4) | f;
  CUDACHECK(cudaDeviceGetAttribute(&info->smCount, cudaDevAttrMultiProcessorCount, comm->cudaDev));
  return ncclSuccess;
}

ncclResult_t topoCompute(const std::vector<RankInfo>& info, int rank, int emulateNodes, Topo* out) {
  const int n = (int)info.size();
  MK_ARGCHECK(rank >= 0 && rank < n, "topoCompute: rank %d out of range %d", rank, n);
  *out = Topo();
  out->rankToNode.assign(n, 0);
  out->rankToLocalRank.assign(n, 0);
  if (emulateNodes > 1) {
    if (emulateNodes > n) {
      MK_WARN("MKERNEL_EMULATE_NODES=%d exceeds %d ranks; using %d nodes", emulateNodes, n, n);
      emulateNodes = n;
    }
    // Consecutive ranks; uneven splits keep the larger nodes first.
    for (int r = 0; r < n; r++) out->rankToNode[r] = (int)((int64_t)r * emulateNodes / n);
    out->nNodes = emulateNodes;
    out->virtualNodes = true;
  } else {
    std::map<uint64_t, int> hostToNode;  // node index by order of first appearance
    std::vector<uint64_t> order;
    for (int r = 0; r < n; r++) {
      auto it = hostToNode.find(info[r].hostHash);
      if (it == hostToNode.end())
        it = hostToNode.emplace(info[r].hostHash, (int)hostToNode.size()).first;
      out->rankToNode[r] = it->second;
    }
    out->nNodes = (int)hostToNode.size();
  }
  out->nodeRanks.assign(out->nNodes, {});
  for (int r = 0; r < n; r++) {
    auto& v = out->nodeRanks[out->rankToNode[r]];
    out->rankToLocalRank[r] = (int)v.size();
    v.push_back(r);
  }
  out->node = out->rankToNode[rank];
  out->localRank = out->rankToLocalRank[rank];
  out->localRanks = (int)out->nodeRanks[out->node].size();
  // Ranks per GPU (host, bus id) and each GPU's SMs (the fewest any of its ranks reads): the
  // least share, alike on every rank.
  std::map<std::pair<uint64_t, int64_t>, std::pair<int, int>> gpus;  // -> (ranks, SMs)
  for (int r = 0; r < n; r++) {
    auto& g = gpus[{info[r].hostHash, info[r].busId}];
    g.second = g.first++ == 0 ? info[r].smCount : std::min(g.second, info[r].smCount);
  }
  out->leastShare = INT_MAX;
  for (const auto& g : gpus)
    out->leastShare = std::min(out->leastShare, std::max(1, g.second.second / g.second.first));
  out->ranksOnMyDevice = 0;
  out->ranksInMyProcess = 0;
  out->inMyProcess.assign(n, 0);
  for (int r = 0; r < n; r++) {
    if (info[r].hostHash == info[rank].hostHash && info[r].busId == info[rank].busId) {
      if (r == rank) out->indexOnMyDevice = out->ranksOnMyDevice;
      out->ranksOnMyDevice++;
      if (info[r].pidHash == info[rank].pidHash) {
        out->inMyProcess[r] = 1;
        out->ranksInMyProcess++;
      }
    }
  }
  return ncclSuccess;
}

std::string topoQueueHint(int ranksInProcess, bool mps, const char* maxConnectionsEnv) {
  if (ranksInProcess < 2) return "";
  int queues = kDefaultMaxConnections;
  bool fromEnv = false;
  if (maxConnectionsEnv != nullptr && maxConnectionsEnv[0] != '\0') {
    char* end = nullptr;
    const long v = strtol(maxConnectionsEnv, &end, 10);
    if (end != maxConnectionsEnv && *end == '\0' && v > 0) {
      queues = (int)std::min<long>(v, kMaxConnections);
      fromEnv = true;
    }
  }
  // MPS without the variable: on the H200 (session 32) 3 ranks of one process waited for each
  // other until the timeout where 2 happened to run, and both ran with the variable at 32. A
  // probe (session 33) then ran 16 streams of pending 1-thread kernels side by side under MPS
  // with the variable unset, so a plain queue count does not explain those hangs; the cause
  // is not established. 2 ranks are not known to be safe, so warn from 2 on.
  const bool mpsUnset = mps && !fromEnv;
  if (!mpsUnset && queues >= ranksInProcess) return "";
  char why[160], fix[160];
  if (mpsUnset)
    snprintf(why, sizeof(why),
             "under CUDA MPS without CUDA_DEVICE_MAX_CONNECTIONS (such comms hung there "
             "on an H200 and ran with it set)");
  else
    snprintf(why, sizeof(why),
             "but CUDA_DEVICE_MAX_CONNECTIONS%s gives its streams %d hardware queue%s",
             fromEnv ? "" : " (unset: CUDA's default)", queues, queues == 1 ? "" : "s");
  if (ranksInProcess <= kMaxConnections)
    snprintf(fix, sizeof(fix),
             "set CUDA_DEVICE_MAX_CONNECTIONS to at least %d before CUDA starts, or run fewer "
             "ranks per process",
             ranksInProcess);
  else
    snprintf(fix, sizeof(fix), "run at most %d ranks per process (CUDA's most queues)",
             kMaxConnections);
  char b[512];
  snprintf(b, sizeof(b),
           "%d ranks of this comm are threads of this process on this GPU, %s: such ranks can "
           "wait for each other until the timeout; %s",
           ranksInProcess, why, fix);
  return b;
}

namespace {
struct HwlocTopo {
  std::once_flag once;
  hwloc_topology_t topo = nullptr;
  std::mutex mu;
};
HwlocTopo& hw() {
  static HwlocTopo* h = new HwlocTopo();
  return *h;
}
}  // namespace

void topoAffinity(int64_t busId, Topo* topo) {
  HwlocTopo& h = hw();
  std::call_once(h.once, [&h] {
    if (hwloc_topology_init(&h.topo) != 0) {
      h.topo = nullptr;
      return;
    }
    hwloc_topology_set_io_types_filter(h.topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(h.topo) != 0) {
      hwloc_topology_destroy(h.topo);
      h.topo = nullptr;
    }
  });
  if (!h.topo) {
    MK_INFO(kInit, "hwloc: topology unavailable, no GPU/NIC affinity");
    return;
  }
  std::lock_guard<std::mutex> g(h.mu);
  unsigned dom = (unsigned)(busId >> 20), bus = (unsigned)((busId >> 12) & 0xff),
           dev = (unsigned)((busId >> 4) & 0xff), fn = (unsigned)(busId & 0xf);
  hwloc_obj_t pci = hwloc_get_pcidev_by_busid(h.topo, dom, bus, dev, fn);
  hwloc_obj_t anc = pci ? hwloc_get_non_io_ancestor_obj(h.topo, pci) : nullptr;
  if (anc && anc->nodeset) {
    int numa = hwloc_bitmap_first(anc->nodeset);
    topo->numaNode = numa;
  }
  // Nearest NICs: network/OpenFabrics OS devices sharing the GPU's non-I/O ancestor.
  std::string nics;
  for (hwloc_obj_t os = hwloc_get_next_osdev(h.topo, nullptr); os;
       os = hwloc_get_next_osdev(h.topo, os)) {
    if (os->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS &&
        os->attr->osdev.type != HWLOC_OBJ_OSDEV_NETWORK)
      continue;
    hwloc_obj_t nicAnc = hwloc_get_non_io_ancestor_obj(h.topo, os);
    if (anc == nullptr || nicAnc == anc) {
      if (!nics.empty()) nics += ",";
      nics += os->name ? os->name : "?";
    }
  }
  topo->nics = nics;
  MK_INFO(kInit, "hwloc: GPU %04x:%02x:%02x.%x NUMA node %d, nearest NICs: %s", dom, bus, dev, fn,
          topo->numaNode, nics.empty() ? "none" : nics.c_str());
}

}  // namespace mk
