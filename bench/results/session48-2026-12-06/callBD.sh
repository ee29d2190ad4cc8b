#!/usr/bin/env bash
# Session 48, call BD: the carried epilogue for grouped GEMMs (pipeline 6 with groups: the MoE
# experts' GEMM, issue 13). GemmGrouped tests, then the issue's grouped shapes timed against the
# grouped default (the wide staging) and torch._grouped_mm (bench/grouped_bench.py).
set -u
source scripts/gpu_call.sh
gc_init BD
GC_BUILD_S=300 gc_build /tmp/bn "gpu/test_gemm_grouped.cu;gpu/test_gemm.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'GemmGrouped*:GemmSmall*' 330 60
for s in "16 131072x1408x2048" "32 131072x2048x7168" "32 131072x7168x2048" "64 131072x1408x2048"; do
  set -- $s
  gc_run "grouped_$1_$2" 470 40 10 1 "grouped|rror" \
    /tmp/bn/bench/bench_gemm_bench --groups "$1" --shapes "$2" --reps 10 --pipelines --carry \
    --commit "$(cat COMMIT_SNAP)"
done
gc_run torch_grouped 590 110 30 0 "^\||target|rror" \
  python3 bench/grouped_bench.py --build /tmp/bn --rounds 2 --reps 10 --out "$GC_L"
gc_tar
