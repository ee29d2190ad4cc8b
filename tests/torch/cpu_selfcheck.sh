#!/usr/bin/env bash
# Runs one tests/torch file on CPU with gloo through cpu_selfcheck.py (checks the harness, not
# mkernel), starting NPROC ranks by hand (no torchrun needed).
# usage: tests/torch/cpu_selfcheck.sh <test file> [nproc]   e.g. test_collectives.py 4
# PYTHON selects the interpreter (default python3; Debian's torch: PYTHON=/usr/bin/python3).
set -u -o pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 <test file> [nproc]" >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-python3}
n=${2:-4}
port=$((20000 + RANDOM % 20000))
pids=()
for r in $(seq 0 $((n - 1))); do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port PYTHONUNBUFFERED=1 timeout 300 "$PY" "$HERE/cpu_selfcheck.py" "$1" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
echo "cpu_selfcheck: $1 exit status $rc"
exit "$rc"
