// Pins the proxy thread near its GPU (or NIC) with hwloc: the CPUs sysfs lists as local
// to the PCI device, restricted to those this process may use. A later topology helper
// (src/topo/) may replace this; until then it is self-contained and best effort.
//
// Why one core per proxy (MKERNEL_PROXY_PIN=2) rather than the whole near set: the proxies
// of one host are created at the same moment (comm init is collective) and Linux placed
// them on the same idle CPU, where two polling threads took turns for tens of
// milliseconds before the load balancer split them (session 14, H200: both proxy threads
// on CPU 15 with 15 ms of run delay each per 30 ms; every first timed size of the 2-process
// benchmark 2-3x slower). Each proxy of a comm's ranks on one host therefore takes its own
// core, counted from the end of the near set (CPU 0 tends to take interrupts) and inside the
// CPUs the thread inherited; a proxy whose slot is past the set's cores, and every proxy of
// a comm with one rank on the host, keeps the whole set (the old behaviour, MKERNEL_PROXY_PIN=1).
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <hwloc.h>
#include <hwloc/cudart.h>
#include <hwloc/linux.h>
#include <sys/file.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <set>
#include <string>

#include "base/checks.h"
#include "base/param.h"
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

// Slots held by the proxies alive on this host. A proxy takes its rank's index among the
// host's ranks, or the next one up by the host's rank count that no live proxy holds: the
// ranks of one comm (one process per GPU, or one process for all) get slots 0..n-1, and a
// second comm of the same ranks (a sub-group) the next n. "Live on this host" is a lock
// file per slot in MKERNEL_PROXY_SLOT_DIR (flock: released by the kernel when the process
// ends, however it ends, so no stale claim outlives a crash); without it (empty, or a
// directory that cannot be used) slots are unique per process only, and two processes'
// comms may pin their proxies to the same core.
static std::mutex slotMu;
static std::set<int> slotsHeld;      // this process's, with or without a lock file
static std::map<int, int> slotFds;   // slot -> its locked file
constexpr int kMaxSlotTries = 4096;  // a bound on the search; past it: the next free slot, unlocked

// A lock belongs to the open file, which fork() shares with the child (O_CLOEXEC helps only
// at exec): a child forked after init (a data-loader worker) would keep the parent's slots
// locked after the parent released them. The child closes its copies at once; the mutex is
// held across fork so the child never sees the tables half-updated.
static void slotForkPrepare() {
  slotMu.lock();
}
static void slotForkParent() {
  slotMu.unlock();
}
static void slotForkChild() {
  for (const auto& kv : slotFds) close(kv.second);
  slotFds.clear();
  slotsHeld.clear();
  slotMu.unlock();
}

enum class HostLock { kTaken, kOurs, kUnavailable };

// Locks the slot's file without waiting. kUnavailable: no usable directory (the caller
// falls back to per-process slots). The files are never removed: unlinking one that another
// process is about to lock would let two processes hold "the same" slot through two files,
// so one empty file per slot index ever used stays in the directory.
static HostLock lockHostSlot(const char* dir, int slot, int* fd) {
  const std::string path = std::string(dir) + "/mkernel-proxy-slot-" + std::to_string(slot);
  // Readable by every user (whatever the umask): flock needs no write access, so another
  // user's proxies see the claim too. A slot file we may not open at all is someone else's
  // claim, not a reason to give up the host-wide search.
  int f = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (f >= 0) {
    (void)fchmod(f, 0644);  // only works on our own files; others' are as their owner left them
  } else if (errno == EACCES) {
    f = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (f < 0 && errno == EACCES) return HostLock::kTaken;
  }
  if (f < 0) return HostLock::kUnavailable;
  int r;
  do {
    r = flock(f, LOCK_EX | LOCK_NB);
  } while (r != 0 && errno == EINTR);
  if (r == 0) {
    *fd = f;
    return HostLock::kOurs;
  }
  const bool taken = errno == EWOULDBLOCK;
  close(f);
  return taken ? HostLock::kTaken : HostLock::kUnavailable;
}

int proxyClaimSlot(int hostIndex, int hostCount) {
  static std::once_flag forkOnce;
  std::call_once(forkOnce, [] { pthread_atfork(slotForkPrepare, slotForkParent, slotForkChild); });
  std::lock_guard<std::mutex> lk(slotMu);
  const char* dir = MK_PARAM_STR(ProxySlotDir);
  bool hostWide = dir[0] != '\0';
  int s = hostIndex < 0 ? 0 : hostIndex;
  const int step = hostCount < 1 ? 1 : hostCount;
  for (int tries = 0; tries < kMaxSlotTries; tries++, s += step) {
    if (slotsHeld.count(s)) continue;
    if (!hostWide) break;
    int fd = -1;
    const HostLock h = lockHostSlot(dir, s, &fd);
    if (h == HostLock::kTaken) continue;
    if (h == HostLock::kOurs) {
      slotFds[s] = fd;
    } else {
      MK_INFO(kProxy, "proxy: slot files in %s not usable (%s); slots unique per process only", dir,
              strerror(errno));
      hostWide = false;
      // Restart the per-process search from the rank's own index.
      s = (hostIndex < 0 ? 0 : hostIndex) - step;
      continue;
    }
    break;
  }
  while (slotsHeld.count(s)) s += step;  // the search ran out: still never a shared slot
  slotsHeld.insert(s);
  return s;
}

void proxyReleaseSlot(int slot) {
  std::lock_guard<std::mutex> lk(slotMu);
  slotsHeld.erase(slot);
  auto it = slotFds.find(slot);
  if (it != slotFds.end()) {
    close(it->second);  // releases the flock
    slotFds.erase(it);
  }
}

// Narrows `set` to the first PU of its slot-th core from the end; leaves it whole when
// the set has no more than `slot` cores (or no core objects at all).
static void narrowToSlot(hwloc_topology_t topo, hwloc_bitmap_t set, int slot) {
  if (slot < 0) return;
  int cores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, set, HWLOC_OBJ_CORE);
  if (cores <= slot) return;
  hwloc_obj_t core =
      hwloc_get_obj_inside_cpuset_by_type(topo, set, HWLOC_OBJ_CORE, (unsigned)(cores - 1 - slot));
  if (!core || !core->cpuset) return;
  hwloc_bitmap_and(set, set, core->cpuset);
  hwloc_bitmap_singlify(set);
}

// Mode 2: inside the CPUs the calling thread may already run on (taskset, a launcher's
// binding: hwloc's allowed set is the cgroup's, not that mask), so a proxy never lands on
// another task's cores (none of them near the device: the inherited mask as it is); then one
// core by slot.
static void narrowForThread(hwloc_topology_t topo, hwloc_bitmap_t set, int slot) {
  hwloc_bitmap_t cur = hwloc_bitmap_alloc();
  if (hwloc_get_cpubind(topo, cur, HWLOC_CPUBIND_THREAD) == 0 && !hwloc_bitmap_iszero(cur)) {
    if (hwloc_bitmap_intersects(set, cur))
      hwloc_bitmap_and(set, set, cur);
    else
      hwloc_bitmap_copy(set, cur);
  }
  hwloc_bitmap_free(cur);
  narrowToSlot(topo, set, slot);
}

// The CPUs a proxy of this mode binds to, from its near set (narrowed in place); false when
// none of them may be used. proxyPinThread and the tests' proxyPinChoice share this.
static bool pinSet(hwloc_topology_t topo, hwloc_bitmap_t set, int slot, int mode) {
  hwloc_bitmap_and(set, set, hwloc_topology_get_allowed_cpuset(topo));
  if (hwloc_bitmap_iszero(set)) return false;
  if (mode == 2) narrowForThread(topo, set, slot);
  return true;
}

std::string proxyPinChoice(const std::string& nearList, int slot, int mode) {
  hwloc_topology_t topo = topology();
  if (!topo || mode == 0) return "";
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  std::string out;
  char* s = nullptr;
  if (hwloc_bitmap_list_sscanf(set, nearList.c_str()) == 0 && pinSet(topo, set, slot, mode) &&
      hwloc_bitmap_list_asprintf(&s, set) >= 0)
    out = s;
  free(s);
  hwloc_bitmap_free(set);
  return out;
}

ncclResult_t proxyPinThread(int cudaDev, const std::string& nicPciPath, int slot) {
  const int mode = (int)MK_PARAM_INT(ProxyPin);
  if (mode == 0) return ncclSuccess;
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
  have = have && pinSet(topo, set, slot, mode);
  if (!have) {
    MK_INFO(kProxy, "proxy: no device locality known; thread not pinned");
  } else if (hwloc_set_cpubind(topo, set, HWLOC_CPUBIND_THREAD) != 0) {
    MK_INFO(kProxy, "proxy: hwloc_set_cpubind failed (%s); thread not pinned", strerror(errno));
  } else {
    char* s = nullptr;
    hwloc_bitmap_list_asprintf(&s, set);
    MK_INFO(kProxy, "proxy: thread pinned to CPUs %s (near %s, slot %d)", s ? s : "?", from.c_str(),
            slot);
    free(s);
  }
  hwloc_bitmap_free(set);
  return ncclSuccess;
}

}  // namespace mk
