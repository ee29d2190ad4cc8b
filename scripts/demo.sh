#!/usr/bin/env bash
# Builds libmkernel and the demo, then runs it: a few ranks on the available GPUs
# (sharing them when there are fewer GPUs than ranks). Usage: scripts/demo.sh [nranks]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build"
"$root/scripts/install_deps.sh"
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target mkernel_demo
"$build/examples/mkernel_demo" "${1:-4}"
