#!/usr/bin/env bash
# Prepared in session 50 for the next session (written after the device budget was spent; not
# yet run): does D evict the A and B bands the next tiles re-read from L2? Call CD put the D
# stores' cost at 8192x8192x1024 at 1.036-1.044x (the engine with the stores off, a diagnostic),
# but only 1.014-1.016x at 16384x8192x1024 (same K, twice the rows: A 32 MB + B 16 MB fill L2
# there anyway), so the cost looks like L2 pollution, not the write traffic itself.
# GemmArgs::storeHint = 1 gives D's TMA stores an L2 evict-first policy; a wider raster band
# (GemmArgs::groupM 16 / 32 / 64) re-reads B fewer times. Bench runs take seconds once built.
set -u
source scripts/gpu_call.sh
gc_init CI
GC_BUILD_S=330 gc_build /tmp/bi "gpu/test_gemm*.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bi 'Gemm*' 400 80
mv "$GC_L/tests.log.gz" "$GC_L/tests_gemm.log.gz"
SMALL=8192x8192x1024,8192x8192x512,16384x8192x1024,8192x8192x2048
for r in 1 2 3; do
  for g in 16 32 64; do
    gc_run "hint_g${g}_$r" 500 30 5 1 "x.*(engine  |hint|groupM|stores off)|rror" \
      /tmp/bi/bench/bench_gemm_bench --shapes "$SMALL" --reps 30 --hint --nostore --groupm "$g" \
      --commit "$(cat COMMIT_SNAP)"
  done
done
gc_run trace 530 40 10 1 "x.*(engine  |trace|hint|stores off)|rror" \
  /tmp/bi/bench/bench_gemm_bench --shapes 8192x8192x1024,16384x8192x1024,8192x8192x8192 \
  --reps 5 --trace --hint --nostore --commit "$(cat COMMIT_SNAP)"
gc_run list_hint 560 40 10 1 "x.*(engine  |hint)|geomean|rror" \
  /tmp/bi/bench/bench_gemm_bench --reps 20 --hint --commit "$(cat COMMIT_SNAP)"
gc_tar
