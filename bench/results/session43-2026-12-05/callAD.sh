#!/usr/bin/env bash
# Session 43, call AD: the fused operators' compute roles through the epilogue as changed in
# sessions 42-43 (alpha == 1 without the multiply, issueBoxStores; the store threads are the
# stand-alone kernel's only): the GEMM + collective, GEMM hooks and MoE FFN GPU tests, which
# calls Y, Z and AB did not build.
set -u
source scripts/gpu_call.sh
gc_init AD
GC_BUILD_S=230 gc_build /tmp/bn \
  "gpu/test_gemm_fused.cu;gpu/test_fused_gemm_coll.cu;gpu/test_moe_ffn.cu;gpu/test_moe_ffn_fused.cu" \
  mk_gpu_tests
gc_tests /tmp/bn 'GemmFused*:FusedGemmColl*:*MoeFfn*' 470 240
gc_tar
