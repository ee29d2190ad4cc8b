#!/usr/bin/env bash
# Session 45, call AJ: session 44's call AI first (bench_wgmma_rate, nvcc alone), then the
# README's build with the stand-alone GEMM tests (the ping-pong tests as refactored onto
# forPingProblems after call AH), then session 41's moe_bench lead-in (4 processes under MPS,
# with and without --no-lead-in), which has not run since it was written.
set -u
source scripts/gpu_call.sh
gc_init AJ
timeout 150 nvcc -Iinclude -Isrc -I. -Ibench -gencode=arch=compute_90a,code=sm_90a \
  --expt-relaxed-constexpr -O3 -DNDEBUG -std=c++17 bench/wgmma_rate.cu -o /tmp/wgmma_rate \
  >"$GC_L/wr_build.log" 2>&1
echo "wgmma_rate build rc=$? at $(gc_el)s"
# A wgmma that ptxas serialises (its warning names it) would invalidate the rates.
grep -m5 -iE "error|serializ" "$GC_L/wr_build.log"
gc_run wgmma_rate 110 70 10 1 "m64n|skipped|rror" /tmp/wgmma_rate --commit "$(cat COMMIT_SNAP)"
GC_BUILD_S=270 gc_build /tmp/bn "gpu/test_gemm.cu" mk_gpu_tests mkernel
gc_tests /tmp/bn 'GemmCorrectness.PingPong*:GemmSmall*:GemmCorrectness.BothPipelines*' 420 60
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_mps_start
for lead in "" "--no-lead-in"; do
  name=moe${lead:+_nolead}_$(gc_el)
  gc_run "$name" 585 80 40 0 "^\||rror|MISMATCH" \
    python3 bench/moe_bench.py ffn --lib /tmp/bn/src/libmkernel.so --mps --nproc 4 \
    --shapes 7168:2048:256:8:2048 --reps 5 --budget 70 \
    --out "$GC_L/$name" $lead
done
gc_mps_stop
gc_tar
