#!/usr/bin/env bash
# Session 23 call 3: why FusedGemmCollHelpers hung in call 2 (helpers on), and the fused GPU
# tests with helpers off (the default now).
# 1. Build mk_gpu_tests (MK_GPU_TESTS: the fused tests).
# 2. FusedGemmCollHelpers with a 3 s wait deadline and NCCL_DEBUG=INFO (FUSED): each call's
#    split is logged, a stuck wait fails with the site it waited at.
# 3. *Fused*:*GemmColl* but the helpers test (helpers off by default).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs3; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs3.tgz -C $OUT logs3; }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B /tmp/b3 -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMK_GPU_TESTS="gpu/test_fused_*.cu;gpu/test_gemm_fused.cu" > $L/cfg.log 2>&1
timeout 300 cmake --build /tmp/b3 -j16 --target mk_gpu_tests > $L/build.log 2>&1
echo "build rc=$? at $(el)s"; tail -1 $L/build.log; grep -m5 -E "error" $L/build.log
export LD_LIBRARY_PATH=/tmp/b3/src
MKERNEL_TIMEOUT_MS=3000 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=FUSED timeout 60 \
  /tmp/b3/tests/mk_gpu_tests --gtest_filter='FusedGemmCollHelpers.*' > $L/helpers.log 2>&1
echo "helpers rc=$? at $(el)s"
grep -vE "^\[mkernel|NCCL INFO" $L/helpers.log | grep -E "Failure|Expected|Which is|error|timeout|wait|FAILED|OK" | head -20
grep -E "NCCL INFO.*fused" $L/helpers.log | head -6
grep -B3 -m3 "Failure" $L/helpers.log | grep "NCCL INFO" | head -6
gzip -f $L/helpers.log; tarup
left=$(( 560 - $(el) )); [ $left -gt 200 ] && left=200
timeout $left /tmp/b3/tests/mk_gpu_tests --gtest_filter='*Fused*:*GemmColl*:-FusedGemmCollHelpers.*' > $L/tests.log 2>&1
echo "tests rc=$? at $(el)s"; grep -E "^\[  (PASSED|FAILED) |tests? ran" $L/tests.log | tail -3
grep -E "^\[  FAILED  \] [A-Za-z]" $L/tests.log | head -20
gzip -f $L/tests.log; tarup
