#!/usr/bin/env bash
# Session 26, call A: the README's build (every target) from the snapshot, then the fused
# tests (the helpers' new ring), the helpers' ring against register loads in fused_bench
# (MKERNEL_FUSED_DEBUG bit 5, interleaved calls, same binary), then every ctest entry but
# mk_gpu_tests. Call B (next, on the warm machine) runs mk_gpu_tests whole from /tmp/bt.
set -u
source scripts/gpu_call.sh
gc_init A
bash scripts/install_deps.sh > "$GC_L/deps.log" 2>&1
cmake -S . -B /tmp/bt -G Ninja -DCMAKE_BUILD_TYPE=Release > "$GC_L/cfg.log" 2>&1
timeout 380 cmake --build /tmp/bt -j16 > "$GC_L/build.log" 2>&1
echo "build rc=$? at $(gc_el)s"; tail -1 "$GC_L/build.log"; grep -m5 -E "error" "$GC_L/build.log"
export LD_LIBRARY_PATH=/tmp/bt/src MKERNEL_TIMEOUT_MS=20000
gc_tests /tmp/bt '*Fused*:*GemmColl*' 470 140
S=ar:8192x8192x1024,rs:8192x8192x1024,ar:8192x8192x2048,ar:8192x8192x4096,ar:8192x8192x8192
gc_fused_bench /tmp/bt ring 510 "--ranks 4 --reps 8 --warmup 2 --shapes $S"
gc_fused_bench /tmp/bt reg 550 "--ranks 4 --reps 8 --warmup 2 --shapes $S" MKERNEL_FUSED_DEBUG=32
R=$PWD
left=$(gc_left 590 60)
(cd /tmp/bt && timeout "$left" ctest -E '^mk_gpu_tests$' -j4 --timeout 120 --output-on-failure) \
  > "$GC_L/ctest.log" 2>&1
echo "ctest rc=$? at $(gc_el)s"; grep -E "tests passed|tests failed" "$GC_L/ctest.log"
grep -E "\*\*\*Failed|\*\*\*Timeout" "$GC_L/ctest.log" | head
gzip -f "$GC_L/ctest.log"; gc_tar
