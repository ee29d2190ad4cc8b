#!/usr/bin/env bash
# Session 60 call C (410 s of device time left: no room for the bench build). The new default
# rule for grouped GEMMs (MKERNEL_GEMM_GROUP_CARRY 2: the carried epilogue at K > 4096 or
# N >= 4096) on the GPU: GemmGrouped.CarriedEpilogueSetting with its default-setting block
# (K 4160 and N 4096 carried, 1408 x 200 on the tiles), and the automatic choice in
# LastGroupEndsAtM; the library and test_gemm_grouped.cu only.
set -u
source scripts/gpu_call.sh
gc_init C
GC_BUILD_S=290 gc_build /tmp/bf "gpu/test_gemm_grouped.cu" mk_gpu_tests
gc_tar
T=$(gc_el)
gc_tests /tmp/bf 'GemmGrouped.CarriedEpilogueSetting:GemmGrouped.LastGroupEndsAtM' $((T + 25)) 25
gc_tar
