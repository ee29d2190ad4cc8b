#!/usr/bin/env bash
# Session 18 call C (final main candidate): the README test command (scripts/test.sh: build with
# the README's cmake commands, netns test, every ctest entry incl. the new FusedXnode RS/AR,
# MoeFused and ring-attention xnode suites), then quick benches while time is left.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsC; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsC.tgz -C $OUT logsC; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
timeout 540 bash scripts/test.sh $B > $L/test.log 2>&1; echo "test.sh rc=$? at $(el)s"
grep -E "tests passed|tests failed" $L/test.log; grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess)" $L/test.log | head -20
gzip -k $L/test.log; tarup
left=$(( 585 - $(el) ))
if [ $left -gt 30 ]; then
  export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
  timeout $(( left - 5 )) $B/bench/bench_moe_threads_bench --ranks 4 --out $L/moe_threads.json > $L/moe_threads.log 2>&1; echo "moe threads rc=$? at $(el)s"; tail -15 $L/moe_threads.log
fi
tarup; echo "done at $(el)s"
