#!/usr/bin/env bash
# For the next session: MKERNEL_FUSED_HELPERS=2 (a CTA's three helper warps reduce one ready
# tile together; added after session 24's call D, not yet run on a GPU).
# 1. Build the fused GPU tests (MK_GPU_TESTS subset) and bench_fused_bench.
# 2. *Fused*:*GemmColl* (20 s wait deadline): the helpers test has passes with mode 2.
# 3. fused_bench, 4 ranks sharing the GPU: the defaults (helpers 1 + DYN) against helpers 2,
#    alternating, twice; then helpers 2 with the trace (GEMM end vs the CTAs' end).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsE; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsE.tgz -C $OUT logsE; }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B /tmp/be -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMK_GPU_TESTS="gpu/test_fused_*.cu;gpu/test_gemm_fused.cu" > $L/cfg.log 2>&1
timeout 330 cmake --build /tmp/be -j16 --target mk_gpu_tests bench_fused_bench > $L/build.log 2>&1
echo "build rc=$? at $(el)s"; tail -1 $L/build.log; grep -m5 -E "error" $L/build.log
export LD_LIBRARY_PATH=/tmp/be/src MKERNEL_TIMEOUT_MS=20000
left=$(( 520 - $(el) )); [ $left -gt 150 ] && left=150
timeout $left /tmp/be/tests/mk_gpu_tests --gtest_filter='*Fused*:*GemmColl*' > $L/tests.log 2>&1
echo "tests rc=$? at $(el)s"; grep -E "^\[  (PASSED|FAILED) |tests? ran" $L/tests.log | tail -3
grep -E "^\[  FAILED  \] [A-Za-z]" $L/tests.log | head -20
grep -E "^\[ +OK \] FusedGemmColl(Helpers|Tail)" $L/tests.log
gzip -f $L/tests.log; tarup
B=/tmp/be/bench/bench_fused_bench
S=ar:8192x8192x8192,rs:8192x8192x8192,ar:8192x8192x1024,ar:4096x8192x8192
run() {  # name, env...
  local n=$1; shift
  left=$(( 575 - $(el) )); [ $left -lt 20 ] && return; [ $left -gt 60 ] && left=60
  env "$@" timeout $left $B --ranks 4 --reps 5 --warmup 1 --shapes $S --out $L/$n.json > $L/$n.log 2>&1
  echo "$n rc=$? at $(el)s"; grep -E "^\| gemm_|gates expired|FAIL|differs" $L/$n.log
}
run h1a
run h2a MKERNEL_FUSED_HELPERS=2
run h1b
run h2b MKERNEL_FUSED_HELPERS=2
run h2_tr MKERNEL_FUSED_HELPERS=2 MKERNEL_FUSED_TRACE=1
grep "fused trace.*rank 0" $L/h2_tr.log | head -8
tarup
