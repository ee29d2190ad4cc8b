#!/usr/bin/env bash
# Session 10 call B: first GPU runs of the ring-attention and MoE benchmarks (call A's failed at
# torchrun's argument parsing: "--nproc" is ambiguous to torch 2.11's launcher).
export PATH=/usr/local/cuda/bin:$PATH
L=$OUT/logs; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
tarup() { tar -czf $OUT/logs.tgz -C $OUT logs; }
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMK_BUILD_TESTS=OFF > $L/build.log 2>&1 && cmake --build build-gpu -j16 --target mkernel >> $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
export LD_LIBRARY_PATH=$PWD/build-gpu/src:${LD_LIBRARY_PATH:-}
CUDA_MPS_PIPE_DIRECTORY=/tmp/mkb/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mkb/log; mkdir -p /tmp/mkb/pipe /tmp/mkb/log
export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; nvidia-cuda-mps-control -d; echo "mps rc=$?"
timeout 130 python3 bench/attn_bench.py ring --lib build-gpu/src/libmkernel.so --out $L/ring --mps --nproc 4 --head-dims 128 --budget 90 > $L/ring.log 2>&1; echo "ring rc=$? at $(el)s"
grep -E "^\| |rror|Traceback" $L/ring.log | head -30; tail -3 $L/ring.log; tarup
left=$(( 420 - $(el) )); echo "moe budget ${left}s"
timeout $(( left*6/10 )) python3 bench/moe_bench.py ffn --lib build-gpu/src/libmkernel.so --out $L/moe_ffn --mps --nproc 4 --budget $(( left*6/10 - 30 )) > $L/moe_ffn.log 2>&1; echo "moe ffn rc=$? at $(el)s"
grep -E "^\| |rror|Traceback" $L/moe_ffn.log | head -30; tail -3 $L/moe_ffn.log; tarup
left=$(( 450 - $(el) ))
[ $left -gt 40 ] && timeout $left python3 bench/moe_bench.py dispatch --lib build-gpu/src/libmkernel.so --out $L/moe_disp --mps --nproc 4 --budget $(( left - 30 )) > $L/moe_disp.log 2>&1; echo "moe dispatch rc=$? at $(el)s"
grep -E "^\| |rror|Traceback" $L/moe_disp.log | head -30; tail -3 $L/moe_disp.log
echo quit | nvidia-cuda-mps-control; tarup
