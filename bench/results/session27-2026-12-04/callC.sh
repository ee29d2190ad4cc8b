#!/usr/bin/env bash
# Session 27, call C: the README's Release build of the library with the GEMM and MoE GPU test
# files, bench_moe_threads_bench and bench_gemm_bench; the tests of the fused MoE layer (new),
# the sequential layer, the fused dispatch + GEMM, the GEMM engine (its consumer and producer
# were factored into helpers that the new two-GEMM chain shares) and the fused GEMM +
# collectives (tileDone per tile); then the layer fused vs sequential, and the engine against
# cuBLAS at two shapes (the refactor must not cost speed).
set -u
source scripts/gpu_call.sh
gc_init C
T="gpu/test_moe_ffn_fused.cu;gpu/test_moe_ffn.cu;gpu/test_moe_fused.cu;gpu/test_gemm*.cu"
T="$T;gpu/test_fused_gemm_coll.cu"
GC_BUILD_S=300 gc_build /tmp/bc "$T" mk_gpu_tests bench_moe_threads_bench bench_gemm_bench
gc_tests /tmp/bc '*MoeFfnFused*' 400 120
mv "$GC_L/tests.log.gz" "$GC_L/tests_ffnfused.log.gz"
gc_tests /tmp/bc '*MoeFfn*:*MoeFused*:Gemm*:*FusedGemmColl*' 480 150
mv "$GC_L/tests.log.gz" "$GC_L/tests_rest.log.gz"
left=$(gc_left 560 80)
timeout "$left" /tmp/bc/bench/bench_moe_threads_bench --ffn --ranks 4 --reps 5 --warmup 1 \
  --trials 3 --out "$GC_L/moe_ffn.json" > "$GC_L/moe_ffn.log" 2>&1
echo "moe_ffn rc=$? at $(gc_el)s"; grep -E "speedup|FAIL" "$GC_L/moe_ffn.log"
gc_tar
left=$(gc_left 590 30)
timeout "$left" /tmp/bc/bench/bench_gemm_bench --reps 10 --shapes 8192x8192x1024,8192x8192x8192 \
  > "$GC_L/gemm.log" 2>&1
echo "gemm rc=$? at $(gc_el)s"; tail -6 "$GC_L/gemm.log"
gc_tar
