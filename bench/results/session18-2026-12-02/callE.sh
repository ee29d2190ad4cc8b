#!/usr/bin/env bash
# Session 18 call E (final main, after the review mends): build with the README's cmake
# commands; the new GPU suites one by one with per-test results (the README test command ran
# them inside the single mk_gpu_tests ctest entry at 6425f23, call C) and the inline tests.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsE; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && timeout 200 cmake --build $B -j16 --target mk_gpu_tests > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
left=$(( 300 - $(el) ))
timeout $left $B/tests/mk_gpu_tests --gtest_filter='RingAttnXnode*:FusedXnode*:*MoeFused*:*HierInline64*' > $L/gt.log 2>&1; echo "gtest rc=$? at $(el)s"
grep -E "^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]|^\[==========\]" $L/gt.log | head -40
grep -c "^\[       OK \]" $L/gt.log
tar -czf $OUT/logsE.tgz -C $OUT logsE; echo "done at $(el)s"
