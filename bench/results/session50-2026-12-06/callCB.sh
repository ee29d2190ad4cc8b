#!/usr/bin/env bash
# Session 50, second call (after callCA.sh on the warm machine): the fused operators' suites,
# MoE and ring attention (`*Fused*:*Moe*:*Attn*:*GemmColl*:-Gemm*`).
set -u
source scripts/gpu_call.sh
gc_init CB
if [ ! -x /tmp/bt/tests/mk_gpu_tests ]; then
  echo "no /tmp/bt: the machine was not kept; building"
  GC_BUILD_S=450 gc_build /tmp/bt "gpu/*.cc;gpu/*.cu" mk_gpu_tests bench_gemm_bench
else
  export LD_LIBRARY_PATH=/tmp/bt/src MKERNEL_TIMEOUT_MS=20000
  echo "reusing /tmp/bt"
fi
gc_tests /tmp/bt '*Fused*:*Moe*:*Attn*:*GemmColl*:-Gemm*' 592 592
mv "$GC_L/tests.log.gz" "$GC_L/tests_fused_moe_attn.log.gz"
gc_tar
