#!/usr/bin/env bash
# Session 19 call D (fresh snapshot of 2a1c489, cold machine): build with the README's cmake
# commands; the two tests call A failed (FusedXnodeChoice: auto never reached the xnode rule;
# GemmDynamic: invalid [K,N] cases), both fixed, with the rest of the xnode suites; the GEMM
# engine's static path after the dynamic-claim change (bench_gemm_bench vs cuBLAS); the fused MoE
# dispatch + GEMM with the dynamic claim against sequential; fused_vs_nccl on small and mid shapes
# (ncclFusedAuto across nodes); ring attention across 2 virtual nodes as time allows.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsD; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsD.tgz -C $OUT logsD; }
B=$(pwd)/build
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head -5
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
timeout -k 5 150 $B/tests/mk_gpu_tests --gtest_filter='FusedXnode*:GemmDynamic.*:GemmGrouped.DynamicTileClaim' > $L/gtest.log 2>&1; echo "gtest rc=$? at $(el)s"
grep -E "^\[  (PASSED|FAILED)  \]|^\[  FAILED  \] [A-Za-z]|Failure" $L/gtest.log | head -12; tarup
timeout 90 $B/bench/bench_gemm_bench --shapes 8192x8192x1024,8192x8192x8192 --reps 10 --out $L/gemm.json > $L/gemm.log 2>&1; echo "gemm bench rc=$? at $(el)s"; grep -vE "^\s*$" $L/gemm.log | tail -8; tarup
timeout 150 $B/bench/bench_moe_threads_bench --ranks 4 --out $L/moe_threads.json > $L/moe_threads.log 2>&1; echo "moe threads rc=$? at $(el)s"; tail -5 $L/moe_threads.log; tarup
left=$(( 470 - $(el) ))
[ $left -gt 60 ] && MK_FVN_BUDGET=$(( left - 25 )) timeout $left bash bench/fused_vs_nccl.sh $B $L/fvn --shapes "ar:1024x1024x1024,ar:4096x4096x1024,ar:2048x8192x8192,rs:1024x1024x1024,rs:4096x4096x1024,rs:2048x8192x8192,ag:2048x128x2048,ag:2048x256x2048,ag:4096x256x4096,ag:8192x512x8192" > $L/fvn.log 2>&1; echo "fvn rc=$? at $(el)s"
grep -E "^\| gemm|^\| allgather" $L/fvn/fused_vs_nccl.md | cut -d'|' -f2-8,12 | head -12; tarup
left=$(( 575 - $(el) ))
[ $left -gt 70 ] && timeout $left python3 bench/attn_bench.py ring --lib $B/src/libmkernel.so --out $L/ringx --mps --nproc 2 --nodes 2 --head-dims 128 --seqs 16384,32768 --reps 5 --no-single-rank --budget $(( left - 25 )) > $L/ringx.log 2>&1; echo "ring xnode rc=$? at $(el)s"
grep -E "TFLOP|target|x torch|MISMATCH" $L/ringx.log | tail -12
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
