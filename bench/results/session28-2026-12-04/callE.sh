#!/usr/bin/env bash
# Session 28, call E (the session's last): narrow last column tiles (a tile with <= 128 valid
# columns runs m64n128 wgmmas on the accumulators' left half; N = 1408 had a sixth column tile
# of 128 zero columns). The GEMM, MoE and fused GEMM + collective tests; the grouped GEMM
# against torch._grouped_mm (target shape 16 x 8192, 2048 -> 1408 was 0.907 in call D); the
# engine against cuBLAS with and without a narrow tail; the per-kernel times of the MoE layer's
# two paths on 1 rank (ncu; call D's attempt passed --warmup 0, which the bench refuses).
set -u
source scripts/gpu_call.sh
gc_init E
T="gpu/test_gemm*.cu;gpu/test_moe_*.cu;gpu/test_fused_gemm_coll.cu"
GC_BUILD_S=300 gc_build /tmp/be "$T" mk_gpu_tests bench_moe_threads_bench bench_gemm_bench
gc_tests /tmp/be 'Gemm*:*Moe*:*FusedGemmColl*' 360 170
left=$(gc_left 400 40)
if [ "$left" -ge 20 ]; then
  timeout "$left" python3 bench/grouped_bench.py --build /tmp/be --rounds 2 --out "$GC_L" \
    > "$GC_L/grouped.log" 2>&1
  echo "grouped rc=$? at $(gc_el)s"; grep -E "^\|" "$GC_L/grouped.log" | head -8
  gc_tar
fi
left=$(gc_left 425 25)
if [ "$left" -ge 15 ]; then
  timeout "$left" /tmp/be/bench/bench_gemm_bench --reps 10 \
    --shapes 8192x8192x1024,8192x8192x8192,16384x1408x2048 --out "$GC_L/gemm.json" \
    > "$GC_L/gemm.log" 2>&1
  echo "gemm rc=$? at $(gc_el)s"; grep -E "^\|" "$GC_L/gemm.log"
  gc_tar
fi
left=$(gc_left 470 45)
if [ "$left" -ge 20 ]; then
  timeout "$left" ncu --metrics gpu__time_duration.sum --csv \
    /tmp/be/bench/bench_moe_threads_bench --ffn --ranks 1 --reps 1 --warmup 1 --trials 1 \
    --shapes 7168:2048:256:8:16384 > "$GC_L/ncu_ffn.csv" 2>&1
  echo "ncu rc=$? at $(gc_el)s"
  python3 - "$GC_L/ncu_ffn.csv" <<'PY'
import csv, re, sys, collections
tot = collections.OrderedDict()
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if rows:
  h = rows[0]
  ki, vi = h.index("Kernel Name"), h.index("Metric Value")
  unit = rows[1][h.index("Metric Unit")] if len(rows) > 1 else "?"
  for r in rows[1:]:
    name = re.sub(r"[<(].*", "", r[ki]).split("::")[-1]
    n, t = tot.get(name, (0, 0.0))
    tot[name] = (n + 1, t + float(r[vi].replace(",", "")))
  for k, (n, t) in tot.items():
    print("%-40s %3d launches %12.1f %s" % (k[:40], n, t, unit))
PY
  gc_tar
fi
