#!/usr/bin/env bash
# Session 16 call C2 (cold again; same snapshot f4b2d43): rebuild; the remaining inter-node
# suites with MKERNEL_PROXY_INLINE_CMD=2 (for a later default flip); ring attention with 4
# processes on the GPU (MPS) after the causal-bound walk: zigzag, causal and not,
# auto/fused/sequential vs torch (all_gather + SDPA) and the 1-rank kernel, total S 16K-64K.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsC2; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsC2.tgz -C $OUT logsC2; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 --target mkernel mk_gpu_tests > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
MKERNEL_PROXY_INLINE_CMD=2 timeout 90 $B/tests/mk_gpu_tests --gtest_filter='*CollProcs*:*Vnodes*' > $L/gtest_inline2.log 2>&1; echo "gtest inline=2 rc=$? at $(el)s"
grep -E "FAILED  \]|^\[  PASSED  \] [0-9]+|Failure" $L/gtest_inline2.log | head -8; tarup
left=$(( 440 - $(el) )); echo "left ${left}s"
[ $left -gt 60 ] && timeout $left python3 bench/attn_bench.py ring --lib $B/src/libmkernel.so --out $L/ring --mps --nproc 4 --layout zigzag --seqs 16384,32768,65536 --head-dims 128 --causal both --budget $(( left - 25 )) > $L/ring.log 2>&1; echo "ring bench rc=$? at $(el)s"
grep -vE "^\s*$" $L/ring.log | tail -24
cp $L/ring/*.md $L/ring/*.json $L/ 2>/dev/null
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
