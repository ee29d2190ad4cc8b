#!/usr/bin/env bash
# Session 52, call CR: a last try with the ~340 s of device time left after the failed starts
# (the rest of it cannot be used later): the library and bench_gemm_bench only, then the claim
# lead of 1 beside the engine (kClaimLead 0) at the small-K shapes; then, if any time is left,
# the claimed-tile tests (test_gemm_dynamic.cu). Every step tars its logs, so a cut call still
# returns what ran.
set -u
source scripts/gpu_call.sh
gc_init CR
GC_BUILD_S=230 gc_build /tmp/br "gpu/test_gemm_dynamic.cu" bench_gemm_bench
gc_tar
gc_run small 300 40 8 1 "x.*(engine  |claim)|geomean" /tmp/br/bench/bench_gemm_bench \
  --shapes 8192x8192x1024,16384x8192x1024,8192x8192x512,8192x28672x1024 --reps 20 \
  --claimlead 1 --commit "$(cat COMMIT_SNAP)"
gc_tar
timeout 60 cmake --build /tmp/br -j"$(nproc)" --target mk_gpu_tests >"$GC_L/build_tests.log" 2>&1
echo "tests build rc=$? at $(gc_el)s"
gc_tests /tmp/br 'GemmDynamic.*' 400 30
gc_tar
