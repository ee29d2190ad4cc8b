#!/usr/bin/env bash
# Session 12 call 1: first GPU run of branch s11-wip (scratch pool, MoE SwiGLU epilogue):
# the suites that exercise them, then the MoE and ring-attention benchmarks (before: session 11).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs1; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs1.tgz -C $OUT logs1; }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build build -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$PWD/build/src:${LD_LIBRARY_PATH:-}
timeout 200 build/tests/mk_gpu_tests --gtest_filter='ScratchPool.*:GemmGrouped*:GemmCorrect*:*Moe*:*RingAttn*:*FusedGemmColl*:CollGraph*' > $L/gtest.log 2>&1; echo "gtest rc=$? at $(el)s"
grep -E "FAILED  \]|PASSED|Failure|Which is|expected" $L/gtest.log | head -20; grep -cE "OK \]" $L/gtest.log; tarup
MKERNEL_MOE_SWIGLU_EPILOGUE=0 timeout 60 build/tests/mk_gpu_tests --gtest_filter='MoeFfn*' > $L/gtest_noswiglu.log 2>&1; echo "gtest MoeFfn without the SwiGLU epilogue rc=$? at $(el)s"; tail -3 $L/gtest_noswiglu.log
MK_TORCH_BUDGET=60 timeout 90 bash scripts/run_torch_tests.sh build fused_moe ring_attention > $L/torch.log 2>&1; echo "torch rc=$? at $(el)s"; tail -4 $L/torch.log; tarup
timeout 150 python3 bench/moe_bench.py ffn --lib build/src/libmkernel.so --out $L/moe_ffn --mps --nproc 4 --budget 120 > $L/moe_ffn.log 2>&1; echo "moe ffn rc=$? at $(el)s"
grep -E "^\| |rror" $L/moe_ffn.log | head -12; tail -2 $L/moe_ffn.log
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
left=$(( 560 - $(el) )); echo "ring budget ${left}s"
[ $left -gt 60 ] && timeout $left python3 bench/attn_bench.py ring --lib build/src/libmkernel.so --out $L/ring --mps --nproc 4 --head-dims 128 --budget $(( left - 20 )) > $L/ring.log 2>&1; echo "ring rc=$? at $(el)s"
grep -E "^\| |rror" $L/ring.log | head -14; tail -2 $L/ring.log
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
