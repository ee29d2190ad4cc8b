#!/usr/bin/env bash
# Session 41, call U: ring attention with the bench's lead-in (one untimed call before each
# collective measurement, so the host barrier's skew between the 4 processes stays out of the
# window; call S's trace showed the ranks entering a measurement up to 1.2 ms apart with 2-3
# calls a window). Call T's lead-in opened each rank's window at the end of its own untimed
# call, which counted the spread of those ends on the early ranks (torch's four SDPAs end in no
# fixed order: torch's times rose 5-8%); here a one-element all-reduce after the untimed call
# lines the windows up. 16K-64K causal and not, 16K without the lead-in beside it, then 128K.
set -u
source scripts/gpu_call.sh
gc_init U
GC_BUILD_S=260 gc_build /tmp/bn "gpu/test_ring_attention_procs.cu" mkernel
export LD_LIBRARY_PATH=/tmp/bn/src MKERNEL_TIMEOUT_MS=20000
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_mps_start
ring() {  # NAME UNTIL CAP BUDGET ARGS...
  local name=$1 until=$2 cap=$3 budget=$4
  shift 4
  gc_run "$name" "$until" "$cap" 20 0 "^\| [0-9]|rror|MISMATCH" \
    python3 bench/attn_bench.py ring --lib /tmp/bn/src/libmkernel.so --mps --ranks 4 \
    --layout zigzag --head-dims 128 --causal both --algos auto --backends flash \
    --out "$GC_L/$name" --budget "$budget" "$@"
}
ring lead_16k 290 45 30 --seqs 16384 --reps 5 --target-ms 10
ring nolead_16k 330 45 30 --seqs 16384 --reps 5 --target-ms 10 --no-lead-in
ring lead_32k64k 440 110 80 --seqs 32768,65536 --reps 5 --target-ms 10
ring nolead_16k_b 480 45 30 --seqs 16384 --reps 5 --target-ms 10 --no-lead-in
ring lead_16k_b 520 45 30 --seqs 16384 --reps 5 --target-ms 10
ring lead_128k 590 70 50 --seqs 131072 --reps 3 --target-ms 10
gc_mps_stop
gc_tar
