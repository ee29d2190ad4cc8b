#!/usr/bin/env bash
# Session 9 call C: FFN hang backtraces (cuda-gdb on the test process), attention schedule 0 vs 1, ncu of one attention kernel.
export PATH=/usr/local/cuda/bin:$PATH
L=$OUT/logs; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/build.log 2>&1 && cmake --build build-gpu -j16 >> $L/build.log 2>&1; echo "build rc=$? at $(el)s"
B=build-gpu/tests/mk_gpu_tests
export LD_LIBRARY_PATH=$PWD/build-gpu/src:${LD_LIBRARY_PATH:-}
MKERNEL_TIMEOUT_MS=5000 CUDA_LAUNCH_BLOCKING=1 $B --gtest_filter='MoeFfn/MoeFfnThreads.*/n1' > $L/ffn1.log 2>&1 & pid=$!
sleep 15
if kill -0 $pid 2>/dev/null; then
  echo "ffn1 still running at 15 s (pid $pid)"
  timeout 50 cuda-gdb -p $pid -batch -ex "info cuda kernels" -ex "info cuda blocks" -ex "thread apply all bt 20" > $L/ffn1.gdb 2>&1
  grep -E "<<<|Kernel|^#[0-9]+ " $L/ffn1.gdb | grep -vE "libc|pthread|clone|start_thread" | head -60
  kill -9 $pid
fi
wait $pid; echo "ffn1 rc=$? at $(el)s"; grep -E "OK \]|FAILED  \]|Failure|Which is" $L/ffn1.log | head
A="python3 bench/attn_bench.py single --lib build-gpu/src/libmkernel.so --out $L --seqs 8192 --head-dims 128,64 --causal no --backends cudnn --torch-layouts bshd --reps 5 --budget 60"
for s in 0 1; do MKERNEL_ATTN_SCHEDULE=$s timeout 80 $A > $L/attn_s$s.log 2>&1; echo "schedule $s rc=$? at $(el)s"; grep -E "^S=" $L/attn_s$s.log; done
timeout 120 ncu --target-processes all -k regex:attnKernel --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
  python3 bench/attn_bench.py single --lib build-gpu/src/libmkernel.so --out $L --seqs 8192 --head-dims 128 --causal no --backends cudnn --torch-layouts bshd --reps 1 --warmup 1 --eager --budget 20 > $L/ncu.log 2>&1
echo "ncu rc=$? at $(el)s"; grep -vE "^==PROF==|^S=|attn_bench" $L/ncu.log | grep -E "\S" | head -120
