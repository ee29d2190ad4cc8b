#!/usr/bin/env bash
# Session 29, call D (the final library): the GPU tests of this session's other changes, at the
# session's final code: ncclGroupSimulateEnd's zero-copy pricing (CollSimulate), the zero-copy
# collectives it prices (CollWindow), ncclFusedAuto's in-clique rule through one predicate
# (FusedGemmColl*, incl. FusedGemmCollAuto), and both head-dim-128 attention variants.
set -u
source scripts/gpu_call.sh
gc_init D
T="gpu/test_coll_window.cc;gpu/test_fused_gemm_coll.cu;gpu/test_ring_attention.cu"
GC_BUILD_S=300 gc_build /tmp/bd "$T" mk_gpu_tests
gc_tests /tmp/bd 'CollSimulate.*:CollWindow.*:*FusedGemmColl*:RingAttn/RingAttnD128Variant.*:RingAttn/RingAttnSingle.*' 560 300
