#!/usr/bin/env bash
# Session 17 call D (same snapshot 342b3f6, warm build): fused_vs_nccl --quick (2 processes as 2
# nodes): AG+GEMM now has a fused variant across nodes (xnode).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsD; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}; export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
MK_FVN_BUDGET=300 timeout 340 bash bench/fused_vs_nccl.sh $B $L/fvn --quick > $L/fvn.log 2>&1; echo "fvn rc=$? at $(el)s"
cp $L/fvn/fused_vs_nccl.md $L/fvn/fused_vs_nccl.json $L/ 2>/dev/null
grep -E "^\|" $L/fvn/fused_vs_nccl.md | head -40; tail -4 $L/fvn.log
echo quit | nvidia-cuda-mps-control 2>/dev/null; tar -czf $OUT/logsD.tgz -C $OUT logsD
