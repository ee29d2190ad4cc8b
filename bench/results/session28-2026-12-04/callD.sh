#!/usr/bin/env bash
# Session 28, call D: the grouped raster inside each expert is now the default
# (MKERNEL_GEMM_GROUP_RASTER=1, call C). The MoE and grouped GEMM tests under it, with the new
# late-tile test (MoeFfnFusedLate: GEMM1's and GEMM2's tile 0 held 3 ms before their stores);
# the fused layer and dispatch + GEMM against the sequential path over the shapes of session
# 27's table; the grouped GEMM alone against torch._grouped_mm (bench/grouped_bench.py); and a
# per-kernel time breakdown of the layer's two paths on 1 rank (ncu, kernels serialised).
set -u
source scripts/gpu_call.sh
gc_init D
T="gpu/test_gemm_grouped.cu;gpu/test_moe_*.cu"
GC_BUILD_S=300 gc_build /tmp/bd "$T" mk_gpu_tests bench_moe_threads_bench bench_gemm_bench
gc_tests /tmp/bd 'GemmGrouped*:*Moe*' 330 170
B=/tmp/bd/bench/bench_moe_threads_bench
mb() {  # NAME UNTIL ARGS...
  local name=$1 until=$2 left
  shift 2
  left=$(gc_left "$until" 90)
  [ "$left" -lt 15 ] && { echo "$name skipped"; return; }
  timeout "$left" $B "$@" --out "$GC_L/$name.json" > "$GC_L/$name.log" 2>&1
  echo "$name rc=$? at $(gc_el)s"; grep -E "^H=|FAIL" "$GC_L/$name.log"
  gc_tar
}
R="--ranks 4 --reps 6 --warmup 1 --trials 5"
mb ffn_shapes 420 --ffn $R --shapes \
  7168:2048:256:8:1024,7168:2048:256:8:2048,7168:2048:256:8:4096,7168:2048:256:8:8192,4096:1536:128:8:4096,2048:1408:64:6:4096,2048:1408:64:6:16384
mb dg 450 $R --shapes 7168:4096:256:8:4096,2048:2816:64:6:4096
left=$(gc_left 530 80)
if [ "$left" -ge 30 ]; then
  timeout "$left" python3 bench/grouped_bench.py --build /tmp/bd --rounds 2 --out "$GC_L" \
    > "$GC_L/grouped.log" 2>&1
  echo "grouped rc=$? at $(gc_el)s"; grep -E "^\|" "$GC_L/grouped.log" | head -8
  gc_tar
fi
left=$(gc_left 590 60)
if [ "$left" -ge 20 ]; then
  timeout "$left" ncu --metrics gpu__time_duration.sum --csv $B --ffn --ranks 1 --reps 1 \
    --warmup 0 --trials 1 --shapes 7168:2048:256:8:16384 > "$GC_L/ncu_ffn.csv" 2>&1
  echo "ncu rc=$? at $(gc_el)s"
  grep -E "gpu__time_duration" "$GC_L/ncu_ffn.csv" | awk -F'","' '{print $5 " " $(NF)}' | \
    sed 's/(.*)//' | cut -c1-100 | sort | uniq -c | head -20
  gc_tar
fi
