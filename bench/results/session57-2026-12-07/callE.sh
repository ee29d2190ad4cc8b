#!/usr/bin/env bash
# Session 57 call E: the fused GEMM + collective tests over the engine as changed this session
# (their sequential path runs pipeline 0, which walks units with the staged epilogue at small K).
set -u
source scripts/gpu_call.sh
gc_init E
GC_BUILD_S=290 gc_build /tmp/bd "gpu/test_fused_gemm_coll.cu;gpu/test_fused_matrix_threads.cu" mk_gpu_tests
gc_tar
T=$(gc_el)
gc_tests /tmp/bd 'FusedGemmColl*:*FusedMatrix*' $((T + 70)) 70
gc_tar
