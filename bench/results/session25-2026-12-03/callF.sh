#!/usr/bin/env bash
# Session 25, call F: helpers with the L2 prefetch of the partials (the one claim loop that
# is left, session 24's mode 2), against MKERNEL_FUSED_DEBUG=32 (prefetch off).
# 1. Build the fused GPU tests (MK_GPU_TESTS subset) and bench_fused_bench.
# 2. *Fused*:*GemmColl* (20 s wait deadline).
# 3. fused_bench, 4 ranks sharing the GPU, variants interleaved (new default): prefetch on /
#    off alternating, twice; once with --blocked (the old order); then both with the trace
#    (GEMM end vs the CTAs' end, tiles the helpers reduced).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsF; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsF.tgz -C $OUT logsF; }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B /tmp/be -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMK_GPU_TESTS="gpu/test_fused_*.cu;gpu/test_gemm_fused.cu" > $L/cfg.log 2>&1
timeout 330 cmake --build /tmp/be -j16 --target mk_gpu_tests bench_fused_bench > $L/build.log 2>&1
echo "build rc=$? at $(el)s"; tail -1 $L/build.log; grep -m5 -E "error" $L/build.log
export LD_LIBRARY_PATH=/tmp/be/src MKERNEL_TIMEOUT_MS=20000
left=$(( 500 - $(el) )); [ $left -gt 150 ] && left=150
timeout $left /tmp/be/tests/mk_gpu_tests --gtest_filter='*Fused*:*GemmColl*' > $L/tests.log 2>&1
echo "tests rc=$? at $(el)s"; grep -E "^\[  (PASSED|FAILED) |tests? ran" $L/tests.log | tail -3
grep -E "^\[  FAILED  \] [A-Za-z]" $L/tests.log | head -20
grep -E "^\[ +OK \] FusedGemmColl(Helpers|Tail)" $L/tests.log
gzip -f $L/tests.log; tarup
B=/tmp/be/bench/bench_fused_bench
S=ar:8192x8192x8192,rs:8192x8192x8192,ar:8192x8192x1024,ar:4096x8192x8192
run() {  # name, env...
  local n=$1; shift
  left=$(( 580 - $(el) )); [ $left -lt 20 ] && return; [ $left -gt 60 ] && left=60
  env "$@" timeout $left $B --ranks 4 --reps 10 --warmup 2 --shapes $S --out $L/$n.json ${BX:-} \
    > $L/$n.log 2>&1
  echo "$n rc=$? at $(el)s"; grep -E "^\| gemm_|gates expired|FAIL|differs" $L/$n.log
}
run pf1 MKERNEL_FUSED_DEBUG=0
run np1 MKERNEL_FUSED_DEBUG=32
run pf2 MKERNEL_FUSED_DEBUG=0
run np2 MKERNEL_FUSED_DEBUG=32
BX=--blocked run pfB MKERNEL_FUSED_DEBUG=0
run pf_tr MKERNEL_FUSED_TRACE=1
run np_tr MKERNEL_FUSED_TRACE=1 MKERNEL_FUSED_DEBUG=32
for f in pf_tr np_tr; do  # each shape's last call, rank 0
  echo "== $f"; grep "fused trace.*rank 0 " $L/$f.log |
    awk '{k=$4 $7 $8 $9; l[k]=$0; if (!(k in o)) {o[k]=++n; ks[n]=k}} END {for (i=1;i<=n;i++) print l[ks[i]]}' |
    sed 's/; started at.*//'
done
tarup
