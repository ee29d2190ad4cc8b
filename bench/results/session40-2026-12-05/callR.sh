#!/usr/bin/env bash
# Session 40, call R: two buffers for the staged reads (MKERNEL_RING_SEQ_DOUBLE; calls alternate
# buffers and end without waiting for their readers, so a rank copies its next slices while the
# peers' kernels still run). (1) the processes tests under MPS (n3staged one buffer, n4claim
# two), (2) ring 16K causal and not, 4 processes under MPS, two buffers / one interleaved,
# (3) 32K and 64K, (4) one traced 16K causal run with two buffers.
set -u
source scripts/gpu_call.sh
gc_init R
[ -f /tmp/bn/tests/mk_gpu_tests ] && [ "$(cat /tmp/bn/COMMIT 2>/dev/null)" = "$(cat COMMIT_SNAP)" ] ||
  GC_BUILD_S=260 gc_build /tmp/bn "gpu/test_ring_attention_procs.cu" mk_gpu_tests mkernel
cp COMMIT_SNAP /tmp/bn/COMMIT
export LD_LIBRARY_PATH=/tmp/bn/src MKERNEL_TIMEOUT_MS=20000
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_mps_start
gc_tests /tmp/bn 'RingAttn/RingAttnProcs.*:RingAttnProcsAbort.*' 330 70
mv "$GC_L/tests.log.gz" "$GC_L/tests_procs.log.gz" 2>/dev/null
i=0
for db in 1 0 1 0; do
  i=$((i + 1))
  MKERNEL_RING_SEQ_DOUBLE=$db gc_run "ring${i}_db$db" $((330 + 26 * i)) 25 18 0 "^\| [0-9]|rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal both --target-ms 5 --out "$GC_L/ring${i}_db$db" \
    --seqs 16384 --algos auto --backends flash --reps 3 --budget 20
done
for db in 1 0; do
  MKERNEL_RING_SEQ_DOUBLE=$db gc_run "ringL_db$db" $((470 + 30 * (1 - db))) 30 20 0 "^\| [0-9]|rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal both --target-ms 8 --out "$GC_L/ringL_db$db" \
    --seqs 32768,65536 --algos auto --backends flash --reps 1 --budget 25
done
MKERNEL_FUSED_TRACE=1 gc_run "trace_db1" 525 25 15 0 "rror" \
  python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
  --layout zigzag --head-dims 128 --causal yes --target-ms 4 --out "$GC_L/trace_db1" \
  --seqs 16384 --algos auto --backends flash --reps 1 --budget 15
gc_mps_stop
gc_tar
