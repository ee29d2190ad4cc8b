#!/usr/bin/env bash
# Session 49: the fused GEMM + collective tests, whose sequential paths call gemm::launch
# plainly and so now run the carried epilogue at K = 8192 too (cases in FusedGemmCollHelpers
# and others). Gemm* passed in call BI at the same library code.
set -u
source scripts/gpu_call.sh
gc_init BJ
GC_BUILD_S=330 gc_build /tmp/bn "gpu/test_fused_gemm_coll.cu;gpu/test_fused_matrix.cu;gpu/test_gemm_fused.cu" \
  mk_gpu_tests
gc_tests /tmp/bn 'FusedGemmColl*:FusedMatrix*:GemmFused*' 420 90
gc_tar
