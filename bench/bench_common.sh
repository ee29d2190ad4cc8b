# Helpers shared by the process benchmarks against the real NCCL (bench/net_vs_nccl.sh,
# bench/fused_vs_nccl.sh); sourced, not run. The caller sets, before sourcing:
#   BENCH_TOOL  prefix of messages ("net_vs_nccl")
#   DRY         1 for --dry-run (missing files and libraries are warnings, nothing starts)
#   BUILD       the build directory (for <build>/nccl-tests/env.sh)
# and gets: die, say, check_file, find_real_nccl (sets NCCL, NCCL_VERSION), start_mps /
# stop_mps (traps EXIT, INT and TERM), bench_commit, bench_device.
# shellcheck shell=bash

die() {
  echo "$BENCH_TOOL: ERROR: $*" >&2
  exit 2
}
say() { echo "$BENCH_TOOL: $*" >&2; }

check_file() { # path, what, how to get it
  [[ -e $1 ]] && return 0
  if [[ $DRY == 1 ]]; then
    say "WARN (dry run) $2 not found at $1: $3"
    return 0
  fi
  die "$2 not found at $1: $3"
}

# ---- the real NCCL --------------------------------------------------------------------------
# MK_REAL_NCCL, else <build>/nccl-tests/env.sh's MK_REAL_NCCL, else the nvidia-nccl package.
# The driver scripts' common start: BUILD and OUT as absolute paths (OUT/runs, OUT/logs made),
# LIB and DRIVER (bench_<driver> of BUILD) checked, the tools they call present, GPU 0 unless
# CUDA_VISIBLE_DEVICES says otherwise. Args: build dir, output dir, driver target name.
bench_setup() {
  if [[ -d $1 ]]; then BUILD=$(cd "$1" && pwd); else BUILD=$1; fi
  mkdir -p "$2/runs" "$2/logs" || die "cannot create $2"
  OUT=$(cd "$2" && pwd)
  LIB=$BUILD/src/libmkernel.so
  DRIVER=$BUILD/bench/$3
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
  command -v python3 >/dev/null || die "python3 not found"
  command -v timeout >/dev/null || die "'timeout' not found"
  check_file "$LIB" "libmkernel.so" "build it: cmake --build $BUILD --target mkernel"
  check_file "$DRIVER" "the driver" "configure with -DMK_BUILD_BENCH=ON and build: cmake --build $BUILD --target $3"
}

find_nccl_path() {
  if [[ -n ${MK_REAL_NCCL:-} ]]; then
    echo "$MK_REAL_NCCL"
    return
  fi
  if [[ -f $BUILD/nccl-tests/env.sh ]]; then
    local v
    v=$(sed -n 's/^MK_REAL_NCCL=//p' "$BUILD/nccl-tests/env.sh" | head -1)
    [[ -n $v && -f $v ]] && {
      echo "$v"
      return
    }
  fi
  env -u LD_PRELOAD python3 - <<'EOF'
import glob, os, sys
try:
    import nvidia.nccl as m
    dirs = list(getattr(m, "__path__", []))
    if getattr(m, "__file__", None):
        dirs.append(os.path.dirname(m.__file__))
    for d in dirs:
        for f in sorted(glob.glob(os.path.join(d, "lib", "libnccl.so*"))):
            print(os.path.realpath(f))
            sys.exit(0)
except Exception:
    pass
sys.exit(1)
EOF
}

# Sets NCCL (the library's path) and NCCL_VERSION; warns unless it is 2.28.x.
find_real_nccl() {
  NCCL=$(find_nccl_path) || NCCL=""
  if [[ -z $NCCL || ! -f $NCCL ]]; then
    if [[ $DRY == 1 ]]; then
      say "WARN (dry run) no real libnccl.so found (set MK_REAL_NCCL, or pip install nvidia-nccl-cu12)"
      NCCL=${NCCL:-/path/to/nvidia/nccl/lib/libnccl.so.2}
    else
      die "no real libnccl.so found: set MK_REAL_NCCL=/path/libnccl.so.2 (python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' names the package; the library is in its lib/)"
    fi
  fi
  NCCL_VERSION=unknown
  if [[ $DRY == 0 ]]; then
    NCCL_VERSION=$(env -u LD_PRELOAD python3 -c "
import ctypes, sys
v = ctypes.c_int(0)
ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v))
print(v.value)" "$NCCL" 2>/dev/null) || NCCL_VERSION=unknown
    [[ $NCCL_VERSION == 228* ]] || say "WARN the real NCCL at $NCCL is version $NCCL_VERSION, not 2.28.x (the issue's figures are 2.28.9)"
  fi
}

# ---- CUDA MPS: every process of a run must reach the same daemon -----------------------------
# Uses a running daemon, else starts one in a temporary directory and stops it on exit.
MPS_STARTED=0
stop_mps() {
  if [[ $MPS_STARTED == 1 ]]; then
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 && say "MPS daemon stopped"
    MPS_STARTED=0
  fi
}
start_mps() {
  trap stop_mps EXIT
  trap 'stop_mps; exit 130' INT TERM
  [[ $DRY == 1 ]] && return 0
  command -v nvidia-cuda-mps-control >/dev/null || die "nvidia-cuda-mps-control not found: processes on one GPU need MPS to run their kernels concurrently"
  if [[ -n ${CUDA_MPS_PIPE_DIRECTORY:-} ]] && echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then
    say "using the running MPS daemon (CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY)"
  elif [[ -z ${CUDA_MPS_PIPE_DIRECTORY:-} ]] && echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then
    say "using the running MPS daemon (default pipe directory)"
  else
    local dir
    dir=$(mktemp -d "/tmp/mk-$BENCH_TOOL-mps.XXXXXX") || die "mktemp failed"
    export CUDA_MPS_PIPE_DIRECTORY=$dir/pipe CUDA_MPS_LOG_DIRECTORY=$dir/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d || die "could not start the MPS daemon (log: $CUDA_MPS_LOG_DIRECTORY)"
    MPS_STARTED=1
    say "started an MPS daemon (CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY)"
  fi
}

# ---- run metadata ---------------------------------------------------------------------------
# The commit measured: MK_BENCH_COMMIT, else <repo>/COMMIT_SNAP (a copied tree), else git
# (+dirty when src/, fused/ or bench/ differ from HEAD).
bench_commit() { # repo
  if [[ -n ${MK_BENCH_COMMIT:-} ]]; then
    echo "$MK_BENCH_COMMIT"
  elif [[ -f $1/COMMIT_SNAP ]]; then
    head -n 1 "$1/COMMIT_SNAP" | tr -d '[:space:]'
    echo " (COMMIT_SNAP)"
  else
    local c
    c=$(git -C "$1" rev-parse HEAD 2>/dev/null || echo unknown)
    git -C "$1" diff --quiet HEAD -- src fused bench 2>/dev/null || c="$c+dirty"
    echo "$c"
  fi
}
bench_device() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i "${CUDA_VISIBLE_DEVICES%%,*}" 2>/dev/null | head -1
}

# run_logged <name> <label> <json> <log> <seconds left> <kill after s> <failure grep> <cmd...>
# One driver run of a benchmark script: prints the command under DRY=1; skips (and records in
# FAILED) when under 30 s of the budget is left; otherwise runs it with its output in <log>
# and, on failure, records the log lines matching <failure grep> in FAILED. Returns its rc;
# RAN_LOGGED is 1 when the command did run.
run_logged() {
  local name=$1 label=$2 json=$3 log=$4 left=$5 kill=$6 pat=$7
  shift 7
  # shellcheck disable=SC2034  # read by the caller
  RAN_LOGGED=0
  if [[ $DRY == 1 ]]; then
    printf '%q ' "$@"
    echo
    return 0
  fi
  if ((left < 30)); then
    say "SKIP $name ($label): only ${left}s of the ${BUDGET}s budget left"
    FAILED+=("$name: skipped, budget exhausted")
    return 1
  fi
  rm -f "$json"
  say "run $name: $label"
  printf '%q ' "$@" >"$log"
  echo >>"$log"
  local t=$SECONDS
  # shellcheck disable=SC2034  # read by the caller
  RAN_LOGGED=1
  "$@" >>"$log" 2>&1
  local rc=$?
  say "  $name: rc=$rc in $((SECONDS - t))s (log $log)"
  if [[ $rc != 0 ]]; then
    local why
    why=$(grep -E "$pat" "$log" | head -n 6)
    [[ $rc == 124 || $rc == 137 ]] && why="killed after ${kill}s (timeout)
$why"
    say "  FAILED $name:"
    # shellcheck disable=SC2001  # indent every line
    echo "$why" | sed 's/^/      /' >&2
    FAILED+=("$name: rc=$rc: $(echo "$why" | head -n 1)")
  fi
  return $rc
}
