#!/usr/bin/env bash
# Installs what the build needs on Debian/Ubuntu (as root, through apt-get) and checks
# for the CUDA toolkit, which apt cannot provide here. Optional tools (ccache) are
# installed when a package registry answers and skipped otherwise: a machine with no
# registry (the GPU machines) must still build with what it has.
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
command -v nm >/dev/null || need+=(binutils)
command -v python3 >/dev/null || need+=(python3)  # ctest runs the Python package's and docs' checks
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
[ -f /usr/include/hwloc.h ] || need+=(libhwloc-dev)
[ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ] || need+=(libgtest-dev)
optional=()
command -v ccache >/dev/null || optional+=(ccache)
command -v pkg-config >/dev/null || optional+=(pkg-config)  # the install test's pkg-config half

apt_install() {  # returns non-zero when there is no apt, no root or no registry
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 1
  timeout 120 apt-get update -qq >/dev/null 2>&1 || return 1
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "$@" >/dev/null 2>&1
}

if [ ${#need[@]} -gt 0 ]; then
  echo "install_deps: installing ${need[*]}"
  if ! apt_install "${need[@]}" ${optional[@]+"${optional[@]}"}; then
    echo "install_deps: missing required packages: ${need[*]} (apt-get could not install them:" \
      "run as root on Debian/Ubuntu with a reachable package registry, or install them by hand)" >&2
    exit 1
  fi
elif [ ${#optional[@]} -gt 0 ]; then
  apt_install "${optional[@]}" || echo "install_deps: optional ${optional[*]} not installed (no registry or not root); building without it"
fi
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "install_deps: the CUDA toolkit (nvcc) is required: install CUDA 13 under /usr/local/cuda" >&2
  exit 1
fi
# nccl.h is located (and its version checked) by cmake/deps.cmake, which says what it found.
