#!/usr/bin/env bash
# Installs an already-built mkernel tree into a temporary prefix and builds and runs a C
# consumer against it twice: through find_package(mkernel) and through pkg-config. Then
# moves the prefix and does both again (the package files must not hard-code the prefix).
# Usage: run_install_test.sh <build-dir> [nccl include dir of the build] [C compiler]
#        [CMake generator for the consumer (the build's: a machine may have ninja, no make)]
# Nothing is compiled in mkernel itself: `cmake --install` copies the build's outputs.
set -euo pipefail
build="$(cd "${1:?usage: $0 <build-dir> [nccl-include-dir] [cc]}" && pwd)"
nccl_inc="${2:-}"
cc="${3:-${CC:-cc}}"
gen="${4:-}"
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/mk-install.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
# pkg-config is installed by scripts/install_deps.sh where a registry answers; on a machine
# without one (the GPU machines) the pkg-config half is skipped, saying so. CI must have it.
have_pc=1
if ! command -v pkg-config >/dev/null; then
  [ "${CI:-}" = true ] && fail "pkg-config is not installed (scripts/install_deps.sh installs it)"
  echo "SKIP: pkg-config half (pkg-config not installed)"
  have_pc=0
fi

prefix="$tmp/prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }

# --- what the prefix holds ---
lib="$(find "$prefix" -name libmkernel.so -path '*/lib*' -print -quit)"
[ -n "$lib" ] || fail "no libmkernel.so under $prefix"
libdir="$(dirname "$lib")"
libdir_rel="${libdir#"$prefix"/}"
soname="$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
[ "$soname" = libmkernel.so.0 ] || fail "SONAME of libmkernel.so is '$soname', want libmkernel.so.0"
[ -L "$lib" ] && [ -L "$libdir/$soname" ] || fail "libmkernel.so and $soname must be symbolic links"
real="$(readlink -f "$lib")"
[[ "$(basename "$real")" == libmkernel.so.0.* ]] || fail "libmkernel.so resolves to $real"
plugin="$libdir/libnccl-net-mkernel.so"
[ -f "$plugin" ] || fail "net plugin not installed at $plugin"
# (Symbol lists read whole: `nm | grep -q` fails under pipefail when grep exits first.)
plugin_syms="$(nm -D --defined-only "$plugin")"
lib_syms="$(nm -D --defined-only "$lib")"
grep -q ' ncclNetPlugin_v' <<<"$plugin_syms" || fail "$plugin exports no ncclNetPlugin_vN table"
grep -q ' ncclGetVersion$' <<<"$lib_syms" || fail "libmkernel.so does not export ncclGetVersion"
# Every public header, byte for byte; and the nccl.h the library was built against.
(cd "$here/../../include" && find mkernel -type f) | while read -r h; do
  cmp -s "$here/../../include/$h" "$prefix/include/$h" || fail "header $h not installed (or differs)"
done
nccl_copy="$prefix/include/mkernel/nccl"
[ -f "$nccl_copy/nccl.h" ] && [ -f "$nccl_copy/nccl_device.h" ] || fail "nccl.h/nccl_device.h not installed under $nccl_copy"
if [ -n "$nccl_inc" ]; then
  cmp -s "$nccl_inc/nccl.h" "$nccl_copy/nccl.h" || fail "installed nccl.h differs from $nccl_inc/nccl.h"
fi
[ -f "$libdir/cmake/mkernel/mkernelConfig.cmake" ] && [ -f "$libdir/cmake/mkernel/mkernelConfigVersion.cmake" ] ||
  fail "no CMake package files under $libdir/cmake/mkernel"
[ -f "$libdir/pkgconfig/mkernel.pc" ] || fail "no $libdir/pkgconfig/mkernel.pc"
echo "install: $prefix ($libdir_rel): libmkernel.so -> $(basename "$real"), plugin, headers, package files"

build_and_run() {  # $1: prefix, $2: tag
  local p="$1" tag="$2" ld="$1/$libdir_rel" out
  # find_package(mkernel)
  out="$tmp/cmake-$tag"
  cmake ${gen:+-G "$gen"} -S "$here/consumer" -B "$out" -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$p" \
    -DCMAKE_BUILD_TYPE=Release >"$out.log" 2>&1 || { cat "$out.log"; fail "[$tag] consumer configure (find_package)"; }
  grep -q "mkernel .* from $p/" "$out.log" || { cat "$out.log"; fail "[$tag] find_package found another mkernel"; }
  cmake --build "$out" >>"$out.log" 2>&1 || { cat "$out.log"; fail "[$tag] consumer build (find_package)"; }
  "$out/mk_consumer" "$ld" || fail "[$tag] consumer (find_package) failed"
  # pkg-config and a plain compiler
  if [ "$have_pc" = 0 ]; then
    echo "[$tag] find_package consumer: ok (pkg-config consumer skipped)"
    return 0
  fi
  local cflags libs ver
  cflags="$(PKG_CONFIG_PATH="$ld/pkgconfig" pkg-config --cflags mkernel)" || fail "[$tag] pkg-config --cflags"
  libs="$(PKG_CONFIG_PATH="$ld/pkgconfig" pkg-config --libs mkernel)" || fail "[$tag] pkg-config --libs"
  ver="$(PKG_CONFIG_PATH="$ld/pkgconfig" pkg-config --modversion mkernel)"
  [[ "$cflags $libs" == *"$p/"* ]] || fail "[$tag] pkg-config flags do not point into $p: $cflags $libs"
  # shellcheck disable=SC2086  # the flags are word lists
  "$cc" -Wall -Wextra -Werror -DMK_PACKAGE_VERSION="\"$ver\"" $cflags "$here/consumer/main.c" \
    -o "$tmp/pc-$tag" $libs -ldl -Wl,-rpath,"$ld" || fail "[$tag] consumer build (pkg-config)"
  "$tmp/pc-$tag" "$ld" || fail "[$tag] consumer (pkg-config) failed"
  echo "[$tag] find_package and pkg-config consumers: ok"
}

build_and_run "$prefix" installed
mv "$prefix" "$tmp/moved"
build_and_run "$tmp/moved" moved
echo "install test: ok"
