#!/usr/bin/env bash
# Session 21 call 3 (the ~150 s of device time left): the library and only the MoE GPU test
# files (MK_GPU_TESTS, new this session), then the MoE dispatch / fused / FFN-graph suites,
# which session 21 changed after the full test.sh run (threaded y reference, shared bodies).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs3; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B /tmp/b3 -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMK_GPU_TESTS="gpu/test_moe_fused.cu;gpu/test_moe_dispatch.cu;gpu/test_moe_ffn.cu" > $L/cfg.log 2>&1
timeout 120 cmake --build /tmp/b3 -j16 --target mk_gpu_tests > $L/build.log 2>&1
echo "build rc=$? at $(el)s"; tail -2 $L/build.log
export LD_LIBRARY_PATH=/tmp/b3/src
left=$(( 148 - $(el) ))
if [ $left -gt 5 ]; then
  timeout $left /tmp/b3/tests/mk_gpu_tests \
    --gtest_filter='Moe/MoeFusedThreads.*:MoeFused*:MoeDispatch*:MoeFfnGraph*' > $L/moe.log 2>&1
  echo "moe rc=$? at $(el)s"
  grep -E "^\[       OK|^\[  FAILED|^\[  PASSED|Failure|Expected" $L/moe.log | head -30
fi
