// Pins the proxy thread near its GPU (or NIC) with hwloc: the CPUs sysfs lists as local
// to the PCI device, restricted to those this process may use. A later topology helper
// (src/topo/) may replace this; until then it is self-contained and best effort.
#include <cstring>
#include <hwloc.h>
#include <hwloc/cudart.h>
#include <hwloc/linux.h>

#include <mutex>
#include <string>

#include "base/checks.h"
#include "transport/proxy.h"

namespace mk {

static hwloc_topology_t topology() {
  static hwloc_topology_t topo = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0) return;
    if (hwloc_topology_load(t) != 0) {
      hwloc_topology_destroy(t);
      return;
    }
    topo = t;  // kept for the life of the process
  });
  return topo;
}

ncclResult_t proxyPinThread(int cudaDev, const std::string& nicPciPath) {
  hwloc_topology_t topo = topology();
  if (!topo) {
    MK_INFO(kProxy, "proxy: no hwloc topology; thread not pinned");
    return ncclSuccess;
  }
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  bool have = false;
  std::string from;
  if (cudaDev >= 0 && hwloc_cudart_get_device_cpuset(topo, cudaDev, set) == 0 &&
      !hwloc_bitmap_iszero(set)) {
    have = true;
    from = "GPU " + std::to_string(cudaDev);
  } else if (!nicPciPath.empty() &&
             hwloc_linux_read_path_as_cpumask((nicPciPath + "/local_cpus").c_str(), set) == 0 &&
             !hwloc_bitmap_iszero(set)) {
    have = true;
    from = nicPciPath;
  }
  if (have) {
    hwloc_bitmap_and(set, set, hwloc_topology_get_allowed_cpuset(topo));
    have = !hwloc_bitmap_iszero(set);
  }
  if (!have) {
    MK_INFO(kProxy, "proxy: no device locality known; thread not pinned");
  } else if (hwloc_set_cpubind(topo, set, HWLOC_CPUBIND_THREAD) != 0) {
    MK_INFO(kProxy, "proxy: hwloc_set_cpubind failed (%s); thread not pinned", strerror(errno));
  } else {
    char* s = nullptr;
    hwloc_bitmap_list_asprintf(&s, set);
    MK_INFO(kProxy, "proxy: thread pinned to CPUs %s (near %s)", s ? s : "?", from.c_str());
    free(s);
  }
  hwloc_bitmap_free(set);
  return ncclSuccess;
}

}  // namespace mk
