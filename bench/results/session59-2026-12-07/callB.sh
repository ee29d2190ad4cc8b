#!/usr/bin/env bash
# Session 59 call B: a last try with the 322 s of device time left after the failed starts. Only
# the library and test_gemm_grouped.cu, then the grouped carried epilogue's tests and session 59's
# LastGroupEndsAtM (callA.sh stays the next session's first call).
set -u
source scripts/gpu_call.sh
gc_init B
GC_BUILD_S=280 gc_build /tmp/bf "gpu/test_gemm_grouped.cu" mk_gpu_tests
T=$(gc_el)
gc_tests /tmp/bf 'GemmGrouped.LastGroupEndsAtM:GemmGrouped.CarriedEpilogueSetting:GemmGrouped.RandomGroupsLayoutsTypes:GemmGrouped.DynamicTileClaim' $((T + 40)) 40
gc_tar
