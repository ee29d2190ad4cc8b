#!/usr/bin/env bash
# Session 50, second call (after callCA.sh on the warm machine): the fused operators' suites,
# MoE and ring attention (`*Fused*:*Moe*:*Attn*:*GemmColl*:-Gemm*`).
set -u
source scripts/gpu_call.sh
gc_init CB
gc_reuse /tmp/bt "gpu/*.cc;gpu/*.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bt '*Fused*:*Moe*:*Attn*:*GemmColl*:-Gemm*' 592 592
mv "$GC_L/tests.log.gz" "$GC_L/tests_fused_moe_attn.log.gz"
gc_tar
