#!/usr/bin/env bash
# Session 56, call J (session 55's unrun call J, two rounds a side): does the operands' distribution decide issue 13's torch comparison? Call I
# found three different grouped kernels at the same 636.6 TFLOP/s (131072x7168x2048, H100): a
# power-limited clock, which depends on the operand bits. grouped_bench.py drew torch's operands
# from N(0, 1) and the engine's from U[-1, 1). Here torch on U[-1, 1) (the new default), then
# N(0, 1), two rounds each, the engine's side unchanged.
set -u
source scripts/gpu_call.sh
gc_init J
GC_BUILD_S=300 gc_reuse /tmp/bd "gpu/test_gemm_grouped.cu" mk_gpu_tests bench_gemm_bench
gc_tar
T=$(gc_el)
gc_run uniform $((T + 85)) 85 20 0 "^\||rror" python3 bench/grouped_bench.py \
  --build /tmp/bd --out "$GC_L/uniform" --rounds 2 --reps 10 --dist uniform
gc_run normal $((T + 170)) 85 20 0 "^\||rror" python3 bench/grouped_bench.py \
  --build /tmp/bd --out "$GC_L/normal" --rounds 2 --reps 10 --dist normal
gc_tar
