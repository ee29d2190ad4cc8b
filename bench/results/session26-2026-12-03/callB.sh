#!/usr/bin/env bash
# Session 26, call B (right after call A on the warm machine, reusing /tmp/bt; rebuilds the
# test binary only if it is gone): mk_gpu_tests whole with a 20 s wait deadline, then the
# ring/register comparison once more if time is left.
set -u
source scripts/gpu_call.sh
gc_init B
if [ ! -x /tmp/bt/tests/mk_gpu_tests ]; then
  cmake -S . -B /tmp/bt -G Ninja -DCMAKE_BUILD_TYPE=Release > "$GC_L/cfg.log" 2>&1
  timeout 300 cmake --build /tmp/bt -j16 --target mk_gpu_tests bench_fused_bench \
    > "$GC_L/build.log" 2>&1
  echo "build rc=$? at $(gc_el)s"
fi
export LD_LIBRARY_PATH=/tmp/bt/src MKERNEL_TIMEOUT_MS=20000
left=$(gc_left 500 500)
timeout "$left" /tmp/bt/tests/mk_gpu_tests > "$GC_L/gpu.log" 2>&1
echo "mk_gpu_tests rc=$? at $(gc_el)s"; grep -E "^\[  (PASSED|FAILED) |tests? ran" "$GC_L/gpu.log" | tail -3
grep -E "^\[  FAILED  \] [A-Za-z]" "$GC_L/gpu.log" | head -20
tail -3 "$GC_L/gpu.log"; gzip -f "$GC_L/gpu.log"; gc_tar
S=ar:8192x8192x1024,rs:8192x8192x1024,ar:8192x8192x2048
gc_fused_bench /tmp/bt ring2 545 "--ranks 4 --reps 8 --warmup 2 --shapes $S"
gc_fused_bench /tmp/bt reg2 590 "--ranks 4 --reps 8 --warmup 2 --shapes $S" MKERNEL_FUSED_DEBUG=32
