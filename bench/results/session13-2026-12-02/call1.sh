#!/usr/bin/env bash
# Session 13 call 1: first GPU run of branch s12-procs (main + s12-wip + the fused kernels'
# processes layouts): GEMM CTA pairs, fused GEMM+collectives and ring attention in processes,
# the sequential GEMMs on all SMs, inter-node fast paths (helper-40). Build into ../build-dev
# (repo root on the device, ignored, kept between calls while the machine stays warm).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs1; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
left() { echo $(( 560 - $(el) )); }
tarup() { tar -czf $OUT/logs1.tgz -C $OUT logs1; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
# Pairs first, alone and bounded: a protocol bug shows as a hang here, not in the suites after.
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=FUSED timeout 90 $B/tests/mk_gpu_tests --gtest_filter='GemmCorrectness.ClusterPairs' > $L/gtest_pairs.log 2>&1; echo "pairs rc=$? at $(el)s"; grep -E "Failure|FAILED|PASSED|Which is|CTA pairs" $L/gtest_pairs.log | sort | uniq -c | head -12
timeout 70 $B/bench/bench_gemm_bench --shapes 8192x8192x512,8192x8192x1024,8192x8192x2048,8192x8192x8192 --reps 12 --clusters --pipelines --out $L/gemm_pairs.json > $L/gemm_pairs.log 2>&1; echo "gemm pairs rc=$? at $(el)s"; grep -E "CTA pairs|pipeline deep|^\| [0-9]|geomean" $L/gemm_pairs.log | head -16; tarup
# The processes layouts (ranks as processes, ncclFusedFused): their suites, bounded.
timeout 190 $B/tests/mk_gpu_tests --gtest_filter='*FusedMatrixProcs*:*RingAttnProcs*' > $L/gtest_procs.log 2>&1; echo "procs rc=$? at $(el)s"; grep -E "FAILED  \]|^\[  PASSED|FAIL |OK \]" $L/gtest_procs.log | head -16; tarup
t=$(left); [ $t -gt 150 ] && t=150
[ $t -gt 20 ] && timeout $t $B/tests/mk_gpu_tests --gtest_filter='Gemm*:*Hier*:*DevComm*:*CollProcs*:*Vnodes*:*CollP2p*:*CollThreadRanks*:*FusedGemmColl*:*Moe*:*RingAttn*:-*FusedMatrixProcs*:*RingAttnProcs*:GemmCorrectness.ClusterPairs' > $L/gtest.log 2>&1; echo "gtest rc=$? at $(el)s"
grep -E "FAILED  \]|^\[  PASSED|Failure" $L/gtest.log | head -12; tarup
t=$(left); [ $t -gt 60 ] && t=60
[ $t -gt 15 ] && (cd $B && timeout $t ctest -L mp -R 'Proxy|Net|Socket' > $L/ctest_mp.log 2>&1); echo "ctest mp net rc=$? at $(el)s"; grep -E "tests passed|Failed|Timeout" $L/ctest_mp.log | head
tarup
