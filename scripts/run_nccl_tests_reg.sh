#!/usr/bin/env bash
# nccl-tests with registered buffers (docs/collectives.md, "Zero-copy: registered buffers and
# windows"): scripts/run_nccl_tests.sh once with "-R 1" (ncclCommRegister) and once with
# "-R 2" (ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC), each with its own log folder,
# then one line per run. By default the ranks are 4 communicators of one process (-g 4, or the
# MK_NT_THREADS layouts) on one GPU; with MK_NT_PROCS="4" they are 4 MPI processes of one rank
# each on GPU 0 under MPS (needs MK_NT_MPI=1 scripts/prepare_nccl_tests.sh <build-dir>):
#   MK_NT_PROCS=4 scripts/run_nccl_tests_reg.sh <build-dir>
# Every other MK_NT_* variable passes through (MK_NT_EXTRA is added after -R; MK_NT_DRY_RUN=1
# prints the commands, mpirun included, and runs nothing).
# With NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL the logs name the path of every
# collective ("algo zerocopy (window)", "(raw)" or "(mapped)").
#
# usage: scripts/run_nccl_tests_reg.sh <build-dir> [binary ...]
#   MK_NT_REG="1 2"   the -R values to run
# Exit status 0 only if every run passed.
set -u -o pipefail
[[ $# -ge 1 ]] || {
  echo "usage: $0 <build-dir> [binary ...]" >&2
  exit 2
}
BUILD=$1
shift
HERE=$(cd "$(dirname "$0")" && pwd)
REGS=${MK_NT_REG:-1 2}
LOGBASE=${MK_NT_LOGDIR:-$BUILD/nccl-tests/logs}
status=0
summary=()
for reg in $REGS; do
  [[ $reg == 1 || $reg == 2 ]] || {
    echo "run_nccl_tests_reg: MK_NT_REG: '$reg' is not 1 or 2" >&2
    exit 2
  }
  echo "==== nccl-tests -R $reg"
  MK_NT_LOGDIR=$LOGBASE/R$reg MK_NT_EXTRA="-R $reg ${MK_NT_EXTRA:-}" \
    bash "$HERE/run_nccl_tests.sh" "$BUILD" "$@"
  rc=$?
  summary+=("-R $reg: $([[ $rc == 0 ]] && echo PASS || echo "FAIL (exit $rc)"), logs in $LOGBASE/R$reg")
  [[ $rc == 0 ]] || status=1
done
echo
printf 'NCCL-TESTS-REG: %s\n' "${summary[@]}"
exit $status
