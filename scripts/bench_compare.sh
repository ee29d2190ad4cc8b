#!/usr/bin/env bash
# Before/after benchmark comparison on one GPU machine (issue 10: "no regression beyond
# noise, same run, before/after binaries side by side").
#
#   scripts/bench_compare.sh [--dry-run] [--configure-only] [--no-build] BEFORE_SRC AFTER_SRC OUTDIR
#
# BEFORE_SRC, AFTER_SRC: source trees (git checkouts or `git archive` snapshots; a COMMIT_SNAP
# file at the top names the commit of a snapshot). Steps:
#  1. configure both trees (Release, Ninja) into <tree>/build-cmp and build only
#     bench_coll_bench, bench_gemm_bench and bench_net_bench, both builds at once (-j8 each).
#     AFTER is configured first; the nccl.h folder it picked is then given to BEFORE, so both
#     compile against the same header (older trees' lookup may find an older system header).
#  2. run each benchmark before, after, before, after (MK_CMP_ROUNDS rounds, default 2), each
#     run under `timeout`, so drift between rounds shows next to the before/after difference.
#  3. scripts/bench_compare.py merges the JSON files into OUTDIR/compare.md (medians, ratios,
#     round-to-round spread as the noise estimate, flags) and OUTDIR/compare.json; the raw JSON,
#     the console logs and the build logs go to OUTDIR/raw.tgz (OUTDIR gets 4 files in all).
# --dry-run prints the commands without running anything; --configure-only configures both
# trees, checks the target names and stops; --no-build reuses the binaries already built.
#
# Knobs (environment): MK_CMP_ROUNDS (2), MK_CMP_JOBS (8 per build), MK_CMP_BUILD_NAME
# (build-cmp), MK_CMP_BUILD_TIMEOUT (420 s for both builds), MK_CMP_COLL_ARGS,
# MK_CMP_GEMM_ARGS, MK_CMP_NET_ARGS (benchmark options, defaults below), MK_CMP_TIMEOUT_COLL,
# MK_CMP_TIMEOUT_GEMM, MK_CMP_TIMEOUT_NET (seconds per run), MK_CMP_FLAG_FACTOR and
# MK_CMP_FLAG_FLOOR (bench_compare.py --factor/--floor), MK_CMP_DEADLINE (560: seconds after
# the start by which runs are cut short or skipped, so the table is written inside a 10-minute
# device call), MK_CMP_BEFORE_INCLUDES (standard headers pre-included in BEFORE's build, see
# below; "" for none). NCCL_HOME is honoured by both trees' header lookup.
set -uo pipefail

usage() {
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

dry=0 build=1 configure_only=0
orig_args="$*"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --no-build) build=0 ;;
    --configure-only) configure_only=1 ;;
    -h | --help) usage 0 ;;
    --) shift; break ;;
    -*) echo "bench_compare: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
  shift
done
[ $# -eq 3 ] || usage
script_dir="$(cd "$(dirname "$0")" && pwd)"
invocation="scripts/bench_compare.sh $orig_args"
for v in MK_CMP_ROUNDS MK_CMP_JOBS MK_CMP_COLL_ARGS MK_CMP_GEMM_ARGS MK_CMP_NET_ARGS; do
  [ -n "${!v:-}" ] && invocation="$v='${!v}' $invocation"
done

abspath() { (cd "$1" 2>/dev/null && pwd -P); }
before="$(abspath "$1")" || { echo "bench_compare: no such folder: $1" >&2; exit 2; }
after="$(abspath "$2")" || { echo "bench_compare: no such folder: $2" >&2; exit 2; }
[ "$before" != "$after" ] || { echo "bench_compare: BEFORE_SRC and AFTER_SRC are the same folder" >&2; exit 2; }
for t in "$before" "$after"; do
  if [ ! -f "$t/CMakeLists.txt" ] || [ ! -f "$t/bench/CMakeLists.txt" ]; then
    echo "bench_compare: $t is not an mkernel source tree" >&2
    exit 2
  fi
done
outdir="$3"
if [ $dry = 0 ]; then
  mkdir -p "$outdir" || exit 2
  outdir="$(abspath "$outdir")"
fi

rounds="${MK_CMP_ROUNDS:-2}"
jobs="${MK_CMP_JOBS:-8}"
bname="${MK_CMP_BUILD_NAME:-build-cmp}"
targets=(bench_coll_bench bench_gemm_bench bench_net_bench)
# Reduced sweeps (see each benchmark's usage): coll 16 B .. 256 MiB by x4 (13 sizes x 5
# collectives, iterations by size) plus the one-rank latencies and the 256 MiB AllReduce, no
# real NCCL (same library on both sides, it would only cost time); GEMM the 7 default shapes,
# 40 interleaved reps (medians); net the --full sizes (4 bandwidth, 4 latency) with 50
# iterations and 500 ping-pongs (TCP loopback is the noisiest of the three).
coll_args="${MK_CMP_COLL_ARGS:---no-real-nccl -b 16 -e 256M -f 4 -w 10 --timeout 140}"
gemm_args="${MK_CMP_GEMM_ARGS:---reps 40}"
net_args="${MK_CMP_NET_ARGS:---full --iters 50 --lat-iters 500}"
# Trees before 21fc5ab relied on standard headers pulled in by others, which GCC 13's
# libstdc++ (the GPU machine's) no longer does; BEFORE is built with those headers
# pre-included (no effect on the code generated). MK_CMP_BEFORE_INCLUDES="" turns it off.
before_includes="${MK_CMP_BEFORE_INCLUDES-cstdint cstring string vector memory utility algorithm map functional atomic mutex thread chrono}"
force_inc=()
if [ -n "$before_includes" ]; then
  cxx_inc="" cu_inc=""
  for h in $before_includes; do
    cxx_inc+=" -include $h"
    cu_inc+=" --pre-include $h"
  done
  force_inc=(-DCMAKE_CXX_FLAGS="${cxx_inc# }" -DCMAKE_CUDA_FLAGS="${cu_inc# }")
fi
timeout_coll="${MK_CMP_TIMEOUT_COLL:-150}"
timeout_gemm="${MK_CMP_TIMEOUT_GEMM:-150}"
timeout_net="${MK_CMP_TIMEOUT_NET:-120}"
export PATH="/usr/local/cuda/bin:$PATH"

# Commit of a tree: its COMMIT_SNAP file, else git when the tree is the top of a checkout
# (a checkout copied without its current .git, as on the device machine, reports a stale
# commit: prefer COMMIT_SNAP there).
commit_of() {
  local t="$1" c top
  if [ -f "$t/COMMIT_SNAP" ]; then
    head -n 1 "$t/COMMIT_SNAP" | tr -d '[:space:]'
    return
  fi
  top="$(git -C "$t" rev-parse --show-toplevel 2>/dev/null)"
  if [ -n "$top" ] && [ "$(abspath "$top")" = "$t" ]; then
    c="$(git -C "$t" rev-parse --short HEAD 2>/dev/null)"
    [ -n "$(git -C "$t" status --porcelain --untracked-files=no 2>/dev/null)" ] && c="$c-dirty"
    echo "${c:-unknown} (from git)"
  else
    echo unknown
  fi
}
commit_before="$(commit_of "$before")"
commit_after="$(commit_of "$after")"
device="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
device="${device:-no GPU seen by nvidia-smi}"
echo "bench_compare: before $before ($commit_before)"
echo "bench_compare: after  $after ($commit_after)"
echo "bench_compare: device $device; out $outdir; rounds $rounds"
case "$commit_before $commit_after" in
  *"(from git)"*) echo "bench_compare: note: a commit was read from git; on a copied tree whose .git is stale it is wrong (add COMMIT_SNAP)" ;;
esac

work="$after/$bname/cmp-work"  # raw JSON and logs, packed into OUTDIR/raw.tgz at the end
t_start=$(date +%s)
# Runs are cut (timeout shortened, then skipped) so the whole script ends by this time and
# the table is still written: a device call ends at 10 minutes.
deadline=$((t_start + ${MK_CMP_DEADLINE:-560}))

show() { printf '+'; printf ' %q' "$@"; printf '\n'; }
# run LOG CMD...: prints the command; runs it (unless --dry-run) with output to LOG.
run() {
  local log="$1"; shift
  show "$@"
  [ $dry = 1 ] && return 0
  "$@" >"$log" 2>&1
}

configure() {  # configure SIDE TREE [extra cmake args...]
  local side="$1" t="$2"; shift 2
  run "$work/configure_$side.log" cmake -S "$t" -B "$t/$bname" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DMK_BUILD_TESTS=OFF -DMK_BUILD_BENCH=ON "$@"
}

check_targets() {  # the three targets must exist in TREE's build (names can change by commit)
  local t="$1" have missing=()
  [ $dry = 1 ] && { show cmake --build "$t/$bname" --target help; return 0; }
  have="$(cmake --build "$t/$bname" --target help 2>/dev/null)"
  for x in "${targets[@]}"; do
    grep -q "^$x\b" <<<"$have" || missing+=("$x")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "bench_compare: $t/$bname has no target ${missing[*]}; bench targets there:" >&2
    grep '^bench_' <<<"$have" >&2
    return 1
  fi
  echo "bench_compare: $t/$bname: targets ${targets[*]} present"
}

build_tree() {  # build SIDE TREE in the background; sets bg_pid
  local side="$1" t="$2" log="$work/build_$1.log"
  show timeout -k 10 "${MK_CMP_BUILD_TIMEOUT:-420}" cmake --build "$t/$bname" -j"$jobs" --target "${targets[@]}"
  bg_pid=""
  [ $dry = 1 ] && return 0
  timeout -k 10 "${MK_CMP_BUILD_TIMEOUT:-420}" cmake --build "$t/$bname" -j"$jobs" \
    --target "${targets[@]}" >"$log" 2>&1 &
  bg_pid=$!
}

# A build still running in the background when this script stops (a failed configure of the
# other tree, an interrupt) is ended with it; timeout signals its whole process group.
pid_after="" pid_before=""
# shellcheck disable=SC2317  # called by the trap
stop_builds() {
  for p in $pid_after $pid_before; do
    kill -0 "$p" 2>/dev/null && kill -TERM "$p" 2>/dev/null
  done
}
trap stop_builds EXIT

fail_log() {  # fail_log MESSAGE LOG: print the end of a log and stop
  echo "bench_compare: $1 (end of $2):" >&2
  tail -n 40 "$2" >&2
  exit 1
}

[ $dry = 1 ] || mkdir -p "$work" || exit 1
[ $dry = 1 ] || rm -f "$work"/*.json "$work"/run_*.log "$work/runs.tsv"

nccl_inc=""
if [ $build = 1 ] || [ $configure_only = 1 ]; then
  t0=$(date +%s)
  configure after "$after" || fail_log "configure of $after failed" "$work/configure_after.log"
  # The header AFTER's lookup chose ("-- nccl.h: DIR (NCCL_VERSION_CODE N)"), pinned for BEFORE.
  if [ $dry = 0 ]; then
    nccl_inc="$(sed -n 's/^-- nccl\.h: \(\/[^ ]*\) (.*/\1/p' "$work/configure_after.log" | tail -n 1)"
  fi
  pin=()
  if [ -n "$nccl_inc" ]; then
    pin=(-DMK_NCCL_INCLUDE_DIR:PATH="$nccl_inc")
  elif [ $dry = 1 ]; then
    pin=(-DMK_NCCL_INCLUDE_DIR:PATH="<nccl.h folder from the configure log of AFTER>")
  fi
  check_targets "$after" || exit 1
  if [ $configure_only = 0 ]; then
    build_tree after "$after"
    pid_after=$bg_pid
  fi
  configure before "$before" "${pin[@]}" "${force_inc[@]}" ||
    fail_log "configure of $before failed" "$work/configure_before.log"
  check_targets "$before" || exit 1
  if [ $configure_only = 1 ]; then
    echo "bench_compare: configure only: both trees configured ($(($(date +%s) - t0)) s), nccl.h ${nccl_inc:-?}"
    exit 0
  fi
  build_tree before "$before"
  pid_before=$bg_pid
  if [ $dry = 0 ]; then
    wait "$pid_after"; rc_a=$?; pid_after=""
    wait "$pid_before"; rc_b=$?; pid_before=""
    [ $rc_a = 0 ] || fail_log "build of $after failed (rc $rc_a)" "$work/build_after.log"
    [ $rc_b = 0 ] || fail_log "build of $before failed (rc $rc_b)" "$work/build_before.log"
    echo "bench_compare: both builds done in $(($(date +%s) - t0)) s (nccl.h ${nccl_inc:-default lookup})"
  fi
fi
t_built=$(date +%s)

if [ $dry = 0 ]; then
  for t in "$before" "$after"; do
    for x in "${targets[@]}"; do
      [ -x "$t/$bname/bench/$x" ] || { echo "bench_compare: missing $t/$bname/bench/$x (build first)" >&2; exit 1; }
    done
  done
  nvidia-smi -L >/dev/null 2>&1 || echo "bench_compare: warning: nvidia-smi sees no GPU; the runs will fail"
fi

# One run: bench side round. Output JSON and console log under $work; a line in runs.tsv.
one_run() {
  local b="$1" side="$2" r="$3" tree commit args to
  if [ "$side" = before ]; then tree="$before" commit="$commit_before"; else tree="$after" commit="$commit_after"; fi
  commit="${commit% (from git)}"
  case "$b" in
    coll) read -r -a args <<<"$coll_args"; to=$timeout_coll ;;
    gemm) read -r -a args <<<"$gemm_args"; args+=(--commit "$commit"); to=$timeout_gemm ;;
    net) read -r -a args <<<"$net_args"; args+=(--commit "$commit"); to=$timeout_net ;;
  esac
  local json="$work/${b}_${side}_r${r}.json" log="$work/run_${b}_${side}_r${r}.log"
  local t0 rc left
  t0=$(date +%s)
  left=$((deadline - t0 - 15))  # 15 s kept for the table and the tarball
  if [ $dry = 0 ] && [ $left -lt 20 ]; then
    printf '%s\t%s\t%s\t%s\t%s\n' "$b" "$side" "$r" -1 0 >>"$work/runs.tsv"
    echo "bench_compare: $b $side round $r: skipped (MK_CMP_DEADLINE reached)"
    return 0
  fi
  [ $dry = 0 ] && [ "$to" -gt $left ] && to=$left
  # coll_bench reads its commit from MK_BENCH_COMMIT (git would name the enclosing checkout).
  (cd "$work" 2>/dev/null || cd /tmp || exit 1
   run "$log" env MK_BENCH_COMMIT="$commit" timeout -k 10 "$to" \
     "$tree/$bname/bench/bench_${b}_bench" "${args[@]}" --out "$json")
  rc=$?
  [ $dry = 1 ] && return 0
  local dt=$(($(date +%s) - t0))
  printf '%s\t%s\t%s\t%s\t%s\n' "$b" "$side" "$r" "$rc" "$dt" >>"$work/runs.tsv"
  echo "bench_compare: $b $side round $r: rc=$rc ${dt}s$([ -f "$json" ] || echo ', no JSON')"
  [ $rc = 0 ] || tail -n 5 "$log" | sed 's/^/    /'
}

for b in coll gemm net; do
  for ((r = 1; r <= rounds; r++)); do
    one_run "$b" before "$r"
    one_run "$b" after "$r"
  done
done
t_ran=$(date +%s)

py=(python3 "$script_dir/bench_compare.py" --raw "$work" --out "$outdir/compare.md"
  --json "$outdir/compare.json" --command "$invocation"
  --before-commit "$commit_before" --after-commit "$commit_after" --device "$device"
  --note "wall time: build $((t_built - t_start)) s, runs $((t_ran - t_built)) s"
  --note "options: coll \`$coll_args\`; gemm \`$gemm_args\`; net \`$net_args\` (+ --out, --commit)"
  --note "builds: Release, $bname; nccl.h ${nccl_inc:-as found by each tree}; BEFORE with pre-included headers: ${before_includes:-none}")
[ -n "${MK_CMP_FLAG_FACTOR:-}" ] && py+=(--factor "$MK_CMP_FLAG_FACTOR")
[ -n "${MK_CMP_FLAG_FLOOR:-}" ] && py+=(--floor "$MK_CMP_FLAG_FLOOR")
show "${py[@]}"
show tar -czf "$outdir/raw.tgz" -C "$work" .
[ $dry = 1 ] && exit 0
"${py[@]}"
rc=$?
tar -czf "$outdir/raw.tgz" -C "$work" . || rc=1
echo "bench_compare: total $(($(date +%s) - t_start)) s; $outdir/compare.md"
exit $rc
