#!/usr/bin/env bash
# Copies the binaries of a finished build into a build-shaped folder (default .gpubin,
# git-ignored), stripped, so that a GPU machine can run them without building (the device
# tool carries at most 64 MiB). Run them there with MK_BUILD=.gpubin scripts/gpu_check.sh ...
# usage: scripts/pack_gpubin.sh <build-dir> [dest]
set -euo pipefail
src="$(cd "$1" && pwd)"
dst="${2:-$(cd "$(dirname "$0")/.." && pwd)/.gpubin}"
rm -rf "$dst"
mkdir -p "$dst"/{src,tests,bench,examples,plugin}
cp -a "$src"/src/libmkernel.so* "$dst/src/"
for f in tests/mk_gpu_tests tests/mk_comm_worker tests/mk_mp_tests tests/mk_unit_tests \
  bench/bench_coll_bench bench/bench_net_bench bench/bench_gemm_bench \
  examples/mkernel_demo plugin/libnccl-net-mkernel.so; do
  [ -f "$src/$f" ] && cp "$src/$f" "$dst/$f"
done
# The commit the binaries were built at (benchmarks record it: MK_BENCH_COMMIT).
root="$(cd "$(dirname "$0")/.." && pwd)"
c="$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
[ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ] && c="$c-dirty"
echo "$c" >"$dst/COMMIT"
find "$dst" -type f \( -name '*.so*' -o -perm -u+x \) -exec strip --strip-debug {} + 2>/dev/null || true
du -sh "$dst"
