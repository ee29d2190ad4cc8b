#!/usr/bin/env bash
# Session 43, call AC: session 41's moe_bench lead-in (a barrier, one untimed call and a
# one-element all-reduce before every round's timed window; its default since then), never run
# on a GPU: moe_bench ffn, 4 processes under MPS, two shapes, with the lead-in and without
# (--no-lead-in), so that the fused/sequential and mkernel/torch ratios of earlier sessions
# (measured without) can be read against it (next_callW.sh's second half).
set -u
source scripts/gpu_call.sh
gc_init AC
GC_BUILD_S=260 gc_build /tmp/bn "gpu/test_ring_attention_procs.cu" mkernel
export LD_LIBRARY_PATH=/tmp/bn/src MKERNEL_TIMEOUT_MS=20000
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_mps_start
for lead in "" "--no-lead-in" ""; do
  name=moe${lead:+_nolead}_$(gc_el)
  gc_run "$name" $(($(gc_el) + 120)) 120 40 0 "^\||rror|MISMATCH" \
    python3 bench/moe_bench.py ffn --lib /tmp/bn/src/libmkernel.so --mps --nproc 4 \
    --shapes 7168:2048:256:8:2048,2048:1408:64:6:4096 --reps 5 --budget 90 \
    --out "$GC_L/$name" $lead
done
gc_mps_stop
gc_tar
