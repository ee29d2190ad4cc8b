#!/usr/bin/env bash
# On call C's warm machine (its whole test binary): the fused operators' suites, MoE and ring
# attention (`*Fused*:*Moe*:*Attn*:*GemmColl*:-Gemm*`, session 51's call CB filter), the first run
# of them since session 51 at d0e141e: sessions 52-58 changed the GEMM engine under them.
set -u
source scripts/gpu_call.sh
gc_init D
gc_reuse /tmp/bt "gpu/*.cc;gpu/*.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bt '*Fused*:*Moe*:*Attn*:*GemmColl*:-Gemm*' 575 575
mv "$GC_L/tests.log.gz" "$GC_L/tests_fused_moe_attn.log.gz"
gc_tar
