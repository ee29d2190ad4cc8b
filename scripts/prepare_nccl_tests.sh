#!/usr/bin/env bash
# Builds NVIDIA/nccl-tests with mkernel's patches, for scripts/run_nccl_tests.sh: 0001
# (oversubscription, required) and 0002 (gemm_allreduce_perf, allgather_gemm_perf,
# gemm_reducescatter_perf for include/mkernel/fused.h; built when it applies, else a warning).
#
# usage: scripts/prepare_nccl_tests.sh [--mpi] <build-dir> [nccl-tests-source]
#   --mpi              (or MK_NT_MPI=1) also build with MPI=1 into <build-dir>/nccl-tests/bin-mpi,
#                      for the process layouts of run_nccl_tests.sh (MK_NT_PROCS); see below
#   nccl-tests-source  a pristine nccl-tests tree (default <repo>/.nccl-tests, git-ignored; see
#                      nccl-tests-patches/README.md for the commit and how to fetch it)
# Output (nothing is written into the source tree):
#   <build-dir>/nccl-tests/src        patched copy of the source
#   <build-dir>/nccl-tests/bin        *_perf binaries
#   <build-dir>/nccl-tests/nccl_home  include/ + lib/libnccl.so -> the real NCCL it links against
#   <build-dir>/nccl-tests/bin-mpi    with --mpi: the same binaries built with MPI=1 (one rank per
#                                     process under mpirun; patch 0001 maps every local rank to
#                                     GPU 0 with NCCL_TESTS_DEVICE_WRAP=1)
#   <build-dir>/nccl-tests/env.sh     MK_REAL_NCCL, MK_REAL_NCCL_DIR, NCCL_TESTS_BIN,
#                                     NCCL_TESTS_FUSED (1: the fused GEMM binaries were built),
#                                     NCCL_TESTS_BIN_MPI, NCCL_TESTS_MPIRUN, NCCL_TESTS_MPI_LIBDIR
#                                     (empty without an up-to-date MPI build)
# nccl-tests links -lnccl: it is linked against the real libnccl (PyTorch's pip package by
# default) and mkernel takes over at run time through LD_PRELOAD.
# environment:
#   MK_REAL_NCCL=/path/libnccl.so.2   the real library (default: searched, see find_real_nccl)
#   NCCL_HOME=<dir>                   alternative: include/nccl.h + lib/libnccl.so* of an install
#   CUDA_HOME=/usr/local/cuda         NVCC_GENCODE (default sm_90 only)  JOBS (default nproc)
#   MK_NT_MPI=1                       same as --mpi
#   MPI_HOME=<dir>                    with --mpi: include/mpi.h and lib/libmpi.so (or lib64) of an
#                                     MPI install, and bin/mpirun; default: asked from the mpicc in
#                                     PATH (Open MPI --showme:incdirs/libdirs, MPICH -show), e.g.
#                                     Ubuntu's openmpi-bin + libopenmpi-dev
set -u -o pipefail

die() {
  echo "prepare_nccl_tests: ERROR: $*" >&2
  exit 2
}

WANT_MPI=${MK_NT_MPI:-0}
args=()
for a in "$@"; do
  case $a in
    --mpi) WANT_MPI=1 ;;
    -*) die "unknown option $a (usage: $0 [--mpi] <build-dir> [nccl-tests-source])" ;;
    *) args+=("$a") ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"
[[ $WANT_MPI == 0 || $WANT_MPI == 1 ]] || die "MK_NT_MPI='$WANT_MPI' must be 0 or 1"
[[ $# -ge 1 && $# -le 2 ]] || die "usage: $0 [--mpi] <build-dir> [nccl-tests-source]"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$1" || die "cannot create build directory $1"
BUILD=$(cd "$1" && pwd)
SRC_IN=${2:-$REPO/.nccl-tests}
[[ -f $SRC_IN/src/common.cu && -f $SRC_IN/Makefile ]] ||
  die "no nccl-tests source at '$SRC_IN' (expected src/common.cu); fetch it as described in nccl-tests-patches/README.md"
SRC_IN=$(cd "$SRC_IN" && pwd)
PATCH=$REPO/nccl-tests-patches/0001-oversubscribe-gpus.patch
[[ -f $PATCH ]] || die "patch $PATCH missing"
FUSED_PATCH=$REPO/nccl-tests-patches/0002-fused-gemm-perf.patch
FUSED_HDR=$REPO/include/mkernel/fused.h
FUSED_BINS=(gemm_allreduce allgather_gemm gemm_reducescatter)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC_GENCODE=${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}
JOBS=${JOBS:-$(nproc)}
for tool in make patch python3 sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found in PATH"
done
[[ -x $CUDA_HOME/bin/nvcc ]] || die "nvcc not found at $CUDA_HOME/bin/nvcc (set CUDA_HOME)"

OUT=$BUILD/nccl-tests
mkdir -p "$OUT"

# ---- the real libnccl and a matching nccl.h --------------------------------------------------
find_real_nccl() {
  if [[ -n ${MK_REAL_NCCL:-} ]]; then
    [[ -f $MK_REAL_NCCL ]] || die "MK_REAL_NCCL=$MK_REAL_NCCL does not exist"
    realpath "$MK_REAL_NCCL"
    return
  fi
  local f
  if [[ -n ${NCCL_HOME:-} ]]; then
    for f in "$NCCL_HOME"/lib/libnccl.so.2 "$NCCL_HOME"/lib/libnccl.so "$NCCL_HOME"/lib64/libnccl.so*; do
      [[ -f $f ]] && { realpath "$f"; return; }
    done
  fi
  # PyTorch's pip package (nvidia-nccl-cu*), then the copy torch loads, then system locations.
  env -u LD_PRELOAD python3 - <<'EOF'
import glob, os, sys
cands = []
try:
    import nvidia.nccl as m
    dirs = list(getattr(m, "__path__", []))
    if getattr(m, "__file__", None):
        dirs.append(os.path.dirname(m.__file__))
    for d in dirs:
        cands += sorted(glob.glob(os.path.join(d, "lib", "libnccl.so*")))
except Exception:
    pass
try:
    import nvidia
    for d in nvidia.__path__:
        cands += sorted(glob.glob(os.path.join(d, "**", "libnccl.so*"), recursive=True))
except Exception:
    pass
if not cands:
    try:
        import torch  # noqa: F401  libtorch_cuda needs libnccl: take the one the loader chose
        with open("/proc/self/maps") as f:
            cands += [l.split()[-1] for l in f if "libnccl" in l]
    except Exception:
        pass
for pat in ("/usr/local/cuda/lib64/libnccl.so*", "/usr/lib/x86_64-linux-gnu/libnccl.so*",
            "/usr/lib64/libnccl.so*"):
    cands += sorted(glob.glob(pat))
for c in cands:
    if os.path.isfile(c) and "mkernel" not in os.path.basename(c):
        print(os.path.realpath(c))
        sys.exit(0)
sys.exit(1)
EOF
}

REAL_NCCL=$(find_real_nccl) || die "no real libnccl.so found: set MK_REAL_NCCL=/path/libnccl.so.2 (python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))')"
REAL_DIR=$(dirname "$REAL_NCCL")
LIB_VERSION=$(env -u LD_PRELOAD python3 -c "
import ctypes, sys
v = ctypes.c_int(0)
ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v))
print(v.value)" "$REAL_NCCL" 2>/dev/null) || LIB_VERSION=unknown

header_version() { sed -n 's/^#define NCCL_VERSION_CODE \([0-9]*\).*/\1/p' "$1/nccl.h" | head -1; }
INC=""
for d in ${NCCL_HOME:+"$NCCL_HOME/include"} "$REAL_DIR/../include" "$CUDA_HOME/include" /usr/include; do
  [[ -f $d/nccl.h ]] || continue
  v=$(header_version "$d")
  # NCCL >= 2.28 headers include nccl_device.h, which must sit next to nccl.h.
  if [[ -n $v && $v -ge 22800 && ! -f $d/nccl_device.h ]]; then
    echo "prepare_nccl_tests: skipping $d/nccl.h ($v): nccl_device.h missing next to it"
    continue
  fi
  INC=$(cd "$d" && pwd)
  break
done
[[ -n $INC ]] || die "no usable nccl.h found (set NCCL_HOME to a directory with include/nccl.h)"
HDR_VERSION=$(header_version "$INC")
echo "prepare_nccl_tests: real NCCL library $REAL_NCCL (version $LIB_VERSION)"
echo "prepare_nccl_tests: nccl.h from $INC (NCCL_VERSION_CODE $HDR_VERSION)"
if [[ $LIB_VERSION != unknown && ${LIB_VERSION:0:3} != "${HDR_VERSION:0:3}" ]]; then
  echo "prepare_nccl_tests: WARN header $HDR_VERSION and library $LIB_VERSION differ in major.minor"
fi

H=$OUT/nccl_home
rm -rf "$H"
mkdir -p "$H/lib"
ln -sfn "$INC" "$H/include"
ln -sf "$REAL_NCCL" "$H/lib/libnccl.so"
ln -sf "$REAL_NCCL" "$H/lib/libnccl.so.2"

# ---- patched copy of the source --------------------------------------------------------------
STAMP=$( (cd "$SRC_IN" && find . -type f ! -path './build/*' -print0 | sort -z |
  xargs -0 sha256sum; sha256sum <"$PATCH"; cat "$FUSED_PATCH" "$FUSED_HDR" 2>/dev/null | sha256sum
  echo "$REAL_NCCL $INC $NVCC_GENCODE") | sha256sum | cut -c1-16)
BIN=$OUT/bin
if [[ -f $OUT/stamp && $(cat "$OUT/stamp") == "$STAMP" && -x $BIN/all_reduce_perf &&
  -f $OUT/src/src/common.h ]]; then
  echo "prepare_nccl_tests: $BIN is up to date (stamp $STAMP)"
else
  rm -rf "$OUT/src" "$OUT/stamp" "$OUT/stamp-mpi"
  mkdir -p "$OUT/src"
  (cd "$SRC_IN" && tar --exclude=./build -cf - .) | tar -xf - -C "$OUT/src" ||
    die "copying $SRC_IN failed"
  (cd "$OUT/src" && patch -p1 --forward --batch <"$PATCH") ||
    die "the patch does not apply to $SRC_IN (see nccl-tests-patches/README.md for the commit)"
  FUSED=0
  if [[ ! -f $FUSED_PATCH || ! -f $FUSED_HDR ]]; then
    echo "prepare_nccl_tests: WARN $FUSED_PATCH or $FUSED_HDR missing: no fused GEMM tests"
  elif (cd "$OUT/src" && patch -p1 --forward --batch --dry-run <"$FUSED_PATCH" >/dev/null 2>&1); then
    (cd "$OUT/src" && patch -p1 --forward --batch <"$FUSED_PATCH") || die "$FUSED_PATCH failed"
    FUSED=1
  else
    echo "prepare_nccl_tests: WARN $FUSED_PATCH does not apply to $SRC_IN: building without" \
      "the fused GEMM tests (${FUSED_BINS[*]/%/_perf})"
  fi
  make_extra=()
  [[ $FUSED == 1 ]] && make_extra=("MKERNEL_HOME=$REPO")
  echo "prepare_nccl_tests: building nccl-tests in $BIN (make -j$JOBS, $NVCC_GENCODE)"
  t0=$SECONDS
  if ! make -C "$OUT/src" -j"$JOBS" MPI=0 CUDA_HOME="$CUDA_HOME" NCCL_HOME="$H" \
    NVCC_GENCODE="$NVCC_GENCODE" BUILDDIR="$BIN" "${make_extra[@]}" >"$OUT/build.log" 2>&1; then
    tail -n 40 "$OUT/build.log"
    die "nccl-tests build failed (full log: $OUT/build.log)"
  fi
  echo "prepare_nccl_tests: built in $((SECONDS - t0))s"
  echo "$STAMP" >"$OUT/stamp"
  echo "$FUSED" >"$OUT/fused"
fi
FUSED=$(cat "$OUT/fused" 2>/dev/null || echo 0)

missing=()
for b in all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter; do
  [[ -x $BIN/${b}_perf ]] || missing+=("${b}_perf")
done
if [[ $FUSED == 1 ]]; then
  for b in "${FUSED_BINS[@]}"; do [[ -x $BIN/${b}_perf ]] || missing+=("${b}_perf"); done
fi
[[ ${#missing[@]} -eq 0 ]] || die "missing binaries in $BIN: ${missing[*]}"
grep -q ncclTestsMapDevice "$OUT/src/src/common.h" || die "patched source lacks the device wrap"
make_extra=()
[[ $FUSED == 1 ]] && make_extra=("MKERNEL_HOME=$REPO")
NT_BINS=(all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter)
[[ $FUSED == 1 ]] && NT_BINS+=("${FUSED_BINS[@]}")

# ---- optional MPI=1 build (one rank per process, run_nccl_tests.sh MK_NT_PROCS) ---------------
# nccl-tests' src/Makefile adds -I$(MPI_HOME)/include and -L$(MPI_HOME)/lib{,64} -lmpi; the
# include and library folders of a distribution's MPI need not share a parent, so the MPI_HOME
# given to make is a folder of two links, <out>/mpi_home/{include,lib}.
find_mpi() { # sets MPI_INC MPI_LIB MPIRUN
  MPI_INC="" MPI_LIB="" MPIRUN=""
  local d incs libs show
  if [[ -n ${MPI_HOME:-} ]]; then
    [[ -f $MPI_HOME/include/mpi.h ]] || die "MPI_HOME=$MPI_HOME has no include/mpi.h"
    MPI_INC=$MPI_HOME/include
    for d in "$MPI_HOME/lib" "$MPI_HOME/lib64"; do
      [[ -e $d/libmpi.so ]] && { MPI_LIB=$d; break; }
    done
    [[ -n $MPI_LIB ]] || die "MPI_HOME=$MPI_HOME has neither lib/libmpi.so nor lib64/libmpi.so"
    MPIRUN=$MPI_HOME/bin/mpirun
    [[ -x $MPIRUN ]] || MPIRUN=$(command -v mpirun 2>/dev/null)
  else
    command -v mpicc >/dev/null 2>&1 || die "--mpi: no MPI found (mpicc is not in PATH and" \
      "MPI_HOME is not set). Install one (Ubuntu: apt-get install openmpi-bin libopenmpi-dev)" \
      "or set MPI_HOME=<dir with include/mpi.h and lib/libmpi.so>"
    if incs=$(mpicc --showme:incdirs 2>/dev/null) && libs=$(mpicc --showme:libdirs 2>/dev/null); then
      : # Open MPI
    elif show=$(mpicc -show 2>/dev/null); then # MPICH and derivatives
      incs=$(tr ' ' '\n' <<<"$show" | sed -n 's/^-I//p')
      libs=$(tr ' ' '\n' <<<"$show" | sed -n 's/^-L//p')
    else
      die "--mpi: $(command -v mpicc) answers neither --showme:incdirs (Open MPI) nor -show (MPICH): set MPI_HOME"
    fi
    # An empty list means the compiler's default folders.
    for d in $incs /usr/include; do
      [[ -f $d/mpi.h ]] && { MPI_INC=$d; break; }
    done
    for d in $libs /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib; do
      [[ -e $d/libmpi.so ]] && { MPI_LIB=$d; break; }
    done
    [[ -n $MPI_INC ]] || die "--mpi: no mpi.h in '$incs' (from mpicc): install the MPI development package or set MPI_HOME"
    [[ -n $MPI_LIB ]] || die "--mpi: no libmpi.so in '$libs' (from mpicc): install the MPI development package or set MPI_HOME"
    MPIRUN=$(dirname "$(command -v mpicc)")/mpirun
    [[ -x $MPIRUN ]] || MPIRUN=$(command -v mpirun 2>/dev/null)
  fi
  [[ -n $MPIRUN && -x $MPIRUN ]] || die "--mpi: mpirun not found next to the MPI in use ($MPI_LIB)"
  MPI_INC=$(cd "$MPI_INC" && pwd -P) MPI_LIB=$(cd "$MPI_LIB" && pwd -P)
}

BIN_MPI=$OUT/bin-mpi
MPI_OK=0
if [[ $WANT_MPI == 1 ]]; then
  find_mpi
  MPI_VERSION=$("$MPIRUN" --version 2>/dev/null | head -n 1)
  echo "prepare_nccl_tests: MPI: mpi.h in $MPI_INC, libmpi in $MPI_LIB, $MPIRUN (${MPI_VERSION:-version unknown})"
  MPI_STAMP="$STAMP mpi $MPI_INC $MPI_LIB"
  if [[ -f $OUT/stamp-mpi && $(cat "$OUT/stamp-mpi") == "$MPI_STAMP" && -x $BIN_MPI/all_reduce_perf ]]; then
    echo "prepare_nccl_tests: $BIN_MPI is up to date"
  else
    rm -rf "$BIN_MPI" "$OUT/stamp-mpi" "$OUT/mpi_home"
    mkdir -p "$OUT/mpi_home"
    ln -sfn "$MPI_INC" "$OUT/mpi_home/include"
    ln -sfn "$MPI_LIB" "$OUT/mpi_home/lib"
    echo "prepare_nccl_tests: building nccl-tests with MPI=1 in $BIN_MPI (make -j$JOBS)"
    t0=$SECONDS
    if ! make -C "$OUT/src" -j"$JOBS" MPI=1 MPI_HOME="$OUT/mpi_home" CUDA_HOME="$CUDA_HOME" \
      NCCL_HOME="$H" NVCC_GENCODE="$NVCC_GENCODE" BUILDDIR="$BIN_MPI" "${make_extra[@]}" \
      >"$OUT/build-mpi.log" 2>&1; then
      tail -n 40 "$OUT/build-mpi.log"
      die "nccl-tests MPI=1 build failed (full log: $OUT/build-mpi.log)"
    fi
    echo "prepare_nccl_tests: MPI build done in $((SECONDS - t0))s"
    # Without libmpi every process would run as its own one-rank job.
    if command -v readelf >/dev/null 2>&1; then
      readelf -d "$BIN_MPI/all_reduce_perf" | grep -q 'NEEDED.*libmpi' ||
        die "$BIN_MPI/all_reduce_perf does not link libmpi (see $OUT/build-mpi.log)"
    fi
    echo "$MPI_STAMP" >"$OUT/stamp-mpi"
    printf '%s\n' "$MPIRUN" "$MPI_LIB" >"$OUT/mpi-info"
  fi
  MPI_OK=1
elif [[ -f $OUT/stamp-mpi && $(cut -d' ' -f1 "$OUT/stamp-mpi") == "$STAMP" && -f $OUT/mpi-info ]]; then
  # Not asked for, but a build of the same sources is there: keep it in env.sh.
  { read -r MPIRUN && read -r MPI_LIB; } <"$OUT/mpi-info"
  MPI_OK=1
  echo "prepare_nccl_tests: keeping the up-to-date MPI build in $BIN_MPI"
fi
if [[ $MPI_OK == 1 ]]; then
  missing=()
  for b in "${NT_BINS[@]}"; do [[ -x $BIN_MPI/${b}_perf ]] || missing+=("${b}_perf"); done
  [[ ${#missing[@]} -eq 0 ]] || die "missing binaries in $BIN_MPI: ${missing[*]}"
else
  BIN_MPI="" MPIRUN="" MPI_LIB=""
fi

cat >"$OUT/env.sh" <<EOF
# Written by scripts/prepare_nccl_tests.sh; sourced by scripts/run_nccl_tests.sh.
MK_REAL_NCCL=$REAL_NCCL
MK_REAL_NCCL_DIR=$REAL_DIR
MK_REAL_NCCL_VERSION=$LIB_VERSION
NCCL_TESTS_HEADER_VERSION=$HDR_VERSION
NCCL_TESTS_BIN=$BIN
NCCL_TESTS_FUSED=$FUSED
NCCL_TESTS_CUDA_HOME=$CUDA_HOME
NCCL_TESTS_BIN_MPI=$BIN_MPI
NCCL_TESTS_MPIRUN=$MPIRUN
NCCL_TESTS_MPI_LIBDIR=$MPI_LIB
EOF
echo "prepare_nccl_tests: OK - binaries in $BIN, environment in $OUT/env.sh (fused GEMM tests:" \
  "$([[ $FUSED == 1 ]] && echo "${FUSED_BINS[*]/%/_perf}" || echo none))${BIN_MPI:+; MPI build in $BIN_MPI}"
