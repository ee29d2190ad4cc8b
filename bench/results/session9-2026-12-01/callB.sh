#!/usr/bin/env bash
# Session 9 call B: MoE FFN hang diagnosis (cuda-gdb attach), other MoE tests, attention bench.
export PATH=/usr/local/cuda/bin:$PATH
L=$OUT/logs; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/build.log 2>&1 && cmake --build build-gpu -j16 >> $L/build.log 2>&1; echo "build rc=$? at $(el)s"
B=build-gpu/tests/mk_gpu_tests
export LD_LIBRARY_PATH=$PWD/build-gpu/src:${LD_LIBRARY_PATH:-}
which cuda-gdb gdb; cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null
probe() {  # name filter extra-env...
  local name=$1 filt=$2; shift 2
  env "$@" timeout -s INT 45 $B --gtest_filter="$filt" > $L/$name.log 2>&1 & local pid=$!
  sleep 22
  if kill -0 $pid 2>/dev/null; then
    echo "$name still running at 22 s: attaching"
    timeout 40 cuda-gdb -p $pid -batch -ex "info cuda kernels" -ex "info cuda blocks" -ex "thread apply all bt 14" > $L/$name.gdb 2>&1
    grep -E "^\s*\*?\s*[0-9]+ .*<<<|Kernel|#[0-9]+ .* in (mk::|ncclMoe|cuda|moe)" $L/$name.gdb | head -40
  fi
  wait $pid; echo "$name rc=$? at $(el)s"
  grep -E "OK \]|FAILED  \]|Failure|Which is|error" $L/$name.log | head -12
}
probe ffn1 'MoeFfn/MoeFfnThreads.*/n1' MKERNEL_TIMEOUT_MS=5000 CUDA_LAUNCH_BLOCKING=1
probe ffn2 'MoeFfn/MoeFfnThreads.*/n2' MKERNEL_TIMEOUT_MS=5000
timeout 150 $B --gtest_filter='Moe*:*Moe*:-*MoeFfn*' > $L/moe_rest.log 2>&1; echo "moe_rest rc=$? at $(el)s"
grep -E "OK \]|FAILED  \]|PASSED|Failure|Which is" $L/moe_rest.log | head -40
left=$(( 585 - $(el) )); echo "bench budget ${left}s"
timeout $left python3 bench/attn_bench.py single --lib build-gpu/src/libmkernel.so --out $OUT --budget $(( left - 40 )) > $L/attn_bench.log 2>&1; echo "attn_bench rc=$? at $(el)s"
tail -40 $L/attn_bench.log
