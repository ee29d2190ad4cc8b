#!/usr/bin/env bash
# Session 22 call 4 (the ~230 s left): the reduce tail with claimed tail tiles (fused tests of
# test_fused_gemm_coll.cu, then fused_bench tail off vs on at 8192^3 AR/RS and 8192x8192x1024 AR).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs4; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B /tmp/b4 -G Ninja -DCMAKE_BUILD_TYPE=Release -DMK_GPU_TESTS="gpu/test_fused_gemm_coll.cu" > $L/cfg.log 2>&1
timeout 175 cmake --build /tmp/b4 -j16 --target bench_fused_bench mk_gpu_tests > $L/build.log 2>&1
echo "build rc=$? at $(el)s"; tail -1 $L/build.log; grep -m5 -E "error" $L/build.log
export LD_LIBRARY_PATH=/tmp/b4/src
timeout 25 /tmp/b4/tests/mk_gpu_tests --gtest_filter='*FusedGemmColl*' > $L/tests.log 2>&1
echo "tests rc=$? at $(el)s"; grep -E "^\[  (PASSED|FAILED) |^\[       OK \] FusedGemmColl[GT]|Failure" $L/tests.log | head -12
export MKERNEL_TIMEOUT_MS=15000
S=ar:8192x8192x8192,rs:8192x8192x8192,ar:8192x8192x1024
for v in -1 0 -1; do
  left=$(( 222 - $(el) )); [ $left -lt 8 ] && break; [ $left -gt 25 ] && left=25
  MKERNEL_FUSED_TAIL=$v timeout $left /tmp/b4/bench/bench_fused_bench --ranks 4 --reps 5 --warmup 1 \
    --shapes $S --out $L/tail$v.json > $L/tail$v.log 2>&1
  echo "tail=$v rc=$? at $(el)s"; grep -E "^\| gemm_|FAIL|differs" $L/tail$v.log
done
