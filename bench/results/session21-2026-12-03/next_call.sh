#!/usr/bin/env bash
# For the next session's first device call (fresh snapshot of main, run from its root):
# 1. scripts/test.sh whole: checks session 21's test-helper change (tests/common/parallel.h,
#    the threaded MoE y reference; compiled only in session 21) and shows mk_gpu_tests' new
#    run time (382 s at 0906438; MoeFusedThreads/n8 alone 41 s).
# 2. The in-node auto verdict for AllGather + GEMM: the README demo (2048x2048x1024, 4 ranks
#    sharing the GPU) ran fused 0.18-0.19 ms against sequential 0.20-0.22 ms in four calls
#    (sessions 18-21), while auto keeps the sequential path in a node until the fused kernel is
#    measured faster (autoMayFuse). Sweep AG shapes with auto as shipped (MKERNEL_FUSED_AUTO=0)
#    and with the cost model deciding (=1) to see where fusing pays and whether the model says so.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsN; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsN.tgz -C $OUT logsN; }
echo "commit $(cat COMMIT_SNAP 2>/dev/null || git rev-parse --short HEAD)"
timeout -k 5 480 bash scripts/test.sh > $L/test.log 2>&1; echo "test rc=$? at $(el)s"; tail -4 $L/test.log
cp build/Testing/Temporary/LastTest.log $L/ 2>/dev/null
grep -E "mk_gpu_tests .*sec|^\[  FAILED  \] [A-Za-z]" $L/test.log $L/LastTest.log | head -20
grep -E "MoeFusedThreads.*ms\)" $L/LastTest.log | head -4
gzip -f $L/LastTest.log $L/test.log; tarup
export LD_LIBRARY_PATH=build/src
S=ag:2048x128x2048,ag:2048x2048x1024,ag:4096x256x4096,ag:4096x4096x2048,ag:8192x512x8192,ag:8192x4096x1024
for a in 0 1; do
  left=$(( 590 - $(el) )); [ $left -lt 20 ] && break
  MKERNEL_FUSED_AUTO=$a timeout $left build/bench/bench_fused_bench --ranks 4 --reps 5 --warmup 1 \
    --shapes $S --out $L/fused_ag_auto$a.json > $L/fused_ag_auto$a.log 2>&1
  echo "fused_bench auto=$a rc=$? at $(el)s"; grep "^| allgather" $L/fused_ag_auto$a.log
done
tarup
