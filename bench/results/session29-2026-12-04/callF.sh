#!/usr/bin/env bash
# Session 29, call F (after the final read: zcPlan's size and switch rule is now one function,
# zcSizeAllows, shared with ncclGroupSimulateEnd's estimate): the zero-copy collectives and the
# estimate's GPU test.
set -u
source scripts/gpu_call.sh
gc_init F
GC_BUILD_S=200 gc_build /tmp/bf "gpu/test_coll_window.cc" mk_gpu_tests
gc_tests /tmp/bf 'CollSimulate.*:CollWindow.*' 300 60
