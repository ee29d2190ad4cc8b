#!/usr/bin/env bash
# Session 21 first call (same as session 20 callF) (fresh snapshot of the final main): both README set-up commands as
# written (scripts/demo.sh, then scripts/test.sh; the never-run stream-K GEMM tests left out
# through GTEST_FILTER and run alone after under a timeout), then bench_gemm_bench --streamk
# and coll_bench windows vs plain at 256 KiB-16 MiB (the zero-copy grid rule) as time allows.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsF; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsF.tgz -C $OUT logsF; }
echo "commit $(cat COMMIT_SNAP)"
timeout -k 5 240 bash scripts/demo.sh > $L/demo.log 2>&1; echo "demo rc=$? at $(el)s"; tail -8 $L/demo.log; tarup
left=$(( 500 - $(el) ))
GTEST_FILTER="-GemmStreamK.*" timeout -k 5 $left bash scripts/test.sh > $L/test.log 2>&1; echo "test rc=$? at $(el)s"; tail -16 $L/test.log
cp build/Testing/Temporary/LastTest.log $L/ 2>/dev/null
grep -E "^\[  (PASSED|FAILED)  \]|^\[  FAILED  \] [A-Za-z]" $L/LastTest.log | head -20
gzip -f $L/LastTest.log $L/test.log; tarup
export LD_LIBRARY_PATH=build/src
left=$(( 560 - $(el) )); [ $left -gt 60 ] && left=60
[ $left -gt 10 ] && { timeout -k 3 $left build/tests/mk_gpu_tests --gtest_filter='GemmStreamK.*' > $L/gtest_sk.log 2>&1; echo "streamK gtest rc=$? at $(el)s"; grep -E "^\[  (PASSED|FAILED)  \]|^\[  FAILED  \] [A-Za-z]|Failure" $L/gtest_sk.log | head -12; tarup; }
left=$(( 585 - $(el) ))
[ $left -gt 15 ] && { timeout $left build/bench/bench_gemm_bench --streamk --reps 8 --shapes 8192x8192x1024,8192x8192x2048,8192x8192x8192 --out $L/gemm_sk.json > $L/gemm_sk.log 2>&1; echo "gemm sk rc=$? at $(el)s"; tail -12 $L/gemm_sk.log; }
left=$(( 595 - $(el) ))
[ $left -gt 5 ] && for r in 0 2; do timeout 4 build/bench/bench_coll_bench --no-real-nccl --skip single --ranks 4 -b 256K -e 16M -f 8 --big-bytes 16M --reg $r --out $L/coll_reg$r.json > $L/coll_reg$r.log 2>&1; done
tarup
