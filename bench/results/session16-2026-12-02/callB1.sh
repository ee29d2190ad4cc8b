#!/usr/bin/env bash
# Session 16 call B1 (cold machine; candidate s16-cand = main + s16-attn + s16-agree + s16-net +
# s16-pingpong, none run on a GPU before): the README test command (scripts/test.sh) with its
# build directory outside the snapshot (so call B2 reuses the build), then the GEMM pipelines
# bench with the ping-pong column.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsB1; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsB1.tgz -C $OUT logsB1; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
timeout 470 bash scripts/test.sh $B > $L/test.log 2>&1; echo "test.sh rc=$? at $(el)s"
grep -E "tests passed|tests failed|\*\*\*Failed|Timeout|Not Run" $L/test.log | head -20
cp $B/Testing/Temporary/LastTest.log $L/ 2>/dev/null; gzip -f $L/LastTest.log 2>/dev/null
grep -E "^\[  FAILED  \]|^\[  PASSED  \] [0-9]+|worst|ManyTilesCausal|PingPong|CommInitAgreed" $L/test.log | head -30; tarup
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
left=$(( 585 - $(el) )); echo "left ${left}s"
[ $left -gt 40 ] && timeout $left $B/bench/bench_gemm_bench --pipelines --reps 15 --shapes 8192x8192x512,8192x8192x1024,8192x8192x2048,8192x8192x8192 --out $L/gemm_ping.json > $L/gemm_ping.log 2>&1; echo "gemm bench rc=$? at $(el)s"
grep -vE "^\s*$" $L/gemm_ping.log | tail -16; tarup
