#!/usr/bin/env bash
# Session 18 call D (same snapshot and build dir as call C, warm): fused GEMM + collectives
# across 2 vnodes (RS/AR now fused) against cuBLAS + the real NCCL; net_vs_nccl quick.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsD; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsD.tgz -C $OUT logsD; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
timeout 150 bash bench/fused_vs_nccl.sh $B $L/fvn --quick > $L/fvn.log 2>&1; echo "fvn rc=$? at $(el)s"; cat $L/fvn/*.md 2>/dev/null | grep -E "^\|" | head -30
tarup
timeout 120 bash bench/net_vs_nccl.sh $B $L/nvn --quick --no-bound > $L/nvn.log 2>&1; echo "nvn rc=$? at $(el)s"
grep -E "^\| (allreduce|sendrecv) \|" $L/nvn/net_vs_nccl.md | head -40 | cut -d'|' -f2-8; grep -A6 "## Verdict" $L/nvn/net_vs_nccl.md
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup; echo "done at $(el)s"
