#!/usr/bin/env bash
# Session 22 call 3: the reduce tail (compute CTAs join the fused AllReduce / ReduceScatter
# reduce once their GEMM tiles are done; MKERNEL_FUSED_TAIL) and the gated bench start
# (times from a start that fires once every rank thread queued its call; host issue apart).
# 1. fused_bench 8192^3 AR/RS and 8192x8192x1024 AR: tail off (0) vs the model's (-1), side by
#    side, then with MKERNEL_FUSED_TRACE, then comm CTAs 2 / 8 with the tail.
# 2. The fused GPU tests (MK_GPU_TESTS subset), incl. FusedGemmCollTail.
# 3. If time is left: the in-node AllGather + GEMM auto sweep (MKERNEL_FUSED_AUTO=0/1).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs3; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs3.tgz -C $OUT logs3; }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B /tmp/b3 -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMK_GPU_TESTS="gpu/test_fused_*.cu;gpu/test_gemm_fused.cu" > $L/cfg.log 2>&1
timeout 300 cmake --build /tmp/b3 -j16 --target bench_fused_bench mk_gpu_tests > $L/build.log 2>&1
echo "build rc=$? at $(el)s"; tail -1 $L/build.log; grep -m5 -E "error" $L/build.log
export LD_LIBRARY_PATH=/tmp/b3/src
export MKERNEL_TIMEOUT_MS=20000  # a hang shows as an error within 20 s, not 300
B=/tmp/b3/bench/bench_fused_bench
S=ar:8192x8192x8192,rs:8192x8192x8192,ar:8192x8192x1024
run() {  # name, shapes, env...
  local n=$1 s=$2; shift 2
  left=$(( 560 - $(el) )); [ $left -lt 20 ] && return; [ $left -gt 90 ] && left=90
  env "$@" timeout $left $B --ranks 4 --reps 5 --warmup 1 --shapes $s --out $L/$n.json > $L/$n.log 2>&1
  echo "$n rc=$? at $(el)s"; grep -E "^\| (gemm_|allgather)|host issue|gates expired|FAIL|differs" $L/$n.log
  grep "fused trace.*rank" $L/$n.log | tail -8
}
run tail0 $S MKERNEL_FUSED_TAIL=0
run tailm $S MKERNEL_FUSED_TAIL=-1
run tail0b $S MKERNEL_FUSED_TAIL=0
run tailmb $S MKERNEL_FUSED_TAIL=-1
run tailm_tr $S MKERNEL_FUSED_TAIL=-1 MKERNEL_FUSED_TRACE=1
run tail0_tr $S MKERNEL_FUSED_TAIL=0 MKERNEL_FUSED_TRACE=1
run tail2w $S MKERNEL_FUSED_TAIL=2
for c in 2 8; do run c${c}_tail $S MKERNEL_FUSED_TAIL=-1 MKERNEL_FUSED_COMM_SMS=$c MKERNEL_FUSED_AUTO=1; done
tarup
left=$(( 470 - $(el) ))
env -u MKERNEL_TIMEOUT_MS timeout $left /tmp/b3/tests/mk_gpu_tests --gtest_filter='*Fused*:*GemmColl*' > $L/tests.log 2>&1
echo "tests rc=$? at $(el)s"; grep -E "^\[  (PASSED|FAILED) |tests? ran" $L/tests.log | head -20
grep -E "FusedGemmCollTail" $L/tests.log | head -4
gzip -f $L/tests.log; tarup
A=ag:2048x128x2048,ag:2048x2048x1024,ag:4096x256x4096,ag:4096x4096x2048,ag:8192x512x8192,ag:8192x4096x1024
for a in 0 1; do run ag_auto$a $A MKERNEL_FUSED_AUTO=$a; done
tarup
