#!/usr/bin/env bash
# Session 30, call F: call E (ncu) found the transposed tall tail reading 1.8x the DRAM bytes of
# the wide-only kernel (1.28 against 0.71 GB, L2 hit rate 72 against 84 %): with 44 tiles a band
# and 132 CTAs the static schedule gave every band's tall tiles to the same 12 CTAs, which fell
# behind (a tall tile's epilogue is slower) until their A rows had left L2. Now a full band's
# tile list is rotated by groupM / 2 places a band. The grouped GEMM tests, then the grouped
# GEMM against torch._grouped_mm with the tall tail off and on, alternating.
set -u
source scripts/gpu_call.sh
gc_init F
GC_BUILD_S=200 gc_build /tmp/bf "gpu/test_gemm_grouped.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bf 'GemmGrouped*' 200 40
S="16:8192:2048:1408,64:2048:2048:1408"
i=0
for tall in 0 1 0 1; do
  i=$((i + 1))
  MKERNEL_GEMM_TALL_TAIL=$tall gc_run "grouped${i}_t$tall" 270 30 12 0 "^\| [0-9]|rror" \
    python3 bench/grouped_bench.py --build /tmp/bf --out "$GC_L/g_t$tall" --shapes "$S" --rounds 2
done
gc_tar
