#!/usr/bin/env bash
# Session 12 call 4: the whole GPU gtest binary at the merged commit (call 3's test.sh ran every
# other ctest entry, 293/294 passed, and hit its 440 s limit inside mk_gpu_tests).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs4; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build build -j16 --target mk_gpu_tests mk_comm_worker > $L/build.log 2>&1; echo "build rc=$? at $(el)s"
export LD_LIBRARY_PATH=$PWD/build/src:${LD_LIBRARY_PATH:-}
cd build && timeout $(( 555 - $(el) )) tests/mk_gpu_tests > $L/gtest.log 2>&1; echo "mk_gpu_tests rc=$? at $(el)s"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]|tests ran" $L/gtest.log | tail -20; grep -c "OK \]" $L/gtest.log; gzip -k $L/gtest.log
