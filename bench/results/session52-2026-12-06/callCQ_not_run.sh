#!/usr/bin/env bash
# Session 52, call CQ (NOT RUN, and not to be run: it needs --claimlead, removed after call CR
# measured no gain; every device start after CP2 failed): the producer's claim of
# its next tile issued one k-step before its tile's last load (--claimlead 1) against the
# engine's claim after it (kClaimLead 0): small-K shapes (timed, and soaked with nvidia-smi
# beside), the GEMM tests, the default list.
set -u
source scripts/gpu_call.sh
gc_init CQ
GC_BUILD_S=330 gc_build /tmp/bq "gpu/test_gemm*.cu;gpu/test_gemm*.cc" bench_gemm_bench mk_gpu_tests
S=8192x8192x1024,8192x8192x512,16384x8192x1024,8192x28672x1024,4096x4096x1024,8192x4096x1024
gc_run small1 390 30 10 1 "x.*(engine  |claim)|geomean" /tmp/bq/bench/bench_gemm_bench \
  --shapes $S --reps 30 --claimlead 1 --commit "$(cat COMMIT_SNAP)"
gc_tests /tmp/bq 'Gemm*' 405 15
timeout 45 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv -lms 100 >"$GC_L/smi.csv" 2>&1 &
gc_run soak 440 35 20 1 "soak|rror" /tmp/bq/bench/bench_gemm_bench \
  --shapes 16384x8192x1024,8192x8192x1024 --reps 5 --soak 3 --claimlead 1 \
  --commit "$(cat COMMIT_SNAP)"
gc_run list 480 40 15 1 "x.*engine  |geomean" /tmp/bq/bench/bench_gemm_bench --reps 15 \
  --claimlead 1 --commit "$(cat COMMIT_SNAP)"
gc_run small2 500 20 8 1 "x.*(engine  |claim)|geomean" /tmp/bq/bench/bench_gemm_bench \
  --shapes $S --reps 30 --claimlead 1 --commit "$(cat COMMIT_SNAP)"
gc_tar
