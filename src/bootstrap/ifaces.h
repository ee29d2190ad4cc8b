// Network interface selection for bootstrap and socket traffic, with NCCL's rules:
//   NCCL_SOCKET_IFNAME  comma list of name prefixes; a leading '^' excludes the listed ones,
//                       a leading '=' (after any '^') makes them exact names:
//                       "eth", "=eth0", "^docker,lo", "^=eth1".
//   NCCL_SOCKET_FAMILY  AF_INET or AF_INET6 restricts the address family.
// Without NCCL_SOCKET_IFNAME: "ib" interfaces first, then an interface in the same subnet as
// NCCL_COMM_ID (when set), then anything but docker and lo, then docker, then lo.
// The matching is pure (ifSelect and helpers) so that unit tests drive it with fake lists.
#pragma once
#include <string>
#include <vector>

#include "bootstrap/socket.h"

namespace mk {

struct NetIf {
  std::string name;
  SocketAddress addr{};  // port 0
  SocketAddress mask{};  // netmask (same family); zero when unknown
};

// True when `name` matches the NCCL_SOCKET_IFNAME-style `spec` (empty spec matches all).
bool ifNameMatches(const char* spec, const char* name);
// AF_INET, AF_INET6, AF_UNSPEC for "" ; -1 for anything else.
int ifParseFamily(const char* str);
// True when `remote` lies in the subnet of `iface` (same family, masked bits equal).
bool ifSameSubnet(const NetIf& iface, const SocketAddress& remote);
// The interfaces of `all` matching `spec` and `family` (AF_UNSPEC = any), at most one address
// per name (IPv4 first, then global IPv6, then link-local IPv6), in first-seen order of names,
// at most maxIfs of them.
std::vector<NetIf> ifFilter(const std::vector<NetIf>& all, const char* spec, int family,
                            int maxIfs);
// The whole policy (see the top of this file). commId may be null.
std::vector<NetIf> ifSelect(const std::vector<NetIf>& all, const char* ifnameSpec, int family,
                            const SocketAddress* commId, int maxIfs);

// The host's interfaces that are up and have an IPv4/IPv6 address (getifaddrs).
ncclResult_t ifList(std::vector<NetIf>* out);
// ifList + ifSelect with NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY, NCCL_COMM_ID. Fails with
// ncclSystemError and a message when nothing matches.
ncclResult_t ifFind(std::vector<NetIf>* out, int maxIfs);
// The address bootstrap sockets listen on: the first interface ifFind picks, port 0.
ncclResult_t ifBootstrapAddress(SocketAddress* out, std::string* ifName);

}  // namespace mk
