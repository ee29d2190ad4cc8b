#!/usr/bin/env bash
# Session 40, call P: the staged split (MKERNEL_RING_SEQ_SPLIT; own slices while the copy
# engine stages them, then the peers' merged in by the rows' lse). (1) the processes tests
# under MPS (n3staged and n4claim run the staged calls split, n4claim's odd ranks unsplit),
# (2) ring 16K causal and not, 4 processes under MPS, split 1 / 0 interleaved, (3) the
# attention tests with threads (the epilogue changed for every kernel), (4) 32K and 64K.
set -u
source scripts/gpu_call.sh
gc_init P
[ -f /tmp/bn/tests/mk_gpu_tests ] && [ "$(cat /tmp/bn/COMMIT 2>/dev/null)" = "$(cat COMMIT_SNAP)" ] ||
  GC_BUILD_S=240 gc_build /tmp/bn "gpu/test_ring_attention.cu;gpu/test_ring_attention_procs.cu;gpu/test_ring_attn_xnode.cu" \
    mk_gpu_tests mkernel
cp COMMIT_SNAP /tmp/bn/COMMIT
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_mps_start
gc_tests /tmp/bn 'RingAttn/RingAttnProcs.*:RingAttnProcsAbort.*' 200 110
mv "$GC_L/tests.log.gz" "$GC_L/tests_procs.log.gz"
i=0
for sp in 1 0 1 0; do
  i=$((i + 1))
  MKERNEL_RING_SEQ_SPLIT=$sp gc_run "ring${i}_sp$sp" $((200 + 32 * i)) 31 20 0 "^\| [0-9]|rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal both --target-ms 6 --out "$GC_L/ring${i}_sp$sp" \
    --seqs 16384 --algos auto --backends flash --reps 3 --budget 26
done
gc_mps_stop
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
gc_tests /tmp/bn 'RingAttn/RingAttnSingle.*:RingAttnSingleLong.*:RingAttn/RingAttnThreads.*:RingAttn/RingAttnGraph.*:RingAttn/RingAttnD64Variant.*:RingAttn/RingAttnD128Variant.*' 440 90
mv "$GC_L/tests.log.gz" "$GC_L/tests_threads.log.gz"
gc_mps_start
for sp in 1 0; do
  MKERNEL_RING_SEQ_SPLIT=$sp gc_run "ringL_sp$sp" $((510 + 40 * (1 - sp))) 45 25 0 "^\| [0-9]|rror" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal both --target-ms 8 --out "$GC_L/ringL_sp$sp" \
    --seqs 32768,65536 --algos auto --backends flash --reps 2 --budget 40
done
gc_mps_stop
gc_tar
