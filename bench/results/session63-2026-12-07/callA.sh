#!/usr/bin/env bash
# Session 63, call A (session 62's next_callA.sh).
# 1. The full build (fp16 on) with the GEMM units split by B layout and kind (plain / grouped,
#    24 gemm_inst_*.cu) and the fused GEMM + collectives' by kernel (reduce / gather, 8
#    fused_inst_*.cu): built on the CPU machine only so far. build_times.log tells whether the
#    wall time fell below session 62's 161 s (there the slowest units were 140-144 s).
# 2. Every test of the GEMM engine's files (Gemm*: the split moved every kernel into new units).
# 3. grouped_bench at issue 13's four shapes, the default only, five rounds: session 62's two
#    calls on H100s read 0.942 / 0.946 and 1.005 / 1.041 at 7168 -> 2048 and 2048 -> 1408.
# 4. The fused MoE layer against its sequential path, 4 ranks as threads, H 7168 (its sequential
#    GEMM2 has an fp32 D, so the units' default does not reach it; a check, not a change).
set -u
source scripts/gpu_call.sh
gc_init A
GC_BUILD_S=300 gc_build /tmp/bf "gpu/test_gemm*.cu" mk_gpu_tests bench_gemm_bench \
  bench_moe_threads_bench
head -8 "$GC_L/build_times.log"
gc_tar
T=$(gc_el)
gc_tests /tmp/bf 'Gemm*' $((T + 120)) 120
S=32:4096:7168:2048,16:8192:2048:1408,32:4096:2048:7168,64:1024:1408:2048
gc_run grouped $((T + 210)) 90 10 0 "^\||rror" python3 bench/grouped_bench.py --build /tmp/bf \
  --shapes $S --out "$GC_L/grouped" --rounds 5 --reps 10
gc_moe_bench /tmp/bf ffn4 $((T + 300)) 90 --ffn --ranks 4 --reps 3 --warmup 1 --trials 3 \
  --shapes 7168:2048:256:8:4096
gc_tar
