#!/usr/bin/env bash
# Session 10 call A: the unmeasured tile-order, ctaFailed and hierarchical-AllReduce commits on
# the GPU; attention tile order 1 vs 0; inter-node AllReduce vs NCCL (quick); first GPU runs of
# the ring-attention and MoE benchmarks.
export PATH=/usr/local/cuda/bin:$PATH
L=$OUT/logs; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
tarup() { tar -czf $OUT/logs.tgz -C $OUT logs; }
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/build.log 2>&1 && cmake --build build-gpu -j16 >> $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
B=build-gpu/tests/mk_gpu_tests
export LD_LIBRARY_PATH=$PWD/build-gpu/src:${LD_LIBRARY_PATH:-}
timeout 120 $B --gtest_filter='*RingAttn*:*Moe*:*Abort*:*HierAllReduce*:*HierOps*:*HierKill*' > $L/gtest.log 2>&1; echo "gtest rc=$? at $(el)s"
grep -E "FAILED  \]|PASSED|Failure|Which is" $L/gtest.log | head -12; grep -cE "OK \]" $L/gtest.log; tarup
for o in 1 0; do
  MKERNEL_ATTN_TILE_ORDER=$o timeout 70 python3 bench/attn_bench.py single --lib build-gpu/src/libmkernel.so --out $L/attn_o$o --backends cudnn --budget 50 > $L/attn_o$o.log 2>&1; echo "attn o=$o rc=$? at $(el)s"
  grep -E "^\| [0-9]" $L/attn_o$o.log; tail -1 $L/attn_o$o.log; tarup
done
MK_NVN_BUDGET=120 timeout 150 bash bench/net_vs_nccl.sh build-gpu $L/nvn --quick --no-bound > $L/nvn.log 2>&1; echo "nvn rc=$? at $(el)s"
grep -E "^\| (allreduce|sendrecv)|^## " $L/nvn/net_vs_nccl.md | head -30; tail -3 $L/nvn.log; tarup
timeout 80 python3 bench/attn_bench.py ring --lib build-gpu/src/libmkernel.so --out $L/ring --mps --nproc 4 --head-dims 128 --budget 50 > $L/ring.log 2>&1; echo "ring rc=$? at $(el)s"
grep -E "^\| |rror" $L/ring.log | head -30; tail -3 $L/ring.log; tarup
left=$(( 575 - $(el) )); echo "moe budget ${left}s"
[ $left -gt 40 ] && timeout $left python3 bench/moe_bench.py ffn --lib build-gpu/src/libmkernel.so --out $L/moe_ffn --mps --nproc 4 --budget $(( left - 25 )) > $L/moe_ffn.log 2>&1; echo "moe ffn rc=$? at $(el)s"
grep -E "^\| |rror" $L/moe_ffn.log | head -24; tail -2 $L/moe_ffn.log
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
