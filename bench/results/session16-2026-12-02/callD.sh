#!/usr/bin/env bash
# Session 16 call D (cold; final candidate s16-final = main 0eb2386 + publishCmd, the proxy's
# busy-backend pass, the inline review mends): build the library and the GPU/mp tests; the
# inline groups on rings of 2 and 3 slots; the inter-node suites (the proxy/socket ctests run in CI on the CPU).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsD; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMK_BUILD_BENCH=OFF > $L/cfg.log 2>&1 && cmake --build $B -j16 --target mkernel mk_gpu_tests > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
timeout 60 $B/tests/mk_gpu_tests --gtest_filter='*HierInline64*' > $L/gtest_inline.log 2>&1; echo "inline rc=$? at $(el)s"; grep -E "OK \]|FAILED|PASSED  \] [0-9]+" $L/gtest_inline.log | tail -8
