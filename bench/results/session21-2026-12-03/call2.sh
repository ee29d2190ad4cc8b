#!/usr/bin/env bash
# Session 21 call 2 (fresh snapshot): the README test command whole (scripts/test.sh, no
# filter: the stream-K GEMM tests included), then bench_gemm_bench --streamk on more shapes
# as time allows (call 1 measured stream-K at 8192x8192x{1024,2048,8192}).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs2; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs2.tgz -C $OUT logs2; }
echo "commit $(cat COMMIT_SNAP)"
timeout -k 5 565 bash scripts/test.sh > $L/test.log 2>&1; echo "test rc=$? at $(el)s"; tail -6 $L/test.log
cp build/Testing/Temporary/LastTest.log $L/ 2>/dev/null
grep -E "^\[  (PASSED|FAILED)  \]|^\[  FAILED  \] [A-Za-z]|mk_gpu_tests .*sec" $L/test.log $L/LastTest.log | head -20
gzip -f $L/LastTest.log $L/test.log; tarup
export LD_LIBRARY_PATH=build/src
left=$(( 592 - $(el) ))
[ $left -gt 8 ] && { timeout $left build/bench/bench_gemm_bench --streamk --reps 8 --shapes 8192x8192x1024,16384x8192x1024,8192x8192x4096,4096x4096x4096,16384x16384x2048,8192x8192x8192 --out $L/gemm_sk.json > $L/gemm_sk.log 2>&1; echo "gemm sk rc=$? at $(el)s"; grep -v "^|" $L/gemm_sk.log | head -16; }
tarup
