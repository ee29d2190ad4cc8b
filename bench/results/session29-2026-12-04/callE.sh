#!/usr/bin/env bash
# Session 29, call E (after the review's mends: the zero-copy AllGather / ReduceScatter price,
# a static_assert and comments in the attention kernel, parameter texts): the GPU tests those
# touch, at the final library.
set -u
source scripts/gpu_call.sh
gc_init E
GC_BUILD_S=300 gc_build /tmp/be "gpu/test_coll_window.cc;gpu/test_ring_attention.cu" mk_gpu_tests
gc_tests /tmp/be 'CollSimulate.*:RingAttn/RingAttnD128Variant.*:RingAttn/RingAttnSingle.*:RingAttn/RingAttnThreads.*' 400 150
