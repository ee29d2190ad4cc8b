#!/usr/bin/env bash
# Session 17 call E (review mends on top of 752a473): build; the unit tests touched; every
# fused GEMM + collective GPU suite (the budget cap applies to every layout).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsE; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
timeout 60 $B/tests/mk_unit_tests --gtest_filter='GemmCollXnode*:SocketTxCoalesce*:AgreedParams*:*CanImplement*' > $L/unit.log 2>&1; echo "unit rc=$? at $(el)s"; grep -E "FAILED  \]|^\[  PASSED  \]" $L/unit.log | head
timeout 260 $B/tests/mk_gpu_tests --gtest_filter='*Fused*' > $L/gt_fused.log 2>&1; echo "gtest fused rc=$? at $(el)s"; grep -E "FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \] [0-9]|Failure" $L/gt_fused.log | head -12
tar -czf $OUT/logsE.tgz -C $OUT logsE
