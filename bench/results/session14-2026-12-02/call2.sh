#!/usr/bin/env bash
# Session 14 call 2 (machine warm, ../build-dev reused): the README test command, then the
# never-run 2-node modes of the MoE and ring-attention benchmarks.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs2; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs2.tgz -C $OUT logs2; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
timeout 430 bash scripts/test.sh $B > $L/test.log 2>&1; echo "test.sh rc=$? at $(el)s"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" $L/test.log | head -20
cp $B/Testing/Temporary/LastTest.log $L/ 2>/dev/null; gzip -f $L/LastTest.log; gzip -f $L/test.log; tarup
left=$(( 570 - $(el) )); echo "left ${left}s"
[ $left -gt 60 ] && timeout $left python3 bench/moe_bench.py ffn --lib $B/src/libmkernel.so --out $L/moe_2n --mps --nproc 2 --nodes 2 --budget $(( left - 15 )) > $L/moe_2n.log 2>&1; echo "moe 2 nodes rc=$? at $(el)s"; grep -E "^\| " $L/moe_2n.log | head -8
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
