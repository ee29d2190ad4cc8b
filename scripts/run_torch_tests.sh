#!/usr/bin/env bash
# Runs the PyTorch tests of tests/torch with LD_PRELOAD=<build>/src/libmkernel.so: torchrun
# starts MK_TORCH_NPROC (default 4) ranks that all share GPU LOCAL_RANK % device_count (one GPU:
# cuda:0), under a CUDA MPS daemon that this script starts if none is running (and stops again).
# Builds nothing. Prints PASS/FAIL per test and a summary table; exit status 0 only if all pass.
#
# usage: scripts/run_torch_tests.sh <build-dir> [test ...]
#   tests: ld_bindings collectives p2p ddp cuda_graph comm_init comm_init_scalable
#          comm_init_nonblocking comm_init_register_hook comm_init_lazy
#          fused_gemm fused_gemm_vnodes (python/mkernel; 2 virtual nodes)
#          ring_attention ring_attention_vnodes (python/mkernel ring_attention; 2 virtual nodes)
#          fused_moe (python/mkernel MoE calls; ranks in separate processes take the
#          AllToAll path of fused/ops/moe, the layer with [N,K] weights its fused kernel)
#                                                             (default: all)
# environment:
#   MK_TORCH_NPROC=4        ranks per test            MK_TORCH_TIMEOUT=300  seconds per test
#   MK_TORCH_BUDGET=540     seconds for all tests: later tests get what is left, and are
#                           reported as FAIL "budget exhausted" once less than 30 s remain
#   MK_TORCH_MPS=1          0: do not touch MPS (ranks then time-slice the GPU: slow but correct)
#   MK_TORCH_LOGDIR=<build>/torch-test-logs          MK_TORCH_SEED  input seed (see mk_common.py)
#   CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log (defaults)
set -u -o pipefail

die() {
  echo "run_torch_tests: ERROR: $*" >&2
  exit 2
}

[[ $# -ge 1 ]] || die "usage: $0 <build-dir> [test ...]"
[[ -d $1 ]] || die "build directory '$1' does not exist"
BUILD=$(cd "$1" && pwd)
shift
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TESTDIR=$REPO/tests/torch
LIB=$BUILD/src/libmkernel.so
[[ -f $LIB ]] || die "$LIB not found: build the library first (cmake --build $BUILD)"
LIB=$(realpath "$LIB")
missing=$(ldd "$LIB" 2>/dev/null | grep "not found")
[[ -z $missing ]] || die "$LIB has unresolved dependencies:
$missing"
preload_err=$(LD_PRELOAD=$LIB /bin/true 2>&1)
[[ $preload_err != *"cannot be preloaded"* ]] || die "LD_PRELOAD=$LIB does not load: $preload_err"

NPROC=${MK_TORCH_NPROC:-4}
TIMEOUT=${MK_TORCH_TIMEOUT:-300}
BUDGET=${MK_TORCH_BUDGET:-540}
USE_MPS=${MK_TORCH_MPS:-1}
LOGDIR=${MK_TORCH_LOGDIR:-$BUILD/torch-test-logs}
mkdir -p "$LOGDIR" || die "cannot create $LOGDIR"
LOGDIR=$(cd "$LOGDIR" && pwd)

need=(python3 torchrun timeout)
[[ $USE_MPS == 1 ]] && need+=(nvidia-cuda-mps-control)
for tool in "${need[@]}"; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    [[ $tool == nvidia-cuda-mps-control ]] &&
      die "'$tool' not found in PATH (install the CUDA MPS tools, or set MK_TORCH_MPS=0)"
    die "'$tool' not found in PATH"
  fi
done
python3 - <<'EOF' || die "PyTorch with CUDA is not usable from python3 (see the error above)"
import torch, torch.distributed as dist
assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
assert dist.is_nccl_available(), "this torch has no NCCL backend"
print("run_torch_tests: torch %s, CUDA %s, %d GPU(s), GPU0 = %s" % (
    torch.__version__, torch.version.cuda, torch.cuda.device_count(),
    torch.cuda.get_device_name(0)))
EOF

# ---- CUDA MPS -------------------------------------------------------------------------------
MPS_STARTED=0
MPS_STATE=off
stop_mps() {
  if [[ $MPS_STARTED == 1 ]]; then
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 &&
      echo "run_torch_tests: stopped the MPS daemon we started"
    MPS_STARTED=0
  fi
}
trap stop_mps EXIT
trap 'exit 130' INT TERM

mps_running() { echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; }
cuda_smoke() {
  timeout 120 python3 -c "import torch; x = torch.ones(4, device='cuda'); torch.cuda.synchronize(); assert float(x.sum()) == 4.0" >/dev/null 2>&1
}
if [[ $USE_MPS == 1 ]]; then
  export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/mps-pipe}
  export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/mps-log}
  MPS_STATE="on ($CUDA_MPS_PIPE_DIRECTORY)"
  if mps_running; then
    echo "run_torch_tests: MPS daemon already running (pipe dir $CUDA_MPS_PIPE_DIRECTORY)"
  else
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
      MPS_STARTED=1
      sleep 1
      echo "run_torch_tests: started the MPS daemon (pipe dir $CUDA_MPS_PIPE_DIRECTORY)"
    else
      echo "run_torch_tests: WARN could not start the MPS daemon; ranks will time-slice the GPU"
    fi
  fi
  if ! cuda_smoke; then
    echo "run_torch_tests: WARN a CUDA client fails under MPS (see $CUDA_MPS_LOG_DIRECTORY);" \
      "continuing without MPS"
    stop_mps
    unset CUDA_MPS_PIPE_DIRECTORY
    MPS_STATE="off (failed)"
    cuda_smoke || die "CUDA does not work from python3 even without MPS"
  fi
else
  echo "run_torch_tests: MK_TORCH_MPS=0: not using MPS (ranks time-slice the GPU)"
fi

# ---- tests ----------------------------------------------------------------------------------
# name | script | extra environment
TESTS=(
  "ld_bindings|nccl_binding_probe.py|"
  "collectives|test_collectives.py|"
  "p2p|test_p2p.py|"
  "ddp|test_ddp.py|"
  "cuda_graph|test_cuda_graph.py|"
  "comm_init|test_comm_init.py|"
  "comm_init_scalable|test_comm_init.py|TORCH_NCCL_RANKS_PER_ROOT=1 MK_TORCH_VARIANT=scalable_init"
  "comm_init_nonblocking|test_comm_init.py|TORCH_NCCL_USE_COMM_NONBLOCKING=1 MK_TORCH_VARIANT=nonblocking"
  "comm_init_register_hook|test_comm_init.py|TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 MK_TORCH_VARIANT=register_hook"
  "comm_init_lazy|test_comm_init.py|MK_TORCH_EAGER=0 MK_TORCH_VARIANT=lazy_init"
  "fused_gemm|test_fused_gemm.py|"
  "fused_gemm_vnodes|test_fused_gemm.py|MKERNEL_EMULATE_NODES=2 MK_TORCH_VARIANT=vnodes_2x2"
  "ring_attention|test_ring_attention.py|"
  "ring_attention_vnodes|test_ring_attention.py|MKERNEL_EMULATE_NODES=2 MK_TORCH_VARIANT=vnodes_2x2"
  "fused_moe|test_moe.py|"
  "fused_moe_vnodes|test_moe.py|MKERNEL_EMULATE_NODES=2 MK_TORCH_VARIANT=vnodes_2x2"
)
SELECTED=("$@")
# Tests run only when named (none now; fused_moe left this list with the MoE AllToAll path).
OPT_IN=" "
selected() {
  [[ ${#SELECTED[@]} -eq 0 && $OPT_IN != *" $1 "* ]] && return 0
  local s
  for s in "${SELECTED[@]}"; do [[ $s == "$1" ]] && return 0; done
  return 1
}

PIDDIR=$(mktemp -d /tmp/mk_torch_pids.XXXXXX)
kill_leftovers() {
  local f pid
  for f in "$PIDDIR"/*; do
    [[ -e $f ]] || continue
    pid=$(basename "$f")
    if kill -0 "$pid" 2>/dev/null; then
      echo "run_torch_tests: WARN killing leftover worker pid $pid"
      kill -9 "$pid" 2>/dev/null
    fi
    rm -f "$f"
  done
}

declare -a R_NAME R_RES R_TIME R_NOTE
run_test() {
  local name=$1 script=$2 extra=$3
  local log=$LOGDIR/$name.log
  local -a envs=()
  [[ -n $extra ]] && read -r -a envs <<<"$extra"
  local left=$((BUDGET - (SECONDS - T_START)))
  if ((left < 30)); then
    echo
    echo "FAIL $name: not run, the ${BUDGET}s budget is exhausted (MK_TORCH_BUDGET)"
    R_NAME+=("$name") R_RES+=(FAIL) R_TIME+=(0) R_NOTE+=("not run: budget exhausted")
    return
  fi
  local limit=$((left < TIMEOUT ? left : TIMEOUT))
  local -a cmd=(timeout -k 15 "$limit" env "${envs[@]}" "LD_PRELOAD=$LIB" PYTHONUNBUFFERED=1
    "MK_TORCH_PIDDIR=$PIDDIR" torchrun --standalone "--nproc-per-node=$NPROC" "$TESTDIR/$script")
  echo
  echo "==== $name: ${extra:+$extra }LD_PRELOAD=$LIB torchrun --nproc-per-node=$NPROC tests/torch/$script"
  local t0=$SECONDS rc
  if [[ $name == ld_bindings ]]; then
    # Dynamic-linker proof: LD_BIND_NOW resolves every imported symbol at load time; only the
    # ld.so lines about nccl symbols / libnccl / libmkernel (and Python errors) are kept.
    local filtered=$LOGDIR/$name.ld_debug.txt
    LD_DEBUG=files,bindings LD_BIND_NOW=1 "${cmd[@]}" 2>&1 >"$log" |
      grep -a -E "symbol \`p?nccl|file=[^ ]*(libnccl|libmkernel)|Traceback|Error|error:|File \"" \
        >"$filtered"
    rc=${PIPESTATUS[0]}
    if ! python3 "$TESTDIR/check_ld_bindings.py" "$filtered" >>"$log" 2>&1; then
      [[ $rc == 0 ]] && rc=1
    fi
  else
    "${cmd[@]}" >"$log" 2>&1
    rc=$?
  fi
  kill_leftovers
  local dt=$((SECONDS - t0)) res note
  if [[ $rc == 124 || $rc == 137 ]]; then
    res=FAIL note="timeout after ${limit}s"
  elif [[ $rc != 0 ]]; then
    res=FAIL note="exit status $rc"
  elif ! grep -q "^MK_RESULT .* PASS" "$log"; then
    res=FAIL note="no MK_RESULT PASS line"
  else
    res=PASS note=$(grep "^MK_RESULT" "$log" | head -1 | cut -d' ' -f4- | tr '\n' ' ')
  fi
  if [[ $name == ld_bindings ]]; then
    grep -E "^  |^FAIL|^ld_bindings" "$log" | head -60
    grep -q "^MK_RESULT ld_bindings PASS" "$log" || { res=FAIL; note="ld bindings: see log"; }
  fi
  grep -E "^FAIL|^SKIP" "$log" | head -25
  grep -E "^MK_RESULT" "$log"
  if [[ $res == FAIL ]]; then
    echo "---- last 40 lines of $log"
    tail -n 40 "$log"
    echo "----"
  fi
  echo "$res $name (${dt}s) $note"
  R_NAME+=("$name") R_RES+=("$res") R_TIME+=("$dt") R_NOTE+=("$note")
}

for s in "${SELECTED[@]}"; do
  found=0
  for entry in "${TESTS[@]}"; do [[ ${entry%%|*} == "$s" ]] && found=1; done
  [[ $found == 1 ]] || die "unknown test '$s'"
done
T_START=$SECONDS
for entry in "${TESTS[@]}"; do
  IFS='|' read -r name script extra <<<"$entry"
  selected "$name" && run_test "$name" "$script" "$extra"
done
rmdir "$PIDDIR" 2>/dev/null

# ---- summary --------------------------------------------------------------------------------
npass=0 nfail=0
echo
echo "==== PyTorch tests: LD_PRELOAD=$LIB, $NPROC ranks, MPS $MPS_STATE, logs in $LOGDIR"
printf "%-26s %-5s %6s  %s\n" test result time note
for i in "${!R_NAME[@]}"; do
  printf "%-26s %-5s %5ss  %s\n" "${R_NAME[$i]}" "${R_RES[$i]}" "${R_TIME[$i]}" "${R_NOTE[$i]}"
  if [[ ${R_RES[$i]} == PASS ]]; then npass=$((npass + 1)); else nfail=$((nfail + 1)); fi
done
echo "TORCH TESTS: $npass passed, $nfail failed"
[[ $nfail == 0 && $npass -gt 0 ]]
