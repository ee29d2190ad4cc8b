#!/usr/bin/env bash
# Second half of session 57's next_callF, on call A's warm machine: grouped_bench.py against
# torch._grouped_mm, the grouped default (tiles) and then the unit walk
# (MKERNEL_GEMM_GROUP_UNITS=1 reaches the engine's subprocess), three rounds each.
set -u
source scripts/gpu_call.sh
gc_init B
gc_reuse /tmp/bd "gpu/test_gemm*.cu;gpu/test_fused_gemm_coll.cu" mk_gpu_tests bench_gemm_bench
T=$(gc_el)
gc_run tiles $((T + 110)) 110 20 0 "^\||rror" python3 bench/grouped_bench.py \
  --build /tmp/bd --out "$GC_L/tiles" --rounds 3 --reps 10
gc_run units $((T + 220)) 110 20 0 "^\||rror" env MKERNEL_GEMM_GROUP_UNITS=1 \
  python3 bench/grouped_bench.py --build /tmp/bd --out "$GC_L/units" --rounds 3 --reps 10
gc_tar
