#!/usr/bin/env bash
# Session 17 call B3 (candidate 2 = main + netfix + D=64 variants + xnode, WITHOUT the flat
# AllReduce, which B1 measured slower and failing when mixed): build; xnode and fused vnode
# suites; D=64 variants against cuDNN; fused_vs_nccl quick if time is left.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsB3; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsB3.tgz -C $OUT logsB3; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
G="$B/tests/mk_gpu_tests"
sum() { grep -E "FAILED  \]|^\[  PASSED  \] [0-9]+|Failure|inline group cut short" $1 | head -${2:-12}; }
timeout 150 $G --gtest_filter='FusedXnode*:FusedMatrix*Vnodes*:FusedMatrixProcsKill*:*HierInline64*:CommInitAgreed*' > $L/gt_xnode.log 2>&1; echo "gtest xnode+vnodes rc=$? at $(el)s"; sum $L/gt_xnode.log 20; tarup
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
for v in 0 1 4 2 3; do
  left=$(( 540 - $(el) )); [ $left -lt 50 ] && break
  MKERNEL_ATTN_D64_VARIANT=$v timeout 80 python3 bench/attn_bench.py single --lib $B/src/libmkernel.so --out $L/attn_v$v --seqs 4096,8192,16384,32768 --head-dims 64 --causal both --backends cudnn --reps 6 --target-ms 8 > $L/attn_v$v.log 2>&1
  echo "== d64 variant $v rc=$? at $(el)s"; grep -E "^\|" $L/attn_v$v/*.md | grep -v -- "---" | head -12; tarup
done
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
