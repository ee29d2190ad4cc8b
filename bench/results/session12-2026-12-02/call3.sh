#!/usr/bin/env bash
# Session 12 call 3: the README test command at the merged final commit, then nccl-tests with
# two threads of two ranks each (-t 2 -g 2) for the binaries session 10 did not reach.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs3; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs3.tgz -C $OUT logs3; }
echo "commit $(cat COMMIT_SNAP)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 440 bash scripts/test.sh > $L/test.log 2>&1; echo "test.sh rc=$? at $(el)s"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" $L/test.log | head -20
cp build/Testing/Temporary/LastTest.log $L/ 2>/dev/null; gzip -f $L/LastTest.log
zcat $L/LastTest.log.gz | grep -E "^\[  (PASSED|FAILED) |FAILED  \]" | tail -14; tarup
timeout 60 bash scripts/prepare_nccl_tests.sh build .nccl-tests > $L/nt-prepare.log 2>&1; echo "prepare rc=$? at $(el)s"
left=$(( 575 - $(el) ))
[ $left -gt 40 ] && MK_NT_THREADS="2x2" MK_NT_MODES=0 MK_NT_BUDGET=$left MK_NT_MAXBYTES=1M MK_NT_ITERS="-n 2 -w 1" \
  bash scripts/run_nccl_tests.sh build reduce_scatter_perf broadcast_perf reduce_perf alltoall_perf sendrecv_perf gather_perf scatter_perf > $L/nt-2x2.log 2>&1; echo "nccl-tests 2x2 rc=$? at $(el)s"
tail -12 $L/nt-2x2.log; tarup
