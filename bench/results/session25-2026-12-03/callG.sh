#!/usr/bin/env bash
# Session 25, call G: ncclFusedAuto fuses in the clique where gcAutoFuses holds (AR / RS,
# K >= 8192, >= 1024 tiles, helpers on).
# 1. Build the fused GPU tests (MK_GPU_TESTS subset) and bench_fused_bench.
# 2. *Fused*:*GemmColl* (20 s wait deadline), with FusedGemmCollAuto.FusesWhereTheRuleHolds.
# 3. fused_bench, 4 ranks sharing the GPU, variants interleaved, twice: the auto column
#    against fused and sequential; K = 2048 and 4096 added to see where fusing starts to win.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsG; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsG.tgz -C $OUT logsG; }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B /tmp/be -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMK_GPU_TESTS="gpu/test_fused_*.cu;gpu/test_gemm_fused.cu" > $L/cfg.log 2>&1
timeout 330 cmake --build /tmp/be -j16 --target mk_gpu_tests bench_fused_bench > $L/build.log 2>&1
echo "build rc=$? at $(el)s"; tail -1 $L/build.log; grep -m5 -E "error" $L/build.log
export LD_LIBRARY_PATH=/tmp/be/src MKERNEL_TIMEOUT_MS=20000
left=$(( 500 - $(el) )); [ $left -gt 160 ] && left=160
timeout $left /tmp/be/tests/mk_gpu_tests --gtest_filter='*Fused*:*GemmColl*' > $L/tests.log 2>&1
echo "tests rc=$? at $(el)s"; grep -E "^\[  (PASSED|FAILED) |tests? ran" $L/tests.log | tail -3
grep -E "^\[  FAILED  \] [A-Za-z]" $L/tests.log | head -20
grep -E "^\[ +OK \] FusedGemmColl(Helpers|Tail|Auto)" $L/tests.log
gzip -f $L/tests.log; tarup
B=/tmp/be/bench/bench_fused_bench
S=ar:8192x8192x8192,rs:8192x8192x8192,ar:4096x8192x8192,ar:8192x8192x4096,ar:8192x8192x2048,ar:8192x8192x1024
run() {  # name, env...
  local n=$1; shift
  left=$(( 585 - $(el) )); [ $left -lt 20 ] && return; [ $left -gt 60 ] && left=60
  env "$@" timeout $left $B --ranks 4 --reps 10 --warmup 2 --shapes $S --out $L/$n.json \
    > $L/$n.log 2>&1
  echo "$n rc=$? at $(el)s"; grep -E "^\| gemm_|gates expired|FAIL|differs" $L/$n.log
}
run g1 MKERNEL_FUSED_DEBUG=0
run g2 MKERNEL_FUSED_DEBUG=0
tarup
