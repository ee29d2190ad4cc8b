#!/usr/bin/env bash
# Session 44, call AE: session 43's calls AD and AC in one (neither ran: no machine was lent).
# First the fused operators' compute roles through the epilogue as changed in sessions 42-43
# (GemmFused*, FusedGemmColl*, *MoeFfn*), then session 41's moe_bench lead-in, 4 processes
# under MPS, with and without --no-lead-in.
set -u
source scripts/gpu_call.sh
gc_init AE
GC_BUILD_S=260 gc_build /tmp/bn \
  "gpu/test_gemm_fused.cu;gpu/test_fused_gemm_coll.cu;gpu/test_moe_ffn.cu;gpu/test_moe_ffn_fused.cu" \
  mk_gpu_tests mkernel
gc_tests /tmp/bn 'GemmFused*:FusedGemmColl*:*MoeFfn*' 400 150
export LD_LIBRARY_PATH=/tmp/bn/src MKERNEL_TIMEOUT_MS=20000
export MK_BENCH_COMMIT=$(cat COMMIT_SNAP)
gc_mps_start
for lead in "" "--no-lead-in"; do
  name=moe${lead:+_nolead}_$(gc_el)
  gc_run "$name" 590 100 40 0 "^\||rror|MISMATCH" \
    python3 bench/moe_bench.py ffn --lib /tmp/bn/src/libmkernel.so --mps --nproc 4 \
    --shapes 7168:2048:256:8:2048,2048:1408:64:6:4096 --reps 5 --budget 80 \
    --out "$GC_L/$name" $lead
done
gc_mps_stop
gc_tar
