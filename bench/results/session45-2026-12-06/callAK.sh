#!/usr/bin/env bash
# Session 45, call AK: bench_wgmma_rate again after its register split (call AJ's n192 x 2
# configuration failed to launch: 288 threads at 224 registers exceed the register file), then
# the traced small-K GEMMs with the new wait counters (full waits inside the consumers' main
# loops, the producer's empty waits): which side of the ring a slow k-step is on.
set -u
source scripts/gpu_call.sh
gc_init AK
timeout 150 nvcc -Iinclude -Isrc -I. -Ibench -gencode=arch=compute_90a,code=sm_90a \
  --expt-relaxed-constexpr -O3 -DNDEBUG -std=c++17 bench/wgmma_rate.cu -o /tmp/wgmma_rate \
  >"$GC_L/wr_build.log" 2>&1
echo "wgmma_rate build rc=$? at $(gc_el)s"
grep -m5 -iE "error|serializ" "$GC_L/wr_build.log"
gc_run wgmma_rate 130 110 10 1 "m64n|skipped|rror" /tmp/wgmma_rate --commit "$(cat COMMIT_SNAP)"
GC_BUILD_S=280 gc_build /tmp/bn "gpu/test_gemm_trace.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'GemmTrace*' 450 40
gc_run gemm_waits 580 120 30 1 "x.*(engine  |pipeline|trace)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x512,8192x8192x1024,8192x8192x2048,8192x8192x4096 \
  --reps 10 --pipelines --trace --commit "$(cat COMMIT_SNAP)"
gc_tar
