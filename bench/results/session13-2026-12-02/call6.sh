#!/usr/bin/env bash
# Session 13 call 6: the ReduceScatter direct form for one rank per node (HierOps 2over2 and
# 3over3 are new), then fused_vs_nccl --quick (GEMM + ReduceScatter was 0.69x) and one more
# net_vs_nccl --quick sample.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs6; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs6.tgz -C $OUT logs6; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
timeout 100 $B/tests/mk_gpu_tests --gtest_filter='*HierOps*:*CollProcs*:*Vnodes*' > $L/gtest.log 2>&1; echo "gtest rc=$? at $(el)s"
grep -E "FAILED  \]|^\[  PASSED  \] [0-9]{2,}|Failure" $L/gtest.log | head -12; grep -E "OK \] .*(2over2|3over3)" $L/gtest.log | head -8; tarup
MK_FVN_BUDGET=90 timeout 110 bash bench/fused_vs_nccl.sh $B $L/fvn --quick > $L/fvn.log 2>&1; echo "fvn rc=$? at $(el)s"
grep -E "^\| " $L/fvn/fused_vs_nccl.md 2>/dev/null | cut -d'|' -f1-9 | head -14; tarup
MK_NVN_BUDGET=60 timeout 80 bash bench/net_vs_nccl.sh $B $L/nvn --quick --no-bound > $L/nvn.log 2>&1; echo "nvn rc=$? at $(el)s"
grep -E "^\| (allreduce|sendrecv) \| (8|4096|65536) \|" $L/nvn/net_vs_nccl.md | head -12 | cut -d'|' -f2-6; echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
