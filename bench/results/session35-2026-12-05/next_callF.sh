#!/usr/bin/env bash
# After next_callD.sh passed: the PyTorch MoE tests (4 ranks under MPS) on one node and on 2
# virtual nodes of 2, where the "fused" cases run session 35's fused kernel across nodes.
set -u
source scripts/gpu_call.sh
gc_init NF
GC_BUILD_S=200 gc_build /tmp/bn "gpu/test_moe_vnodes.cu" mkernel
gc_run torch_moe 585 560 60 0 "passed|failed|FAIL|rror" bash scripts/run_torch_tests.sh /tmp/bn \
  fused_moe fused_moe_vnodes
gc_tar
