#!/usr/bin/env bash
# Session 15 call A: branch s15 (= main + s14-next small AllReduce kernel to 4 KiB + s14-gemm
# LendPipe / alpha pre-scale / attribute cache; neither yet run on a GPU). Build; inter-node
# suites; GEMM correctness incl. the lent stage; racecheck; the small-K bench deep/wide/lent.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsA; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsA.tgz -C $OUT logsA; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
timeout 110 $B/tests/mk_gpu_tests --gtest_filter='*HierOps*:*CollProcs*:*Vnodes*' > $L/gtest-hier.log 2>&1; echo "gtest hier rc=$? at $(el)s"
grep -E "FAILED  \]|^\[  PASSED  \] [0-9]{2,}|Failure" $L/gtest-hier.log | head -12; tarup
timeout 200 $B/tests/mk_gpu_tests --gtest_filter='GemmSmall.*:GemmCorrectness.*:GemmHooks*:*FusedGemmColl*:GemmGrouped*:GemmCanImplement*' > $L/gtest-gemm.log 2>&1; echo "gtest gemm rc=$? at $(el)s"
grep -E "FAILED  \]|^\[  PASSED  \] [0-9]{2,}|Failure" $L/gtest-gemm.log | head -12; tarup
timeout 120 $B/bench/bench_gemm_bench --shapes 8192x8192x512,8192x8192x1024,8192x8192x2048,8192x8192x8192 --reps 20 --pipelines --out $L/gemm_lent.json > $L/gemm_lent.log 2>&1; echo "gemm bench rc=$? at $(el)s"
grep -vE "^\s*$" $L/gemm_lent.log | tail -20; tarup
left=$(( 570 - $(el) ))
[ $left -gt 30 ] && timeout $left compute-sanitizer --tool racecheck $B/tests/mk_gpu_tests --gtest_filter='GemmSmall.*' > $L/racecheck.log 2>&1; echo "racecheck rc=$? at $(el)s"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $L/racecheck.log | head -4
tarup
