#!/usr/bin/env bash
# The units' own band (MKERNEL_GEMM_GROUP_UNIT_BAND 2, after call C's sweep): GemmGrouped (its
# pipeline 4 cases and UnitWalkSetting now walk bands of 2), then grouped_bench.py against
# torch._grouped_mm with the units (MKERNEL_GEMM_GROUP_UNITS=1) and with the default tiles.
set -u
source scripts/gpu_call.sh
gc_init E
GC_BUILD_S=235 gc_build /tmp/be "gpu/test_gemm_grouped.cu" mk_gpu_tests bench_gemm_bench
gc_tar
T=$(gc_el)
gc_tests /tmp/be 'GemmGrouped*' $((T + 30)) 30
gc_run units $((T + 60)) 30 10 0 "^\||rror" env MKERNEL_GEMM_GROUP_UNITS=1 \
  python3 bench/grouped_bench.py --build /tmp/be --out "$GC_L/units" --rounds 2 --reps 10
gc_run tiles $((T + 90)) 30 10 0 "^\||rror" python3 bench/grouped_bench.py \
  --build /tmp/be --out "$GC_L/tiles" --rounds 2 --reps 10
gc_tar
