#!/usr/bin/env bash
# Session 17 call F (final main after the last read of the diff): build; attention suites
# (smemBytes refactor) and the proxy end-to-end tests (pollFor).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsF; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
timeout 60 $B/tests/mk_gpu_tests --gtest_filter='*RingAttnD64Variant*:RingAttnSingle*:*AttnSingle*' > $L/gt_attn.log 2>&1; echo "gtest attn rc=$? at $(el)s"; grep -E "FAILED  \]|^\[  PASSED  \]|tests from .* ran" $L/gt_attn.log | tail -3
timeout 40 $B/tests/mk_mp_tests --gtest_filter='ProxyE2E*:ProxyFault*' > $L/mp.log 2>&1; echo "mp rc=$? at $(el)s"; grep -E "FAILED  \]|^\[  PASSED  \]" $L/mp.log
tar -czf $OUT/logsF.tgz -C $OUT logsF
