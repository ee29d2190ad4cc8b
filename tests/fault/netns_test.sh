#!/usr/bin/env bash
# Socket net backend across two network namespaces joined by a veth pair:
#   1. a clean 16 x 8 MiB transfer between the namespaces;
#   2. a stream during which the link is taken down; both ends must get ncclRemoteError
#      within the net timeout (MKERNEL_NET_TIMEOUT_S, set to 4 s here) + slack.
# The two ends are the NetNs.Role test of mk_mp_tests (inert unless driven by this script).
# Needs root and `ip netns`; prints "SKIPPED: <why>" and exits 0 where they are missing.
# Traffic stays inside namespaces this script creates (10.77.0.0/24 on the veth only).
#
# Usage: tests/fault/netns_test.sh [path/to/mk_mp_tests]   (default: build/tests/mk_mp_tests)
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN="${1:-${MK_MP_TESTS:-$HERE/../../build/tests/mk_mp_tests}}"
NS_A="mknet_a_$$"
NS_B="mknet_b_$$"
VETH_A="mkva$$"
VETH_B="mkvb$$"
VETH_A="${VETH_A:0:15}"
VETH_B="${VETH_B:0:15}"
WORK="$(mktemp -d /tmp/mknet_netns.XXXXXX)"

skip() {
  echo "SKIPPED: $*"
  rm -rf "$WORK"
  exit 0
}

cleanup() {
  [ -n "${PID_A:-}" ] && kill "$PID_A" 2>/dev/null
  [ -n "${PID_B:-}" ] && kill "$PID_B" 2>/dev/null
  ip netns del "$NS_A" 2>/dev/null
  ip netns del "$NS_B" 2>/dev/null
  rm -rf "$WORK"
}

[ "$(id -u)" = 0 ] || skip "needs root for network namespaces"
command -v ip >/dev/null || skip "iproute2 (ip) not installed"
[ -x "$BIN" ] || skip "$BIN not built"
ip netns add "$NS_A" 2>/dev/null || skip "cannot create network namespaces here"
trap cleanup EXIT
ip netns add "$NS_B" || skip "cannot create a second network namespace"
ip link add "$VETH_A" type veth peer name "$VETH_B" 2>/dev/null || skip "cannot create a veth pair"
ip link set "$VETH_A" netns "$NS_A" && ip link set "$VETH_B" netns "$NS_B" || skip "cannot move veth ends"
ip -n "$NS_A" addr add 10.77.0.1/24 dev "$VETH_A"
ip -n "$NS_B" addr add 10.77.0.2/24 dev "$VETH_B"
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_A" link set "$VETH_A" up
ip -n "$NS_B" link set "$VETH_B" up
ip netns exec "$NS_A" ping -c 1 -W 2 10.77.0.2 >/dev/null 2>&1 || echo "note: ping across the veth failed (continuing)"

run_side() {  # ns role ifname
  ip netns exec "$1" env MKNET_NETNS_ROLE="$2" MKNET_NETNS_DIR="$WORK" NCCL_SOCKET_IFNAME="=$3" \
    MKERNEL_NET_TIMEOUT_S=4 MKERNEL_SOCKET_NCONNS=2 \
    "$BIN" --gtest_filter=NetNs.Role >"$WORK/$2.log" 2>&1
}
run_side "$NS_A" server "$VETH_A" & PID_A=$!
run_side "$NS_B" client "$VETH_B" & PID_B=$!

deadline=$((SECONDS + 60))
until [ -e "$WORK/phase2.server" ] && [ -e "$WORK/phase2.client" ]; do
  if [ $SECONDS -gt $deadline ] || ! kill -0 $PID_A 2>/dev/null || ! kill -0 $PID_B 2>/dev/null; then
    echo "FAILED: phase 1 did not complete"; cat "$WORK"/*.log; exit 1
  fi
  sleep 0.2
done
sleep 1
ip -n "$NS_A" link set "$VETH_A" down
touch "$WORK/linkdown"
echo "link $VETH_A taken down mid-transfer"

rc=0
wait $PID_A || rc=1
wait $PID_B || rc=1
PID_A=; PID_B=
grep -h "netns " "$WORK"/server.log "$WORK"/client.log
if [ $rc -ne 0 ]; then
  echo "---- server"; cat "$WORK/server.log"; echo "---- client"; cat "$WORK/client.log"
  echo "0 passed, 1 failed"
  exit 1
fi
echo "netns: 1 passed, 0 failed"
