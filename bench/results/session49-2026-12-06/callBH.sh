#!/usr/bin/env bash
# Session 49, second call, right after callBG.sh on the warm machine (rebuilds /tmp/bt if the
# machine was not kept): the rest of the whole GPU suite, the collectives and everything else.
set -u
source scripts/gpu_call.sh
gc_init BH
if [ ! -x /tmp/bt/tests/mk_gpu_tests ]; then
  GC_BUILD_S=400 gc_build /tmp/bt "gpu/*.cc;gpu/*.cu" mk_gpu_tests
else
  export LD_LIBRARY_PATH=/tmp/bt/src MKERNEL_TIMEOUT_MS=20000
  echo "reusing /tmp/bt"
fi
gc_tests /tmp/bt '*Coll*:*Hier*:*Peer*:*Comm*:-*Fused*:*Moe*:*Gemm*:*Attn*' 400 400
mv "$GC_L/tests.log.gz" "$GC_L/tests_a.log.gz"
gc_tests /tmp/bt '*-*Coll*:*Hier*:*Peer*:*Comm*:*Fused*:*Moe*:*Gemm*:*Attn*' 590 300
mv "$GC_L/tests.log.gz" "$GC_L/tests_b2.log.gz"
gc_tar
