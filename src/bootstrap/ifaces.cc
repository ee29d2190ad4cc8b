#include "bootstrap/ifaces.h"

#include <cstdint>
#include <string>
#include <vector>
#include <ifaddrs.h>
#include <net/if.h>

#include <algorithm>
#include <cstring>

#include "base/checks.h"
#include "base/debug.h"
#include "base/param.h"

namespace mk {

bool ifNameMatches(const char* spec, const char* name) {
  if (spec == nullptr || *spec == '\0') return true;
  bool exclude = spec[0] == '^';
  if (exclude) spec++;
  bool exact = spec[0] == '=';
  if (exact) spec++;
  bool matched = false;
  const char* p = spec;
  while (!matched) {
    const char* comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len > 0) {
      matched =
          exact ? (strlen(name) == len && strncmp(name, p, len) == 0) : strncmp(name, p, len) == 0;
    }
    if (comma == nullptr) break;
    p = comma + 1;
  }
  return exclude ? !matched : matched;
}

int ifParseFamily(const char* str) {
  if (str == nullptr || *str == '\0') return AF_UNSPEC;
  if (strcmp(str, "AF_INET") == 0) return AF_INET;
  if (strcmp(str, "AF_INET6") == 0) return AF_INET6;
  return -1;
}

bool ifSameSubnet(const NetIf& iface, const SocketAddress& remote) {
  int fam = iface.addr.sa.sa_family;
  if (fam != remote.sa.sa_family || iface.mask.sa.sa_family != fam) return false;
  const uint8_t *a, *r, *m;
  size_t n;
  if (fam == AF_INET) {
    a = reinterpret_cast<const uint8_t*>(&iface.addr.sin.sin_addr);
    r = reinterpret_cast<const uint8_t*>(&remote.sin.sin_addr);
    m = reinterpret_cast<const uint8_t*>(&iface.mask.sin.sin_addr);
    n = 4;
  } else if (fam == AF_INET6) {
    a = reinterpret_cast<const uint8_t*>(&iface.addr.sin6.sin6_addr);
    r = reinterpret_cast<const uint8_t*>(&remote.sin6.sin6_addr);
    m = reinterpret_cast<const uint8_t*>(&iface.mask.sin6.sin6_addr);
    n = 16;
  } else {
    return false;
  }
  for (size_t i = 0; i < n; i++)
    if ((a[i] & m[i]) != (r[i] & m[i])) return false;
  return true;
}

namespace {

// Preference among the addresses of one interface: lower is better.
int addrRank(const SocketAddress& a) {
  if (a.sa.sa_family == AF_INET) return 0;
  if (IN6_IS_ADDR_LINKLOCAL(&a.sin6.sin6_addr)) return 2;
  return 1;
}

}  // namespace

std::vector<NetIf> ifFilter(const std::vector<NetIf>& all, const char* spec, int family,
                            int maxIfs) {
  std::vector<NetIf> out;
  for (const NetIf& i : all) {
    int fam = i.addr.sa.sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (family != AF_UNSPEC && fam != family) continue;
    if (!ifNameMatches(spec, i.name.c_str())) continue;
    auto same =
        std::find_if(out.begin(), out.end(), [&](const NetIf& o) { return o.name == i.name; });
    if (same == out.end())
      out.push_back(i);
    else if (addrRank(i.addr) < addrRank(same->addr))
      *same = i;
  }
  if (maxIfs >= 0 && (int)out.size() > maxIfs) out.resize(maxIfs);
  return out;
}

std::vector<NetIf> ifSelect(const std::vector<NetIf>& all, const char* ifnameSpec, int family,
                            const SocketAddress* commId, int maxIfs) {
  // A one-character spec ("^" or "=") means nothing; NCCL ignores it too.
  if (ifnameSpec != nullptr && strlen(ifnameSpec) > 1)
    return ifFilter(all, ifnameSpec, family, maxIfs);
  std::vector<NetIf> out = ifFilter(all, "ib", family, maxIfs);
  if (out.empty() && commId != nullptr) {
    // Only an interface that can reach the root's subnet directly.
    std::vector<NetIf> any = ifFilter(all, "", family, -1);
    for (const NetIf& i : any)
      if (ifSameSubnet(i, *commId) && (maxIfs < 0 || (int)out.size() < maxIfs)) out.push_back(i);
  }
  if (out.empty()) out = ifFilter(all, "^docker,lo", family, maxIfs);
  if (out.empty()) out = ifFilter(all, "docker", family, maxIfs);
  if (out.empty()) out = ifFilter(all, "lo", family, maxIfs);
  return out;
}

ncclResult_t ifList(std::vector<NetIf>* out) {
  out->clear();
  ifaddrs* list = nullptr;
  SYSCHECK(getifaddrs(&list), "getifaddrs");
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    NetIf n;
    n.name = i->ifa_name;
    size_t len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    memcpy(&n.addr, i->ifa_addr, len);
    if (i->ifa_netmask != nullptr && i->ifa_netmask->sa_family == fam)
      memcpy(&n.mask, i->ifa_netmask, len);
    socketAddressSetPort(&n.addr, 0);
    out->push_back(n);
  }
  freeifaddrs(list);
  return ncclSuccess;
}

ncclResult_t ifFind(std::vector<NetIf>* out, int maxIfs) {
  const char* famStr = MK_PARAM_STR(SocketFamily);
  int family = ifParseFamily(famStr);
  if (family < 0) {
    MK_WARN("Ignoring NCCL_SOCKET_FAMILY=%s: expected AF_INET or AF_INET6", famStr);
    family = AF_UNSPEC;
  }
  SocketAddress commId{};
  bool haveCommId = false;
  const char* commIdStr = MK_PARAM_STR(CommId);
  if (*commIdStr != '\0') {
    // A bad NCCL_COMM_ID is reported by bootstrapGetUniqueId; here it only guides the choice.
    haveCommId = socketAddressFromString(commIdStr, &commId) == ncclSuccess;
  }
  std::vector<NetIf> all;
  NCCLCHECK(ifList(&all));
  const char* spec = MK_PARAM_STR(SocketIfname);
  *out = ifSelect(all, spec, family, haveCommId ? &commId : nullptr, maxIfs);
  if (out->empty()) {
    MK_WARN("No usable network interface (NCCL_SOCKET_IFNAME='%s', NCCL_SOCKET_FAMILY='%s')", spec,
            famStr);
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t ifBootstrapAddress(SocketAddress* out, std::string* ifName) {
  std::vector<NetIf> ifs;
  NCCLCHECK(ifFind(&ifs, 1));
  *out = ifs[0].addr;
  socketAddressSetPort(out, 0);
  if (ifName) *ifName = ifs[0].name;
  return ncclSuccess;
}

}  // namespace mk
