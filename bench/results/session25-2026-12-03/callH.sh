#!/usr/bin/env bash
# Session 25, call H (the budget's last ~550 s): call G's auto test failed (run.cc sent auto
# calls in one node to the sequential path before gemmCollFused saw the rule). Build, the
# auto test and the clique tests, fused_bench once.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsH; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsH.tgz -C $OUT logsH; }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B /tmp/be -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMK_GPU_TESTS="gpu/test_fused_gemm_coll.cu;gpu/test_fused_matrix.cu" > $L/cfg.log 2>&1
timeout 250 cmake --build /tmp/be -j16 --target mk_gpu_tests bench_fused_bench > $L/build.log 2>&1
echo "build rc=$? at $(el)s"; tail -1 $L/build.log; grep -m5 -E "error" $L/build.log
export LD_LIBRARY_PATH=/tmp/be/src MKERNEL_TIMEOUT_MS=20000
left=$(( 300 - $(el) )); [ $left -gt 60 ] && left=60
timeout $left /tmp/be/tests/mk_gpu_tests --gtest_filter='FusedGemmCollAuto.*:FusedMatrix/*' > $L/tests.log 2>&1
echo "tests rc=$? at $(el)s"; grep -E "^\[  (PASSED|FAILED) |tests? ran" $L/tests.log | tail -3
grep -E "^\[  FAILED  \] [A-Za-z]" $L/tests.log | head -10; grep -E "^\[ +OK \] FusedGemmCollAuto" $L/tests.log
gzip -f $L/tests.log; tarup
S=ar:8192x8192x8192,rs:8192x8192x8192,ar:4096x8192x8192,ar:8192x8192x1024
left=$(( 320 - $(el) )); [ $left -gt 40 ] && left=40
[ $left -ge 10 ] && timeout $left /tmp/be/bench/bench_fused_bench --ranks 4 --reps 10 --warmup 2 \
  --shapes $S --out $L/h1.json > $L/h1.log 2>&1
echo "h1 rc=$? at $(el)s"; grep -E "^\| gemm_|gates expired|FAIL|differs" $L/h1.log
tarup
