#!/usr/bin/env bash
# Session 13 call 2 (right after call 1, machine warm, ../build-dev reused): the README test
# command on the merged tree (ctest now starts mk_gpu_tests first), then MoE and fused GEMM
# benches with the sequential GEMMs on all SMs against the ranks' budgets.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs2; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs2.tgz -C $OUT logs2; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
timeout 420 bash scripts/test.sh $B > $L/test.log 2>&1; echo "test.sh rc=$? at $(el)s"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" $L/test.log | head -20
cp $B/Testing/Temporary/LastTest.log $L/ 2>/dev/null; gzip -f $L/LastTest.log; tarup
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
# Grouped GEMM: the deep ring (default) against the wide staging (88f40ce), issue 13's shapes.
for gs in "32 131072x2048x7168,131072x7168x2048" "16 131072x1408x2048"; do set -- $gs
  timeout 60 $B/bench/bench_gemm_bench --groups $1 --pipelines --reps 8 --shapes $2 --out $L/grouped_wide_g$1.json > $L/grouped_wide_g$1.log 2>&1; echo "grouped wide g$1 rc=$? at $(el)s"; grep -E "grouped" $L/grouped_wide_g$1.log | head -6
done; tarup
for sms in 0 -1; do
  MKERNEL_SEQ_GEMM_SMS=$sms timeout 60 $B/bench/bench_fused_bench --ranks 4 --reps 5 --warmup 1 --shapes ar:8192x8192x8192,rs:8192x8192x8192,ag:8192x512x8192 --out $L/fused_seq$sms.json > $L/fused_seq$sms.log 2>&1; echo "fused_bench seq sms $sms rc=$? at $(el)s"; grep -E "gemm_|hidden|sequential|cublas" $L/fused_seq$sms.log | head -8
done; tarup
left=$(( 560 - $(el) )); echo "moe budget ${left}s"
[ $left -gt 60 ] && timeout $left python3 bench/moe_bench.py ffn --lib $B/src/libmkernel.so --out $L/moe_ffn --mps --nproc 4 --budget $(( left - 15 )) > $L/moe_ffn.log 2>&1; echo "moe rc=$? at $(el)s"; grep -E "^\| " $L/moe_ffn.log | head -9
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
