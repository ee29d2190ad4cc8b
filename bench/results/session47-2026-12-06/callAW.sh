#!/usr/bin/env bash
# Session 47, call AW: GemmArgs::pipeline 5 re-purposed as the deep ring lending each tile's
# last stage to the epilogue (LendPipe: 4 load stages, the half-tile staged whole in the kept
# stage plus 2 own boxes, the store threads hand the stage back once read). Session 47's call
# AU traced the deep ring at 0.624 us a k-step but a 2.12 us epilogue (its 2 boxes a WG make it
# wait for its own stores), the default wide split at 0.700 us a k-step and 0.79 us: this is
# the deep ring's k-step with the wide split's epilogue, if it works. Correctness first (one
# CTA walking every tile, racecheck/synccheck), then the small-K shapes traced and the list.
# AW: after call AV's racecheck run caught wrong results from pipeline 5 (a warpgroup wrote its
# lent boxes over A rows and B the other warpgroup's wgmmas could still be reading): the stage
# is now released as any other, a warpgroup writes its lent boxes once the stage's `empty` phase
# says both are done, and the producer waits for a per-stage lentDone barrier. Tests repeated.
set -u
source scripts/gpu_call.sh
gc_init AW
GC_BUILD_S=300 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_trace.cu" mk_gpu_tests \
  bench_gemm_bench
GC_T=$(gc_el)
timeout 120 /tmp/bn/tests/mk_gpu_tests --gtest_filter='GemmSmall*:GemmCorrectness.BothPipelines' \
  --gtest_repeat=5 > "$GC_L/tests_repeat.log" 2>&1
echo "repeat rc=$? at $(gc_el)s: $(grep -c '^\[       OK' "$GC_L/tests_repeat.log") OK, $(grep -c '^\[  FAILED  \] Gemm' "$GC_L/tests_repeat.log") failed"
gc_tests /tmp/bn 'GemmSmall*:GemmCorrectness.BothPipelines:GemmCorrectness.ClusterPairs:GemmTrace*' 380 90
gc_run san_racecheck 410 40 15 0 "RACECHECK SUMMARY|PASSED|FAILED" \
  compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/bn/tests/mk_gpu_tests \
  --gtest_filter='GemmSmall.*'
gc_run san_synccheck 445 35 15 0 "ERROR SUMMARY|PASSED|FAILED" \
  compute-sanitizer --tool synccheck --error-exitcode 9 /tmp/bn/tests/mk_gpu_tests \
  --gtest_filter='GemmSmall.*'
gc_run gemm_lend 525 80 20 1 "x.*(engine  |pipeline|trace|lent)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x4096 \
  --reps 10 --pipelines --trace --lend --commit "$(cat COMMIT_SNAP)"
gc_run gemm_lend_list 592 65 15 1 "x.*(engine  |lent)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 8 --lend --commit "$(cat COMMIT_SNAP)"
gc_tar
