#!/usr/bin/env bash
# Session 10 final call: the README test command (scripts/test.sh, every suite) from a fresh
# tree at the final commit, then nccl-tests with one thread per rank (-t 2x1 4x1 2x2, issue 11.2).
set -u
L=$OUT/logs; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs.tgz -C $OUT logs; }
echo "commit $(cat COMMIT_SNAP)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 420 bash scripts/test.sh > $L/test.log 2>&1; echo "test.sh rc=$? at $(el)s"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Total Test" $L/test.log | head -20
cp build/Testing/Temporary/LastTest.log $L/ 2>/dev/null
grep -E "FAILED  \]" $L/LastTest.log | head -20
echo "gtest passed total: $(grep -E '^\[  PASSED  \] [0-9]+ test' $L/LastTest.log | awk '{s+=$4} END {print s}')"
tarup
left=$(( 570 - $(el) )); echo "nccl-tests budget ${left}s"
if [ $left -gt 60 ]; then
  timeout 60 bash scripts/prepare_nccl_tests.sh build .nccl-tests > $L/nt-prepare.log 2>&1; echo "prepare rc=$? at $(el)s"; tail -2 $L/nt-prepare.log
  left=$(( 575 - $(el) ))
  MK_NT_THREADS="2x1 4x1 2x2" MK_NT_MODES=0 MK_NT_BUDGET=$left MK_NT_MAXBYTES=1M MK_NT_ITERS="-n 2 -w 1" MK_NT_GEMM_SIZES="-b 1M -e 4M -f 4" \
    bash scripts/run_nccl_tests.sh build > $L/nt-threads.log 2>&1; echo "nccl-tests threads rc=$? at $(el)s"
  tail -40 $L/nt-threads.log
fi
tarup
