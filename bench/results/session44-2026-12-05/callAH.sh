#!/usr/bin/env bash
# Session 44, call AH: call AG cut to ~500 s (device starts kept failing, the
# budget left one call): the stand-alone GEMM GPU tests with pipeline 4 (192-column ping-pong
# units), the small-K shapes with every pipeline traced, then as much of the fused operators'
# tests (GemmFused*, FusedGemmColl*, *MoeFfn*: their compute roles through the epilogue as
# changed in sessions 42-43) as the call has left. No sanitizer, no default list, no moe_bench.
set -u
source scripts/gpu_call.sh
gc_init AH
GC_BUILD_S=270 gc_build /tmp/bn \
  "gpu/test_gemm.cu;gpu/test_gemm_trace.cu;gpu/test_gemm_fused.cu;gpu/test_fused_gemm_coll.cu;gpu/test_moe_ffn.cu;gpu/test_moe_ffn_fused.cu" \
  mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bn 'Gemm*:-GemmFused*' 310 40
mv "$GC_L/tests.log.gz" "$GC_L/tests_gemm.log.gz"
gc_run gemm_ping192 405 95 30 1 "x.*(engine  |pipeline|trace)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x512,8192x8192x1024,8192x8192x2048,8192x8192x4096 \
  --reps 12 --pipelines --trace --commit "$(cat COMMIT_SNAP)"
gc_tests /tmp/bn 'GemmFused*:FusedGemmColl*:*MoeFfn*' 495 200
gc_tar
