#!/usr/bin/env bash
# Session 31, call E: where the fused layer on 4 processes wins (call D: 1.41x / 1.06x the
# AllToAll path at H 7168 / 2048 with 4096 tokens a rank): moe_bench ffn over token counts and
# the three models, sequential against fused, twice (the second run in reverse shape order).
set -u
source scripts/gpu_call.sh
gc_init E
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
timeout 30 nvidia-cuda-mps-control -d && echo "MPS started"
GC_BUILD_S=300 gc_build /tmp/be "gpu/test_moe_procs.cu" mkernel
S1="7168:2048:256:8:512,7168:2048:256:8:1024,7168:2048:256:8:8192,4096:1536:128:8:1024"
S1="$S1,4096:1536:128:8:4096,2048:1408:64:6:512,2048:1408:64:6:1024,2048:1408:64:6:16384"
S2=$(echo "$S1" | tr ',' '\n' | tac | paste -sd, -)
i=0
for S in "$S1" "$S2"; do
  i=$((i + 1))
  gc_run "ffn$i" $((190 + 200 * i)) 200 40 0 "^\||rror|Traceback" python3 bench/moe_bench.py ffn \
    --lib /tmp/be/src/libmkernel.so --out "$GC_L/ffn$i" --mps --nproc 4 \
    --algos sequential,fused --no-graph --shapes "$S" --reps 6 --warmup 1 --budget 170
done
echo quit | nvidia-cuda-mps-control
gc_tar
