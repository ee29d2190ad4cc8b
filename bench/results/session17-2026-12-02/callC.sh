#!/usr/bin/env bash
# Session 17 call C (final candidate: D=64 default 1): the README test command (build + every
# CPU and GPU test), then the attention kernel alone at both head dims against cuDNN.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsC; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsC.tgz -C $OUT logsC; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
timeout 480 bash scripts/test.sh $B > $L/test.log 2>&1; echo "test.sh rc=$? at $(el)s"
grep -E "tests passed|tests failed|\*\*\*Failed|Failed  |FAILED  \]|^\[  PASSED" $L/test.log | head -20; gzip -k $L/test.log; tarup
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}; export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
left=$(( 585 - $(el) )); echo "left ${left}s"
[ $left -gt 40 ] && timeout $left python3 bench/attn_bench.py single --lib $B/src/libmkernel.so --out $L/attn --seqs 4096,8192,16384,32768 --head-dims 128,64 --causal both --backends cudnn --reps 6 --target-ms 8 > $L/attn.log 2>&1; echo "attn rc=$? at $(el)s"
grep -E "^\|" $L/attn/*.md | grep -v -- "---" | head -20; rm -f $L/test.log; tarup
