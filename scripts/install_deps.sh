#!/usr/bin/env bash
# Installs what the build needs on Debian/Ubuntu (as root, through apt-get) and
# checks for the CUDA toolkit, which apt cannot provide here.
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
command -v ccache >/dev/null || need+=(ccache)
command -v nm >/dev/null || need+=(binutils)
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
[ -f /usr/include/hwloc.h ] || need+=(libhwloc-dev)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "install_deps: installing ${need[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "install_deps: missing packages: ${need[*]} (run as root, or install them)" >&2
    exit 1
  fi
fi
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "install_deps: the CUDA toolkit (nvcc) is required: install CUDA 13 under /usr/local/cuda" >&2
  exit 1
fi
if [ -z "${NCCL_HOME:-}" ] && [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ]; then
  echo "install_deps: nccl.h not found: set NCCL_HOME or install the NCCL headers" >&2
  exit 1
fi
