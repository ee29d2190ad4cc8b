#!/usr/bin/env bash
# Session 24 call E, with the budget's last ~390 s: MKERNEL_FUSED_HELPERS=2 against the
# defaults (helpers 1 + DYN), fused_bench only (no gtest build: it would not fit). Its check
# against the sequential path (max|diff|/max|C| <= 0.05 per shape) is the only correctness
# check of mode 2 here; next_callE.sh runs its tests.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsE; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsE.tgz -C $OUT logsE; }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B /tmp/be -G Ninja -DCMAKE_BUILD_TYPE=Release -DMK_GPU_TESTS="gpu/test_gemm_fused.cu" > $L/cfg.log 2>&1
timeout 250 cmake --build /tmp/be -j16 --target bench_fused_bench > $L/build.log 2>&1
echo "build rc=$? at $(el)s"; tail -1 $L/build.log; grep -m5 -E "error" $L/build.log
export LD_LIBRARY_PATH=/tmp/be/src MKERNEL_TIMEOUT_MS=20000
B=/tmp/be/bench/bench_fused_bench
S=ar:8192x8192x8192,rs:8192x8192x8192,ar:8192x8192x1024,ar:4096x8192x8192
run() {  # name, env...
  local n=$1; shift
  env "$@" timeout 40 $B --ranks 4 --reps 5 --warmup 1 --shapes $S --out $L/$n.json > $L/$n.log 2>&1
  echo "$n rc=$? at $(el)s"; grep -E "^\| gemm_|gates expired|FAIL|differs" $L/$n.log; tarup
}
run h2a MKERNEL_FUSED_HELPERS=2
run h1a
run h2_tr MKERNEL_FUSED_HELPERS=2 MKERNEL_FUSED_TRACE=1
grep "fused trace" $L/h2_tr.log | grep -E "rank 0" | head -12; tarup
run h2b MKERNEL_FUSED_HELPERS=2
run h1b
