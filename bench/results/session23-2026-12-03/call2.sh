#!/usr/bin/env bash
# Session 23 call 2: the reduce helpers (MKERNEL_FUSED_HELPERS=1: the compute CTAs' idle
# producer warps reduce owned tiles during the GEMM, no comm CTA) of the in-node fused GEMM +
# AllReduce / ReduceScatter.
# 1. Build the library, fused_bench and the fused GPU tests (MK_GPU_TESTS subset).
# 2. The fused GPU tests (*Fused*:*GemmColl*), helpers on by default, incl. the new
#    FusedGemmCollHelpers test and the tail test with helpers off.
# 3. fused_bench 8192^3 AR/RS and 8192x8192x1024 AR, 4 ranks sharing the GPU: helpers on vs
#    off, alternating, then helpers on with MKERNEL_FUSED_TRACE.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs2; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs2.tgz -C $OUT logs2; }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B /tmp/b2 -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMK_GPU_TESTS="gpu/test_fused_*.cu;gpu/test_gemm_fused.cu" > $L/cfg.log 2>&1
timeout 280 cmake --build /tmp/b2 -j16 --target bench_fused_bench mk_gpu_tests > $L/build.log 2>&1
echo "build rc=$? at $(el)s"; tail -1 $L/build.log; grep -m5 -E "error" $L/build.log
export LD_LIBRARY_PATH=/tmp/b2/src
left=$(( 400 - $(el) )); [ $left -gt 150 ] && left=150
timeout $left /tmp/b2/tests/mk_gpu_tests --gtest_filter='*Fused*:*GemmColl*' > $L/tests.log 2>&1
echo "tests rc=$? at $(el)s"; grep -E "^\[  (PASSED|FAILED) |tests? ran" $L/tests.log | tail -3
grep -E "^\[  FAILED  \] [A-Za-z]" $L/tests.log | head -20
grep -E "^\[ +OK \] FusedGemmColl(Helpers|Tail|Graph)" $L/tests.log
gzip -f $L/tests.log; tarup
export MKERNEL_TIMEOUT_MS=20000  # a hang shows as an error within 20 s, not 300
B=/tmp/b2/bench/bench_fused_bench
S=ar:8192x8192x8192,rs:8192x8192x8192,ar:8192x8192x1024
run() {  # name, shapes, env...
  local n=$1 s=$2; shift 2
  left=$(( 575 - $(el) )); [ $left -lt 25 ] && return; [ $left -gt 80 ] && left=80
  env "$@" timeout $left $B --ranks 4 --reps 3 --warmup 1 --shapes $s --out $L/$n.json > $L/$n.log 2>&1
  echo "$n rc=$? at $(el)s"; grep -E "^\| (gemm_|allgather)|gates expired|FAIL|differs" $L/$n.log
  grep "fused trace.*rank 0" $L/$n.log | tail -4
}
run h1 $S MKERNEL_FUSED_HELPERS=1
run h0 $S MKERNEL_FUSED_HELPERS=0
run h1_tr $S MKERNEL_FUSED_HELPERS=1 MKERNEL_FUSED_TRACE=1
run h1b $S MKERNEL_FUSED_HELPERS=1
run h0b $S MKERNEL_FUSED_HELPERS=0
tarup
