#!/usr/bin/env bash
# Session 9 call D: FFN hang: which kernel runs (cuda-gdb, whole output kept); torch ring attention tests.
export PATH=/usr/local/cuda/bin:$PATH
L=$OUT/logs; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/build.log 2>&1 && cmake --build build-gpu -j16 >> $L/build.log 2>&1; echo "build rc=$? at $(el)s"
B=build-gpu/tests/mk_gpu_tests
export LD_LIBRARY_PATH=$PWD/build-gpu/src:${LD_LIBRARY_PATH:-}
for mode in lb free; do
  if [ $mode = lb ]; then export CUDA_LAUNCH_BLOCKING=1; else unset CUDA_LAUNCH_BLOCKING; fi
  MKERNEL_TIMEOUT_MS=5000 $B --gtest_filter='MoeFfn/MoeFfnThreads.*/n1' > $L/ffn1_$mode.log 2>&1 & pid=$!
  sleep 12
  if kill -0 $pid 2>/dev/null; then
    echo "ffn1 ($mode) still running at 12 s"
    timeout 50 cuda-gdb -p $pid -batch -ex "info cuda kernels" -ex "info cuda blocks" -ex "cuda kernel 0 block 0 thread 0" -ex "bt" -ex "info cuda threads" -ex "thread apply all bt 20" > $L/ffn1_$mode.gdb 2>&1
    sed -n '/info cuda kernels/,$p' $L/ffn1_$mode.gdb | head -5
    grep -vE "^\[New|^\[Thread|libthread_db" $L/ffn1_$mode.gdb | head -45
    kill -9 $pid
  fi
  wait $pid; echo "ffn1 $mode rc=$? at $(el)s"; grep -E "OK \]|FAILED  \]|Failure|Which is" $L/ffn1_$mode.log | head
done
unset CUDA_LAUNCH_BLOCKING
MK_TORCH_BUDGET=200 MK_TORCH_LOGDIR=$L/torch timeout 230 scripts/run_torch_tests.sh build-gpu ring_attention ring_attention_vnodes > $L/torch.log 2>&1; echo "torch rc=$? at $(el)s"; tail -15 $L/torch.log
tar -czf $OUT/logs.tgz -C $OUT logs
