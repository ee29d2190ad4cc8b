#!/usr/bin/env bash
# Session 9 call F: attention softmax change checked (every RingAttn test, both schedules) and measured; torch fused_moe.
export PATH=/usr/local/cuda/bin:$PATH
L=$OUT/logs; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/build.log 2>&1 && cmake --build build-gpu -j16 >> $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
B=build-gpu/tests/mk_gpu_tests
export LD_LIBRARY_PATH=$PWD/build-gpu/src:${LD_LIBRARY_PATH:-}
timeout 60 $B --gtest_filter='*RingAttn*' > $L/attn.log 2>&1; echo "RingAttn rc=$? at $(el)s"
grep -E "FAILED  \]|PASSED|Failure|Which is" $L/attn.log | head -12; grep -cE "OK \]" $L/attn.log
timeout 100 python3 bench/attn_bench.py single --lib build-gpu/src/libmkernel.so --out $OUT --budget 75 > $L/attn_bench.log 2>&1; echo "attn_bench rc=$? at $(el)s"
grep -E "^\| [0-9]" $L/attn_bench.log; tail -2 $L/attn_bench.log
left=$(( 300 - $(el) )); echo "torch budget ${left}s"
[ $left -gt 30 ] && MK_TORCH_BUDGET=$left MK_TORCH_LOGDIR=$L/torch timeout $left scripts/run_torch_tests.sh build-gpu fused_moe > $L/torch.log 2>&1; echo "torch rc=$? at $(el)s"; tail -6 $L/torch.log
tar -czf $OUT/logs.tgz -C $OUT logs
