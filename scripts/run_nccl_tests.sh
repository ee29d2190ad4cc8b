#!/usr/bin/env bash
# Runs the patched nccl-tests with LD_PRELOAD=<build>/src/libmkernel.so, 4 ranks ("-g 4": one
# process, one thread, 4 communicators) on one GPU (NCCL_TESTS_DEVICE_WRAP=1), every data type
# and every reduction op, first eagerly and then captured in a CUDA graph (-G 1). Checks every
# result ("-c 1"), parses "#wrong" per row and "Out of bounds values", prints a summary table.
# Exit status 0 only if every binary ran, produced rows, and reported 0 wrong values.
# When prepare_nccl_tests.sh built them (patch 0002), the fused GEMM binaries run too:
# gemm_allreduce_perf, allgather_gemm_perf, gemm_reducescatter_perf with one rank per thread
# ("-t N -g 1": fused calls are refused inside the group that -g N uses), half and bfloat16,
# -c 1 (exact reference check, in place too), NCCL_TESTS_GEMM_N/K (default 2048 here).
#
# usage: scripts/run_nccl_tests.sh <build-dir> [binary ...]
#   needs scripts/prepare_nccl_tests.sh <build-dir> first (binaries in <build-dir>/nccl-tests)
# environment:
#   MK_NT_NGPUS=4              ranks (-g)               MK_NT_MAXBYTES=64M   -e
#   MK_NT_ITERS="-n 10 -w 2"   iterations / warm-up     MK_NT_TIMEOUT=150    seconds per run
#   MK_NT_MODES="0 1"          values of -G to run (0: eager, 1: CUDA graph)
#   MK_NT_THREADS="2x1 4x1 2x2"  instead of -g MK_NT_NGPUS, run each layout TxG: "-t T -g G"
#                              (T threads of one process, each driving G ranks in a group,
#                              every rank on the GPU through NCCL_TESTS_DEVICE_WRAP=1; the
#                              host rendezvous of docs/collectives.md, "One thread per rank").
#                              Fused binaries run only in layouts with G = 1 (SKIP otherwise).
#   MK_NT_PROCS="4"            process layouts: each value P runs every binary as P MPI
#                              processes of one rank each ("mpirun -np P <bin> -t 1 -g 1"), all
#                              on GPU 0 (NCCL_TESTS_DEVICE_WRAP=1), under CUDA MPS. Needs the MPI
#                              build (prepare_nccl_tests.sh --mpi, or MK_NT_MPI=1) and Open MPI's
#                              mpirun. Only these layouts run unless MK_NT_THREADS is set too.
#   MK_NT_MPS=1                with MK_NT_PROCS: use the MPS daemon that answers, else start one
#                              for the run (temp pipe/log dirs) and stop it at exit; 0: leave MPS
#                              alone (processes then time-slice the GPU: ms per wait)
#   MK_NT_MPIRUN_FLAGS         replaces the transport flags given to mpirun (default for Open MPI
#                              4: "--mca pml ob1 --mca btl self,vader --mca
#                              btl_vader_single_copy_mechanism none"; 5: "--mca pml ob1 --mca
#                              btl self,sm")
#   MK_NT_DRY_RUN=1            print every command (mpirun included) and run nothing; works
#                              without a GPU, a built library or nccl-tests (missing ones warn)
#   MK_NT_EXTRA=""             more nccl-tests flags    CUDA_VISIBLE_DEVICES (default 0: one GPU)
#   MK_NT_BUDGET=540           seconds for all runs: later runs get what is left, and are
#                              reported as FAIL "budget exhausted" once less than 15 s remain
#   MK_NT_LOGDIR=<build>/nccl-tests/logs
#   MK_NT_GEMM_SIZES="-b 16M -e 256M -f 4"   sweep of the fused GEMM binaries (sizes map to M)
#   NCCL_TESTS_GEMM_N/K/M/LAYOUT/ALGO/COMM_SMS  passed through (see nccl-tests-patches/README.md)
set -u -o pipefail

die() {
  echo "run_nccl_tests: ERROR: $*" >&2
  exit 2
}

DRY=${MK_NT_DRY_RUN:-0}
[[ $DRY == 0 || $DRY == 1 ]] || die "MK_NT_DRY_RUN='$DRY' must be 0 or 1"
# A missing prerequisite stops a real run; a dry run only warns and prints the commands.
need() {
  if [[ $DRY == 1 ]]; then
    echo "run_nccl_tests: WARN (dry run) $*" >&2
  else
    die "$@"
  fi
}

[[ $# -ge 1 ]] || die "usage: $0 <build-dir> [binary ...]"
[[ -d $1 ]] || die "build directory '$1' does not exist"
BUILD=$(cd "$1" && pwd)
shift
LIB=$BUILD/src/libmkernel.so
if [[ ! -f $LIB ]]; then
  need "$LIB not found: build the library first (cmake --build $BUILD)"
else
  LIB=$(realpath "$LIB")
  missing=$(ldd "$LIB" 2>/dev/null | grep "not found")
  [[ -z $missing ]] || need "$LIB has unresolved dependencies:
$missing"
  preload_err=$(LD_PRELOAD=$LIB /bin/true 2>&1)
  [[ $preload_err != *"cannot be preloaded"* ]] || need "LD_PRELOAD=$LIB does not load: $preload_err"
fi
ENVF=$BUILD/nccl-tests/env.sh
if [[ -f $ENVF ]]; then
  # shellcheck source=/dev/null
  source "$ENVF"
else
  need "$ENVF not found: run scripts/prepare_nccl_tests.sh $BUILD first"
  MK_REAL_NCCL_DIR=${MK_REAL_NCCL_DIR:-$BUILD/nccl-tests/nccl_home/lib}
  NCCL_TESTS_BIN=$BUILD/nccl-tests/bin NCCL_TESTS_BIN_MPI=$BUILD/nccl-tests/bin-mpi
  NCCL_TESTS_MPIRUN=$(command -v mpirun 2>/dev/null || echo mpirun)
fi
for v in MK_REAL_NCCL_DIR NCCL_TESTS_BIN; do
  [[ -n ${!v:-} ]] || die "$ENVF does not set $v: rerun scripts/prepare_nccl_tests.sh"
done
command -v timeout >/dev/null 2>&1 || die "'timeout' not found in PATH"
command -v python3 >/dev/null 2>&1 || die "'python3' not found in PATH"

NGPUS=${MK_NT_NGPUS:-4}
MAXBYTES=${MK_NT_MAXBYTES:-64M}
ITERS=${MK_NT_ITERS:--n 10 -w 2}
TIMEOUT=${MK_NT_TIMEOUT:-150}
BUDGET=${MK_NT_BUDGET:-540}
MODES=${MK_NT_MODES:-0 1}
THREADS=${MK_NT_THREADS:-}
PROCS=${MK_NT_PROCS:-}
USE_MPS=${MK_NT_MPS:-1}
EXTRA=${MK_NT_EXTRA:-}
LOGDIR=${MK_NT_LOGDIR:-$BUILD/nccl-tests/logs}
read -r -a ITER_FLAGS <<<"$ITERS"
# Layouts "TxG" (threads x ranks per thread) and "npP" (P processes); without MK_NT_THREADS
# and MK_NT_PROCS one thread drives NGPUS.
LAYOUTS=()
for p in $PROCS; do
  [[ $p =~ ^[1-9][0-9]*$ ]] || die "MK_NT_PROCS: '$p' is not a process count (e.g. 4 or \"2 4\")"
  LAYOUTS+=("np$p")
done
[[ -z ${PROCS// /} || ${#LAYOUTS[@]} -gt 0 ]] || die "MK_NT_PROCS is set but names no process count"
if [[ -n $THREADS ]]; then
  for l in $THREADS; do
    [[ $l =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || die "MK_NT_THREADS: '$l' is not of the form TxG (e.g. 2x1 4x1 2x2)"
    LAYOUTS+=("$l")
  done
  ((${#LAYOUTS[@]} > 0)) || die "MK_NT_THREADS is set but names no layout"
elif [[ -z $PROCS ]]; then
  [[ $NGPUS =~ ^[1-9][0-9]*$ ]] || die "MK_NT_NGPUS='$NGPUS' is not a positive number"
  LAYOUTS=("1x$NGPUS")
fi
read -r -a EXTRA_FLAGS <<<"$EXTRA"
mkdir -p "$LOGDIR" || die "cannot create $LOGDIR"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
# libnccl.so.2 (a DT_NEEDED of the binaries, shadowed by the preloaded libmkernel) and libcudart.
export LD_LIBRARY_PATH=$MK_REAL_NCCL_DIR:${NCCL_TESTS_CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

BINARIES=(all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf
  alltoall_perf sendrecv_perf gather_perf scatter_perf)
FUSED_BINARIES=(gemm_allreduce_perf allgather_gemm_perf gemm_reducescatter_perf)
[[ ${NCCL_TESTS_FUSED:-0} == 1 ]] && BINARIES+=("${FUSED_BINARIES[@]}")
GEMM_SIZES=${MK_NT_GEMM_SIZES:--b 16M -e 256M -f 4}
read -r -a GEMM_SIZE_FLAGS <<<"$GEMM_SIZES"
export NCCL_TESTS_GEMM_N=${NCCL_TESTS_GEMM_N:-2048} NCCL_TESTS_GEMM_K=${NCCL_TESTS_GEMM_K:-2048}
is_fused() { [[ " ${FUSED_BINARIES[*]} " == *" $1 "* ]]; }
[[ $# -gt 0 ]] && BINARIES=("$@")
for b in "${BINARIES[@]}"; do
  [[ -x $NCCL_TESTS_BIN/$b ]] || need "$NCCL_TESTS_BIN/$b missing (rerun prepare_nccl_tests.sh)"
done

# ---- process layouts: mpirun, MPS, leftovers -------------------------------------------------
HAS_PROCS=0
[[ -n $PROCS ]] && HAS_PROCS=1
MPIRUN=${NCCL_TESTS_MPIRUN:-}
MPI_FLAGS=()
if [[ $HAS_PROCS == 1 ]]; then
  [[ $USE_MPS == 0 || $USE_MPS == 1 ]] || die "MK_NT_MPS='$USE_MPS' must be 0 or 1"
  [[ -n ${NCCL_TESTS_BIN_MPI:-} ]] ||
    need "MK_NT_PROCS needs the MPI build: run MK_NT_MPI=1 scripts/prepare_nccl_tests.sh $BUILD"
  NCCL_TESTS_BIN_MPI=${NCCL_TESTS_BIN_MPI:-$BUILD/nccl-tests/bin-mpi}
  for b in "${BINARIES[@]}"; do
    [[ -x $NCCL_TESTS_BIN_MPI/$b ]] || need "$NCCL_TESTS_BIN_MPI/$b missing (rerun MK_NT_MPI=1 prepare_nccl_tests.sh)"
  done
  [[ -n $MPIRUN ]] || MPIRUN=$(command -v mpirun 2>/dev/null)
  [[ -n $MPIRUN && -x $MPIRUN ]] || need "mpirun not found (env.sh: NCCL_TESTS_MPIRUN='${NCCL_TESTS_MPIRUN:-}')"
  MPIRUN=${MPIRUN:-mpirun}
  mpi_version=$("$MPIRUN" --version 2>/dev/null | head -n 1)
  # The ranks only exchange the unique id and small results through MPI: shared memory is
  # enough, and it keeps UCX/verbs from probing NICs. No CMA single copy: containers often
  # forbid the ptrace it needs.
  if [[ -n ${MK_NT_MPIRUN_FLAGS+x} ]]; then
    read -r -a MPI_FLAGS <<<"$MK_NT_MPIRUN_FLAGS"
  elif [[ $mpi_version =~ Open\ MPI\)\ 4\. || $DRY == 1 && -z $mpi_version ]]; then
    MPI_FLAGS=(--mca pml ob1 --mca btl "self,vader" --mca btl_vader_single_copy_mechanism none)
  elif [[ $mpi_version =~ Open\ MPI\)\ [5-9]\. ]]; then
    MPI_FLAGS=(--mca pml ob1 --mca btl "self,sm")
  else
    need "MK_NT_PROCS needs Open MPI's mpirun; $MPIRUN says '${mpi_version:-nothing}' (set MK_NT_MPIRUN_FLAGS to try anyway)"
  fi
  [[ -n ${NCCL_TESTS_MPI_LIBDIR:-} ]] && LD_LIBRARY_PATH=$NCCL_TESTS_MPI_LIBDIR:$LD_LIBRARY_PATH
fi

# Every process of a run carries MK_NT_RUN_ID=<tag>: a timeout kills mpirun, and ranks that
# outlive it (stuck in a CUDA call, or ignoring SIGTERM) are found by that tag and killed by PID.
reap_run() {
  python3 - "$1" <<'EOF'
import os, signal, sys
tag = ("MK_NT_RUN_ID=" + sys.argv[1]).encode()
left = []
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) == os.getpid():
        continue
    try:
        with open("/proc/%s/environ" % p, "rb") as f:
            if tag in f.read().split(b"\0"):
                left.append(int(p))
    except OSError:
        pass
for p in left:
    try:
        os.kill(p, signal.SIGKILL)
    except OSError:
        pass
if left:
    print("run_nccl_tests: killed %d leftover rank process(es): %s" % (len(left), " ".join(map(str, left))))
EOF
}

MPS_STARTED=0 MPS_DIR="" CUR_RUN=""
mps_ctl() { echo "$1" | timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1; }
cleanup() {
  [[ -n $CUR_RUN ]] && reap_run "$CUR_RUN"
  CUR_RUN=""
  if [[ $MPS_STARTED == 1 ]]; then
    mps_ctl quit && echo "run_nccl_tests: MPS daemon stopped"
    MPS_STARTED=0
    rm -rf "$MPS_DIR"
  fi
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM
# Processes sharing a GPU without MPS time-slice it: every cross-process wait costs a slice.
if [[ $HAS_PROCS == 1 && $USE_MPS == 1 && $DRY == 0 ]]; then
  command -v nvidia-cuda-mps-control >/dev/null 2>&1 ||
    die "nvidia-cuda-mps-control not found: MK_NT_PROCS needs MPS (or MK_NT_MPS=0 to run time-sliced)"
  if mps_ctl get_server_list; then
    echo "run_nccl_tests: using the running MPS daemon (CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-default})"
  else
    MPS_DIR=$(mktemp -d /tmp/mk-nt-mps.XXXXXX) || die "mktemp failed"
    export CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR/pipe CUDA_MPS_LOG_DIRECTORY=$MPS_DIR/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    timeout 30 nvidia-cuda-mps-control -d ||
      die "could not start the MPS daemon (log: $CUDA_MPS_LOG_DIRECTORY)"
    MPS_STARTED=1
    echo "run_nccl_tests: started an MPS daemon (CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY)"
  fi
fi
# What the ranks of mpirun get (-x): mpirun itself runs without the preload.
mpi_env_flags() { # run tag
  local v
  MPI_X=(-x "LD_PRELOAD=$LIB" -x NCCL_TESTS_DEVICE_WRAP=1 -x "MK_NT_RUN_ID=$1" -x LD_LIBRARY_PATH
    -x CUDA_VISIBLE_DEVICES)
  for v in $(compgen -e); do
    case $v in
      NCCL_TESTS_DEVICE_WRAP | MK_NT_RUN_ID) ;;
      MKERNEL_* | NCCL_* | CUDA_MPS_* | CUDA_MODULE_LOADING | CUDA_LAUNCH_BLOCKING) MPI_X+=(-x "$v") ;;
    esac
  done
}

# Parses one nccl-tests log: data rows, rows with #wrong != 0, "Out of bounds values", the
# average bus bandwidth and the best busbw of the largest size. Prints one line:
# rows|wrong_rows|oob|avg_busbw|busbw@size|first failure message|first wrong row
parse_log() {
  python3 - "$1" "$2" <<'EOF'
import re, sys
rows = wrong_rows = 0
oob = avg = None
best = {}  # size -> best busbw (out-of-place, in-place)
failure = ""
first_wrong = ""
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"#\s*Out of bounds values\s*:\s*(\d+)", line)
    if m:
        oob = int(m.group(1))
        continue
    m = re.match(r"#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+|nan|inf)", line)
    if m:
        avg = m.group(1)
        continue
    if ("Test NCCL failure" in line or "Test CUDA failure" in line or "Test failure" in line) \
            and not failure:
        failure = line.strip()[:200]
    if line.startswith("#") or not line.strip():
        continue
    f = line.split()
    if len(f) < 13 or not f[0].isdigit():
        continue
    rows += 1
    # nccl-tests prints N/A where it does not check: the in-place column of alltoall_perf
    # and sendrecv_perf (reportErrors = !in_place there). The out-of-place column must always
    # be a checked 0; an N/A in-place column is accepted only for those two binaries.
    def num(x):
        try:
            return float(x)
        except ValueError:
            return None
    w1, w2 = num(f[8]), num(f[12])
    na_ok = sys.argv[2] in ("alltoall_perf", "sendrecv_perf")
    if w2 is None and na_ok:
        w2 = 0.0
    if not (w1 == 0 and w2 == 0):
        wrong_rows += 1
        if not first_wrong:
            first_wrong = "size=%s type=%s op=%s root=%s wrong=%s/%s" % (f[0], f[2], f[3], f[4],
                                                                          f[8], f[12])
    try:
        size, bw = int(f[0]), max(float(f[7]), float(f[11]))
        best[size] = max(best.get(size, 0.0), bw)
    except ValueError:
        pass
top = max(best) if best else 0
clean = lambda t: t.replace("|", "/").replace("\n", " ")
print("|".join([str(rows), str(wrong_rows), "none" if oob is None else str(oob), avg or "none",
                "%.1f@%dB" % (best.get(top, 0.0), top), clean(failure), clean(first_wrong)]))
EOF
}

echo "run_nccl_tests: LD_PRELOAD=$LIB"
echo "run_nccl_tests: binaries $NCCL_TESTS_BIN (real NCCL ${MK_REAL_NCCL:-?} v${MK_REAL_NCCL_VERSION:-?} only satisfies the link)"
echo "run_nccl_tests: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES NCCL_TESTS_DEVICE_WRAP=1 layouts (TxG: -t T -g G in one process; npP: mpirun -np P, -t 1 -g 1) ${LAYOUTS[*]} -b 8 -e $MAXBYTES -f 4 -c 1 -d all -o all $ITERS $EXTRA"
[[ $HAS_PROCS == 1 ]] && echo "run_nccl_tests: MPI binaries $NCCL_TESTS_BIN_MPI, $MPIRUN (${mpi_version:-version unknown}), MPS $([[ $USE_MPS == 1 ]] && echo on || echo "left alone (MK_NT_MPS=0)")"
declare -a S_BIN S_LAYOUT S_MODE S_RES S_ROWS S_WRONG S_OOB S_AVG S_TOP S_TIME S_NOTE
T_START=$SECONDS
for layout in "${LAYOUTS[@]}"; do
 if [[ $layout == np* ]]; then
   NP=${layout#np} NT=1 NG=1
   desc="-np $NP -t 1 -g 1" tag="_np$NP"
 else
   NP=0 NT=${layout%x*} NG=${layout#*x}
   # Without MK_NT_THREADS the log names stay as they were (one layout).
   desc="-t $NT -g $NG" tag=""
   [[ -n $THREADS ]] && tag="_t${NT}g${NG}"
 fi
 for mode in $MODES; do
  for b in "${BINARIES[@]}"; do
    log=$LOGDIR/${b}${tag}_G${mode}.log
    left=$((BUDGET - (SECONDS - T_START)))
    if is_fused "$b" && [[ -n $THREADS ]] && ((NG > 1)); then
      # nccl-tests wraps a thread's G ranks in ncclGroupStart/End, where fused calls are refused.
      echo "SKIP $b $desc -G $mode: fused calls are not allowed inside a group (-g > 1)"
      S_BIN+=("$b") S_LAYOUT+=("$layout") S_MODE+=("$mode") S_RES+=(SKIP) S_ROWS+=(-)
      S_WRONG+=(-) S_OOB+=(-) S_AVG+=(-) S_TOP+=(-) S_TIME+=(0) S_NOTE+=("fused: -g > 1")
      continue
    fi
    if ((left < 15)); then
      echo "FAIL $b $desc -G $mode: not run, the ${BUDGET}s budget is exhausted (MK_NT_BUDGET)"
      S_BIN+=("$b") S_LAYOUT+=("$layout") S_MODE+=("$mode") S_RES+=(FAIL) S_ROWS+=(-)
      S_WRONG+=(-) S_OOB+=(-) S_AVG+=(-) S_TOP+=(-) S_TIME+=(0) S_NOTE+=("not run: budget exhausted")
      continue
    fi
    limit=$((left < TIMEOUT ? left : TIMEOUT))
    args=(-b 8 -e "$MAXBYTES" -f 4 -t "$NT" -g "$NG" -c 1 -d all -o all -G "$mode"
      "${ITER_FLAGS[@]}" "${EXTRA_FLAGS[@]}")
    if is_fused "$b"; then
      # One rank per thread or process: without MK_NT_THREADS, NGPUS threads (see the header).
      ft=$NT
      [[ -z $THREADS && $NP == 0 ]] && ft=$NG
      args=("${GEMM_SIZE_FLAGS[@]}" -t "$ft" -g 1 -c 1 -d all -G "$mode" "${ITER_FLAGS[@]}"
        "${EXTRA_FLAGS[@]}")
    fi
    run_id=""
    if ((NP > 0)); then
      run_id="nt$$.$b.np$NP.G$mode"
      mpi_env_flags "$run_id"
      cmd=(timeout -k 10 "$limit" env -u LD_PRELOAD "$MPIRUN" -np "$NP" --allow-run-as-root
        --oversubscribe --bind-to none "${MPI_FLAGS[@]}" "${MPI_X[@]}" "$NCCL_TESTS_BIN_MPI/$b"
        "${args[@]}")
    else
      cmd=(timeout -k 10 "$limit" env NCCL_TESTS_DEVICE_WRAP=1 "LD_PRELOAD=$LIB"
        "$NCCL_TESTS_BIN/$b" "${args[@]}")
    fi
    echo
    echo "==== $b $desc -G $mode$(is_fused "$b" && echo " (N=$NCCL_TESTS_GEMM_N K=$NCCL_TESTS_GEMM_K; algbw column = TFLOP/s per rank)")"
    if [[ $DRY == 1 ]]; then
      printf '%q ' "${cmd[@]}"
      printf '>%q 2>&1\n' "$log"
      S_BIN+=("$b") S_LAYOUT+=("$layout") S_MODE+=("$mode") S_RES+=(DRY) S_ROWS+=(-)
      S_WRONG+=(-) S_OOB+=(-) S_AVG+=(-) S_TOP+=(-) S_TIME+=(0) S_NOTE+=("dry run")
      continue
    fi
    t0=$SECONDS
    CUR_RUN=$run_id
    "${cmd[@]}" >"$log" 2>&1
    rc=$?
    [[ -n $run_id ]] && reap_run "$run_id" | tee -a "$log"
    CUR_RUN=""
    dt=$((SECONDS - t0))
    IFS='|' read -r rows wrong oob avg top failure firstw <<<"$(parse_log "$log" "$b")"
    res=PASS note=""
    if [[ $rc == 124 || $rc == 137 ]]; then
      res=FAIL note="timeout after ${limit}s"
    elif [[ $rc != 0 ]]; then
      res=FAIL note="exit status $rc${failure:+: $failure}"
    fi
    if [[ ${rows:-0} == 0 ]]; then
      res=FAIL note="${note:+$note; }no result rows"
    fi
    if [[ ${wrong:-0} != 0 ]]; then
      res=FAIL note="${note:+$note; }$wrong row(s) with wrong values, first: $firstw"
    fi
    if [[ $oob == none ]]; then
      [[ $res == PASS ]] && res=FAIL note="no 'Out of bounds values' line: the run did not finish"
    elif [[ $oob != 0 ]]; then
      res=FAIL note="${note:+$note; }Out of bounds values: $oob"
    fi
    grep -E "^# (Out of bounds|Avg bus)" "$log"
    if [[ $res == FAIL ]]; then
      echo "---- last 25 lines of $log"
      tail -n 25 "$log"
      echo "----"
    fi
    echo "$res $b $desc -G $mode (${dt}s): rows=$rows wrong_rows=$wrong oob=$oob avg_busbw=$avg ${note}"
    S_BIN+=("$b") S_LAYOUT+=("$layout") S_MODE+=("$mode") S_RES+=("$res") S_ROWS+=("$rows")
    S_WRONG+=("$wrong") S_OOB+=("$oob") S_AVG+=("$avg") S_TOP+=("$top") S_TIME+=("$dt")
    S_NOTE+=("$note")
  done
 done
done

npass=0 nfail=0 nskip=0
echo
echo "==== nccl-tests under mkernel: layouts ${LAYOUTS[*]} on CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES, -d all -o all, -e $MAXBYTES, $((SECONDS - T_START))s total, logs in $LOGDIR"
printf "%-20s %-6s %-6s %-5s %5s %7s %5s %10s %18s %6s  %s\n" binary layout mode result rows \
  wrong oob "avg busbw" "busbw@max size" time note
for i in "${!S_BIN[@]}"; do
  mode=eager
  [[ ${S_MODE[$i]} != 0 ]] && mode=graph
  printf "%-20s %-6s %-6s %-5s %5s %7s %5s %10s %18s %5ss  %s\n" "${S_BIN[$i]}" "${S_LAYOUT[$i]}" \
    "$mode" "${S_RES[$i]}" "${S_ROWS[$i]}" "${S_WRONG[$i]}" "${S_OOB[$i]}" "${S_AVG[$i]}" \
    "${S_TOP[$i]}" "${S_TIME[$i]}" "${S_NOTE[$i]}"
  case ${S_RES[$i]} in
    PASS) npass=$((npass + 1)) ;;
    SKIP | DRY) nskip=$((nskip + 1)) ;;
    *) nfail=$((nfail + 1)) ;;
  esac
done
echo "NCCL-TESTS: $npass passed, $nfail failed, $nskip skipped (wrong = rows whose #wrong is not 0; busbw in GB/s)"
[[ $DRY == 1 ]] && exit 0
[[ $nfail == 0 && $npass -gt 0 ]]
