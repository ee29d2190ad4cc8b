#!/usr/bin/env bash
# For the next session, after next_callV.sh: the benches' lead-in as changed after call U, on
# the GPU. (1) ring attention 16K causal and not, with the 1-rank kernel's windows now also
# after an untimed call (call U's auto/1-rank at 16K causal: 0.894 / 0.930); (2) moe_bench ffn,
# 4 processes, two shapes, with the lead-in (now its default) and without, so that the
# fused/sequential and mkernel/torch ratios of earlier sessions (measured without) can be
# read against it.
set -u
source scripts/gpu_call.sh
gc_init W
GC_BUILD_S=260 gc_build /tmp/bn "gpu/test_ring_attention_procs.cu" mkernel
export LD_LIBRARY_PATH=/tmp/bn/src MKERNEL_TIMEOUT_MS=20000
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_mps_start
gc_run ring_16k 300 45 20 0 "^\| [0-9]|rror|MISMATCH" \
  python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
  --layout zigzag --head-dims 128 --causal both --algos auto --backends flash \
  --out "$GC_L/ring_16k" --budget 30 --seqs 16384 --reps 5 --target-ms 10
for lead in "" "--no-lead-in" ""; do
  name=moe${lead:+_nolead}_$(gc_el)
  gc_run "$name" $(($(gc_el) + 120)) 120 40 0 "^\||rror|MISMATCH" \
    python3 bench/moe_bench.py ffn --lib /tmp/bn/src/libmkernel.so --mps --nproc 4 \
    --shapes 7168:2048:256:8:2048,2048:1408:64:6:4096 --reps 5 --budget 90 \
    --out "$GC_L/$name" $lead
done
gc_mps_stop
gc_tar
