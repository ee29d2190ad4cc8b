#!/usr/bin/env bash
# Session 16 call B2 (warm; same snapshot, build of call B1 in ../build-dev): sanitizers on the
# ping-pong pipeline (racecheck, synccheck: the first run of its named-barrier turns), the
# attention kernel alone causal/non-causal vs cuDNN after the causal-bound walk, then
# net_vs_nccl (2 rounds) with the socket TX coalescing and its =0 diagnostic.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsB2; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsB2.tgz -C $OUT logsB2; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
for tool in racecheck synccheck; do
  timeout 70 compute-sanitizer --tool $tool $B/tests/mk_gpu_tests --gtest_filter='GemmSmall.*' > $L/$tool.log 2>&1; echo "$tool rc=$? at $(el)s"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $L/$tool.log | head -4
done; tarup
timeout 170 python3 bench/attn_bench.py single --lib $B/src/libmkernel.so --out $L/attn --seqs 4096,8192,16384,32768 --head-dims 128,64 --causal both --backends cudnn --budget 150 > $L/attn.log 2>&1; echo "attn bench rc=$? at $(el)s"
grep -iE "ratio|causal|vs|ours" $L/attn.log | tail -22; tarup
left=$(( 580 - $(el) )); echo "left ${left}s"
[ $left -gt 60 ] && MK_NVN_BUDGET=$(( left - 20 )) timeout $left bash bench/net_vs_nccl.sh $B $L/nvn --no-bound --rounds 2 > $L/nvn.log 2>&1; echo "nvn rc=$? at $(el)s"
grep -E "^\| (allreduce|sendrecv) \|" $L/nvn/net_vs_nccl.md | head -44 | cut -d'|' -f2-6,10; grep -A8 "## Verdict\|Slow starts" $L/nvn/net_vs_nccl.md | head -20
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
