#!/usr/bin/env bash
# Issue 10 frozen-commit proof, part 1: README test command from a fresh tree, then nccl-tests eager.
set -u
R=$(pwd); L=$OUT/logs1; mkdir -p $L; t0=$(date +%s)
el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 430 bash scripts/test.sh > $L/test.log 2>&1; echo "test.sh rc=$? at $(el)s"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|netns" $L/test.log | head -20
cp build/Testing/Temporary/LastTest.log $L/ 2>/dev/null
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]|tests ran" $L/LastTest.log | tail -14
tar -czf $OUT/logs1.tgz -C $OUT logs1
timeout 60 bash scripts/prepare_nccl_tests.sh build .nccl-tests > $L/nt-prepare.log 2>&1; echo "prepare rc=$? at $(el)s"; tail -3 $L/nt-prepare.log
left=$(( 575 - $(el) ))
MK_NT_MODES=0 MK_NT_BUDGET=$left MK_NT_MAXBYTES=4M MK_NT_ITERS="-n 2 -w 1" MK_NT_GEMM_SIZES="-b 1M -e 16M -f 4" \
  bash scripts/run_nccl_tests.sh build > $L/nt-eager.log 2>&1; echo "nccl-tests eager rc=$? at $(el)s"
tail -22 $L/nt-eager.log
tar -czf $OUT/logs1.tgz -C $OUT logs1
