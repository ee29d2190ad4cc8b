#!/usr/bin/env bash
# For the next session's first call: session 34's changes, written without a GPU (none was
# lent): the windows' size agreement (MoeProcsMismatch and every processes-layout fused MoE
# suite, whose windows it creates), ring attention's per-reader readBy words (RingAttnProcs in
# every mode, the new RingAttnProcsAbort, and the clique layout's threads, graph and abort
# suites, whose copy role's code moved), the comm lifecycle tests (session 34's teardown and
# API changes) and the cost model's rate measurement (rewritten on a private stream); then
# next_callB.sh and next_callC.sh on the warm machine.
set -u
source scripts/gpu_call.sh
gc_init NA
GC_BUILD_S=330 gc_build /tmp/bn \
  "gpu/test_ring_attention_procs.cu;gpu/test_ring_attention.cu;gpu/test_moe_procs.cu;gpu/test_comm.cc;gpu/test_gemm_fused.cu" \
  mk_gpu_tests mkernel bench_share_bench
# Ranks as processes only under MPS; several ranks of one process only without it.
gc_mps_start
gc_tests /tmp/bn '*RingAttnProcs*:MoeProcsMismatch.*:MoeProcsFused.*:MoeProcs.TwoProcesses' 430 200
mv "$GC_L/tests.log.gz" "$GC_L/tests_procs.log.gz"
gc_mps_stop
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
gc_tests /tmp/bn '*/RingAttnThreads.*:*/RingAttnGraph.*:*/RingAttnAbort.*:CommLifecycle.*:GemmFused.DeviceRatesMeasuredAndCached' 585 150
gc_tar
