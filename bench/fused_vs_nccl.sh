#!/usr/bin/env bash
# Issue 12's fused benchmark, mode (b): 2 processes as 2 nodes on one GPU (under CUDA MPS).
#   mkernel  libmkernel.so with MKERNEL_EMULATE_NODES=2: ncclGemmAllReduce, ncclAllGatherGemm,
#            ncclGemmReduceScatter with algo auto, fused and sequential
#   NCCL     cuBLAS (cublasGemmEx, bf16, fp32 accumulation) + the real libnccl.so.2's
#            AllReduce / AllGather (before the GEMM) / ReduceScatter, every process its own
#            "host" (NCCL_HOSTID), NCCL_NET=Socket, NCCL_SOCKET_IFNAME=lo
# bench_fused_procs_bench forks one process per rank (each loads its library with dlopen),
# checks every element against a cuBLAS reference of the same inputs (every process
# regenerates every rank's operands from one seed), then times (median of reps, CUDA events,
# a barrier of the ranks between reps). Shapes (bench/fused_shapes.cuh): M 2048..32768 with
# N = K = 8192 (AR, RS), M = K, N = M/16 (AG), plus K (AR, RS) or N (AG) sharded by 8.
# The split each fused call chose comes from the library's log (NCCL_DEBUG=INFO
# NCCL_DEBUG_SUBSYS=FUSED: "fused: compute=C comm=S (source)"); no line means the call ran
# the sequential path. Target: NCCL time / mkernel (auto) time >= 1.0 at every shape.
#
# usage: bench/fused_vs_nccl.sh <build-dir> <out-dir> [--quick] [--dry-run]
#   <build-dir>  a build with -DMK_BUILD_BENCH=ON: src/libmkernel.so and
#                bench/bench_fused_procs_bench (cmake --build <dir> --target mkernel bench_fused_procs_bench)
#   <out-dir>    gets fused_vs_nccl.json, fused_vs_nccl.md, runs/*.json and logs/*.log
#   --quick      9 shapes (M 2048 and 8192), 3 reps (~1-2 minutes); default: 30 shapes, 5 reps
#   --shapes L   only the shapes of L ("ar:MxNxK,ag:MxNxK,rs:MxNxK,..."), 3 reps
#   --dry-run    print the environment and commands, run nothing (works without a GPU)
# environment: MK_REAL_NCCL=/path/libnccl.so.2 (default: <build>/nccl-tests/env.sh, then
#   python3 -c 'import nvidia.nccl'), MK_FVN_BUDGET=420 (seconds for both runs: no new shape
#   starts after a run's share, the rest is reported as not reached), CUDA_VISIBLE_DEVICES
#   (default 0), MKERNEL_FUSED_AUTO / MKERNEL_FUSED_COMM_SMS (passed through to mkernel and
#   recorded), MK_BENCH_COMMIT (the commit recorded; default COMMIT_SNAP, then git).
# Exit status: 0 both runs passed every check and the target is met at every shape; 3 the
# checks passed but the target is missed somewhere; 1 a run failed or an element mismatched;
# 2 usage/setup error.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_TOOL=fused_vs_nccl
# shellcheck source=bench/bench_common.sh
source "$REPO/bench/bench_common.sh"

[[ $# -ge 2 ]] || die "usage: $0 <build-dir> <out-dir> [--quick|--shapes L] [--dry-run]"
BUILD_IN=$1
OUT_IN=$2
shift 2
OPTS="$*"
DRY=0 QUICK=0 LIST=
while [[ $# -gt 0 ]]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --quick) QUICK=1 ;;
    --shapes)
      [[ $# -ge 2 ]] || die "--shapes needs a list"
      LIST=$2
      shift
      ;;
    *) die "unknown option $1" ;;
  esac
  shift
done
bench_setup "$BUILD_IN" "$OUT_IN" bench_fused_procs_bench
BUDGET=${MK_FVN_BUDGET:-420}
find_real_nccl
start_mps

if [[ -n $LIST ]]; then
  SHAPES=(--shapes "$LIST" --reps 3 --warmup 1)
elif [[ $QUICK == 1 ]]; then
  SHAPES=(--set quick --reps 3 --warmup 1)
else
  SHAPES=(--set full --reps 5 --warmup 1)
fi
COMMON_ENV=(NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0)
MK_ENV=(MKERNEL_EMULATE_NODES=2 MKERNEL_TIMEOUT_MS=60000 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=FUSED)
NC_ENV=(NCCL_NET=Socket NCCL_IB_DISABLE=1 NCCL_DEBUG=WARN)
# Variables that would change what is measured or where the log goes; unset for every run.
CLEAN=(-u LD_PRELOAD -u NCCL_HOSTID -u NCCL_NET -u MKERNEL_NET -u NCCL_NET_PLUGIN -u MKERNEL_SOCKET_NCONNS
  -u MKERNEL_SOCKET_INLINE -u NCCL_DEBUG_FILE -u NCCL_DEBUG_SUBSYS)

T0=$SECONDS
FAILED=()
# run <name> <label> <lib> <kind: mk|nccl> <share of the budget, %>
run() {
  local name=$1 label=$2 lib=$3 kind=$4 share=$5
  local left=$((BUDGET - (SECONDS - T0)))
  local json=$OUT/runs/$name.json log=$OUT/logs/$name.log
  local mine=$((BUDGET * share / 100))
  ((mine > left)) && mine=$left
  local envs=("${COMMON_ENV[@]}")
  local args=(--lib "$lib" --nprocs 2 --ranks-per-node 1 --label "$label" "${SHAPES[@]}" --out "$json")
  if [[ $kind == mk ]]; then
    envs+=("${MK_ENV[@]}")
    args+=(--variants "auto,fused,sequential")
  else
    envs+=("${NC_ENV[@]}")
    args+=(--variants cublas+coll --rank-env "NCCL_HOSTID=mkbench-host-%r")
  fi
  # No new shape after `mine` s; the ranks give up 90 s later (one shape of the full list takes
  # well under a minute), the process is killed 30 s after that.
  local stop=$((mine > 40 ? mine - 30 : 10))
  args+=(--budget-s "$stop" --timeout-s "$((mine + 60))")
  local cmd=(env "${CLEAN[@]}" "${envs[@]}" timeout -k 5 "$((mine + 100))" "$DRIVER" "${args[@]}")
  run_logged "$name" "$label (no new shape after ${stop}s)" "$json" "$log" "$left" \
    "$((mine + 100))" 'fused_procs_bench: rank|fused_procs_bench: [0-9]+ elements|NCCL WARN|mkernel WARN|error' "${cmd[@]}"
}

[[ $DRY == 1 ]] && {
  echo "# MPS: started by this script in a temp dir (CUDA_MPS_PIPE_DIRECTORY/CUDA_MPS_LOG_DIRECTORY) unless one runs"
  echo "# real NCCL: $NCCL"
  echo "# budget: ${BUDGET}s (NCCL run 35%, mkernel run the rest); report: bench/fused_vs_nccl_report.py"
}
# NCCL first and with the smaller share: mkernel's three variants take about three times as
# many calls.
run nccl "cuBLAS + NCCL, 2 hosts x 1 process (socket)" "$NCCL" nccl 35
run mk "mkernel fused calls, 2 virtual nodes x 1 process" "$LIB" mk 100
[[ $DRY == 1 ]] && exit 0
stop_mps

COMMIT=$(bench_commit "$REPO")
DEVICE=$(bench_device)
CMDLINE="$0 $BUILD_IN $OUT_IN $OPTS"
ENVREC="MKERNEL_FUSED_AUTO=${MKERNEL_FUSED_AUTO:-unset (0)} MKERNEL_FUSED_COMM_SMS=${MKERNEL_FUSED_COMM_SMS:-unset (-1)}"
python3 "$REPO/bench/fused_vs_nccl_report.py" "$OUT" "$COMMIT" "${DEVICE:-unknown}" "$CMDLINE" \
  "$NCCL" "$NCCL_VERSION" "$ENVREC" "${FAILED[@]+"${FAILED[@]}"}"
rc=$?
say "wrote $OUT/fused_vs_nccl.md and $OUT/fused_vs_nccl.json (rc=$rc; $((SECONDS - T0))s)"
exit $rc
