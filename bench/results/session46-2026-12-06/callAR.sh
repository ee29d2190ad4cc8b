#!/usr/bin/env bash
# Session 46, call AR: the epilogue that stores D from the accumulators (GemmArgs::regStores,
# new, first GPU run). Call AP's traces showed the deep ring's main loop near the tensor cores'
# rate (~1050 cycles a k-step, pairs and unpaired) but a 2.1 us epilogue whose TMA stores wait
# behind the next tile's loads. Its test first, then the small-K shapes with every variant and
# traces (deep and its pairs, with and without register stores), then the default list.
set -u
source scripts/gpu_call.sh
gc_init AR
GC_BUILD_S=300 gc_build /tmp/bn "gpu/test_gemm.cu;gpu/test_gemm_trace.cu" mk_gpu_tests \
  bench_gemm_bench
gc_tests /tmp/bn 'GemmCorrectness.RegisterStores:GemmSmall*:GemmCorrectness.BothPipelines:GemmCorrectness.ClusterPairs:GemmTrace*' 380 80
gc_run gemm_reg 470 90 20 1 "x.*(engine  |pipeline|pairs|trace|register)|rror" \
  /tmp/bn/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x2048,8192x8192x4096 \
  --reps 10 --pipelines --clusters --trace --regstores --commit "$(cat COMMIT_SNAP)"
gc_run gemm_reg_list 580 100 15 1 "x.*(engine  |register)|geomean|rror" \
  /tmp/bn/bench/bench_gemm_bench --reps 8 --regstores --clusters --commit "$(cat COMMIT_SNAP)"
gc_tar
