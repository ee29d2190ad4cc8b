#!/usr/bin/env bash
# Session 24 call D: the reduce helpers and the dynamic GEMM schedule as the defaults.
# 1. Build the fused GPU tests (MK_GPU_TESTS subset) and bench_fused_bench.
# 2. *Fused*:*GemmColl* (20 s wait deadline): every fused test with the new defaults.
# 3. fused_bench, 4 ranks sharing the GPU: the defaults (helpers + DYN) twice, helpers and DYN
#    off, the sequential path's GEMM on each rank's SM budget (MKERNEL_SEQ_GEMM_SMS=-1: four
#    GEMMs side by side, as in the fused kernel), the reduce's loads/stores/sums skipped
#    (MKERNEL_FUSED_DEBUG=7: what the helpers' traffic costs the GEMM), then the trace with the
#    compute CTAs' GEMM-end stamps.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsD; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsD.tgz -C $OUT logsD; }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B /tmp/bd -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMK_GPU_TESTS="gpu/test_fused_*.cu;gpu/test_gemm_fused.cu" > $L/cfg.log 2>&1
timeout 330 cmake --build /tmp/bd -j16 --target mk_gpu_tests bench_fused_bench > $L/build.log 2>&1
echo "build rc=$? at $(el)s"; tail -1 $L/build.log; grep -m5 -E "error" $L/build.log
export LD_LIBRARY_PATH=/tmp/bd/src MKERNEL_TIMEOUT_MS=20000
left=$(( 520 - $(el) )); [ $left -gt 150 ] && left=150
timeout $left /tmp/bd/tests/mk_gpu_tests --gtest_filter='*Fused*:*GemmColl*' > $L/tests.log 2>&1
echo "tests rc=$? at $(el)s"; grep -E "^\[  (PASSED|FAILED) |tests? ran" $L/tests.log | tail -3
grep -E "^\[  FAILED  \] [A-Za-z]" $L/tests.log | head -20
grep -E "^\[ +OK \] FusedGemmColl(Helpers|Tail)" $L/tests.log
gzip -f $L/tests.log; tarup
B=/tmp/bd/bench/bench_fused_bench
S=ar:8192x8192x8192,rs:8192x8192x8192,ar:8192x8192x1024,ar:4096x8192x8192
run() {  # name, env...
  local n=$1; shift
  left=$(( 575 - $(el) )); [ $left -lt 20 ] && return; [ $left -gt 60 ] && left=60
  env "$@" timeout $left $B --ranks 4 --reps 5 --warmup 1 --shapes $S --out $L/$n.json > $L/$n.log 2>&1
  echo "$n rc=$? at $(el)s"; grep -E "^\| gemm_|gates expired|FAIL|differs" $L/$n.log
}
run def_a
run off MKERNEL_FUSED_HELPERS=0 MKERNEL_FUSED_DYN=0
run seqbudget MKERNEL_SEQ_GEMM_SMS=-1
run dbg7 MKERNEL_FUSED_DEBUG=7
run def_b
run def_tr MKERNEL_FUSED_TRACE=1
grep "fused trace.*rank 0" $L/def_tr.log | head -8
tarup
