#!/usr/bin/env bash
# For the next session, second call (right after next_callA.sh, reusing /tmp/bt on the warm
# machine; rebuilds only if it is gone): mk_gpu_tests whole, output streamed to $OUT, with a
# 20 s wait deadline so a stuck call fails with its wait site instead of holding the call.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsB; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
if [ ! -x /tmp/bt/tests/mk_gpu_tests ]; then
  cmake -S . -B /tmp/bt -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1
  timeout 300 cmake --build /tmp/bt -j16 --target mk_gpu_tests > $L/build.log 2>&1
  echo "build rc=$? at $(el)s"
fi
export LD_LIBRARY_PATH=/tmp/bt/src
left=$(( 585 - $(el) ))
MKERNEL_TIMEOUT_MS=20000 timeout $left /tmp/bt/tests/mk_gpu_tests > $L/gpu.log 2>&1
echo "mk_gpu_tests rc=$? at $(el)s"; grep -E "^\[  (PASSED|FAILED) |tests? ran" $L/gpu.log | tail -3
grep -E "^\[  FAILED  \] [A-Za-z]" $L/gpu.log | head -20
grep -E "^\[ +OK \] FusedGemmColl(Helpers|Tail)" $L/gpu.log
tail -3 $L/gpu.log; gzip -f $L/gpu.log
