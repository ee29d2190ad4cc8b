#!/usr/bin/env bash
# Builds mkernel and runs every test suite. GPU tests skip (with the reason printed)
# on machines without a GPU. Usage: scripts/test.sh [build-dir]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
"$root/scripts/install_deps.sh"
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
cd "$build"
# Socket transport across two network namespaces (skips, saying why, where they cannot be made).
bash "$root/tests/fault/netns_test.sh" "$build/tests/mk_mp_tests"
jobs=$(nproc); [ "$jobs" -gt 4 ] && jobs=4
ctest --output-on-failure -j"$jobs" --timeout 600
