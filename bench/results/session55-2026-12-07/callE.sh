#!/usr/bin/env bash
# Session 55, call E (session 54's unrun call E, unchanged): the grouped GEMM's L2 choices (issue 13's grouped target: >= 1.0 of
# torch._grouped_mm; session 48's 0.948 at 32 x 4096, 2048 -> 7168). Call DA found the grouped GEMM
# at 0.926 of the plain engine on the same total shape (131072 x 7168 x 2048): plain GEMMs walk
# bands of 32 row blocks and store D evict-first at small K and claim tiles; grouped ones walk bands
# of 8 (each 4096-row expert's 29 MB of weights read four times while D streams through L2).
# 1. bench_gemm_bench --groups with --groupm / --hint / --claim: the variants interleaved in one
#    process, each checked element by element against the grouped default.
# 2. grouped_bench.py (torch._grouped_mm side by side) with the settings on, then the default.
# 3. GemmGrouped.* (BandsAndStoreHint new).
set -u
source scripts/gpu_call.sh
gc_init E
GC_BUILD_S=300 gc_build /tmp/bd "gpu/test_gemm_grouped.cu" bench_gemm_bench
gc_tar
T=$(gc_el)
B=/tmp/bd/bench/bench_gemm_bench
C=$(cat COMMIT_SNAP)
gc_run g32 $((T + 60)) 60 10 1 "grouped|x.*engine  " $B --groups 32 --claim --groupm 32 --hint \
  --shapes 131072x7168x2048,131072x2048x7168 --reps 8 --commit "$C"
gc_run g16 $((T + 100)) 40 10 1 "grouped|x.*engine  " $B --groups 16 --claim --groupm 64 --hint \
  --shapes 131072x1408x2048 --reps 8 --commit "$C"
gc_run torch_on $((T + 190)) 100 30 0 "^\||rror" env MKERNEL_GEMM_GROUP_BAND=64 \
  MKERNEL_GEMM_GROUP_HINT=1 MKERNEL_GEMM_GROUP_CLAIM=1 python3 bench/grouped_bench.py \
  --build /tmp/bd --out "$GC_L/torch_on" --rounds 1 --reps 10
gc_run torch_off $((T + 280)) 100 30 0 "^\||rror" python3 bench/grouped_bench.py \
  --build /tmp/bd --out "$GC_L/torch_off" --rounds 1 --reps 10
# 3. The grouped tests, BandsAndStoreHint among them (the settings explicit and automatic).
timeout $(gc_left $((T + 360)) 100) cmake --build /tmp/bd -j"$(nproc)" --target mk_gpu_tests \
  >"$GC_L/build_tests.log" 2>&1
echo "tests build rc=$? at $(gc_el)s"
gc_tests /tmp/bd 'GemmGrouped.*' $((T + 400)) 40
gc_tar
