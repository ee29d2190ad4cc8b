#!/usr/bin/env bash
# Session 45, call AK: bench_wgmma_rate again after its register split (call AJ's n192 x 2
# configuration failed to launch: 288 threads at 224 registers exceed the register file).
set -u
source scripts/gpu_call.sh
gc_init AK
timeout 150 nvcc -Iinclude -Isrc -I. -Ibench -gencode=arch=compute_90a,code=sm_90a \
  --expt-relaxed-constexpr -O3 -DNDEBUG -std=c++17 bench/wgmma_rate.cu -o /tmp/wgmma_rate \
  >"$GC_L/wr_build.log" 2>&1
echo "wgmma_rate build rc=$? at $(gc_el)s"
grep -m5 -iE "error|serializ" "$GC_L/wr_build.log"
gc_run wgmma_rate 150 120 10 1 "m64n|skipped|rror" /tmp/wgmma_rate --commit "$(cat COMMIT_SNAP)"
gc_tar
