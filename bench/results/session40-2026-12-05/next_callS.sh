#!/usr/bin/env bash
# For the next session with a device: the copies of the staged reads. (1) the processes tests
# under MPS as changed after call R (n4claim: two buffers, the odd ranks copying with a kernel,
# MKERNEL_RING_SEQ_COPY=1; n3staged one buffer, the new default; every case: graph replays
# between eager calls with no host wait, and the review's fix for two buffers under capture,
# 146ff61), (2) ring 16K causal and not,
# 4 processes under MPS: copy engine / kernel copies, one / two buffers, interleaved, (3) one
# traced 16K causal run each of the default and of two buffers with kernel copies (the stage
# kernels' spans show what the copies cost), (0, first) copy_rate.py: one 32 MB copy by the
# copy engine against an SM kernel, alone on the GPU.
set -u
source scripts/gpu_call.sh
gc_init S
GC_BUILD_S=260 gc_build /tmp/bn "gpu/test_ring_attention_procs.cu" mk_gpu_tests mkernel
export LD_LIBRARY_PATH=/tmp/bn/src MKERNEL_TIMEOUT_MS=20000
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_run copy_rate 300 30 10 0 "copy_rate" python3 bench/results/session40-2026-12-05/copy_rate.py
gc_mps_start
gc_tests /tmp/bn 'RingAttn/RingAttnProcs.*:RingAttnProcsAbort.*' 330 80
mv "$GC_L/tests.log.gz" "$GC_L/tests_procs.log.gz" 2>/dev/null
i=0
for mode in "0 0" "1 1" "0 1" "0 0" "1 1" "0 1"; do
  set -- $mode
  i=$((i + 1))
  MKERNEL_RING_SEQ_DOUBLE=$1 MKERNEL_RING_SEQ_COPY=$2 gc_run "ring${i}_db$1_cp$2" \
    $((330 + 32 * i)) 31 22 0 "^\| [0-9]|rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal both --target-ms 5 --out "$GC_L/ring${i}_db$1_cp$2" \
    --seqs 16384 --algos auto --backends flash --reps 3 --budget 24
done
for mode in "0 0" "1 1"; do
  set -- $mode
  MKERNEL_FUSED_TRACE=1 MKERNEL_RING_SEQ_DOUBLE=$1 MKERNEL_RING_SEQ_COPY=$2 gc_run \
    "trace_db$1_cp$2" $((560 + 20 * $1)) 20 12 0 "rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal yes --target-ms 4 --out "$GC_L/trace_db$1_cp$2" \
    --seqs 16384 --algos auto --backends flash --reps 1 --budget 12
done
gc_mps_stop
gc_tar
