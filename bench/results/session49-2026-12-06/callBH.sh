#!/usr/bin/env bash
# Session 49, second call, right after callBG.sh on the warm machine (rebuilds /tmp/bt if the
# machine was not kept): the rest of the whole GPU suite, the collectives and everything else.
set -u
source scripts/gpu_call.sh
gc_init BH
if [ ! -x /tmp/bt/tests/mk_gpu_tests ]; then
  GC_BUILD_S=400 gc_build /tmp/bt "gpu/*.cc;gpu/*.cu" mk_gpu_tests
else
  export LD_LIBRARY_PATH=/tmp/bt/src MKERNEL_TIMEOUT_MS=20000
  echo "reusing /tmp/bt"
fi
# The power question at 8192x8192x1024 (session 41/42: cuBLAS ran power-capped at a lower clock
# doing more work a cycle): soak windows of pipeline 0 (carried, claimed), cuBLAS-best, and the
# carried epilogue as CTA pairs (B's L2 reads multicast) with nvidia-smi sampling beside them.
timeout 120 cmake --build /tmp/bt -j"$(nproc)" --target bench_gemm_bench >"$GC_L/build_bench.log" 2>&1
echo "bench build rc=$? at $(gc_el)s"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits -lms 50 >"$GC_L/smi.csv" 2>"$GC_L/smi.err" &
SMI=$!
gc_run soak 200 100 40 1 "x.*(engine  |carried|soak)|rror" \
  /tmp/bt/bench/bench_gemm_bench --shapes 8192x8192x1024 --reps 10 --carry --clusters --soak 6 \
  --commit "$(cat COMMIT_SNAP)"
kill $SMI 2>/dev/null
[ -s "$GC_L/smi.csv" ] && python3 bench/results/session41-2026-12-05/soak_clocks.py \
  "$GC_L/soak.log" "$GC_L/smi.csv" | tee "$GC_L/soak_clocks.log"
gc_tests /tmp/bt '*Coll*:*Hier*:*Peer*:*Comm*:-*Fused*:*Moe*:*Gemm*:*Attn*' 440 380
mv "$GC_L/tests.log.gz" "$GC_L/tests_a.log.gz"
gc_tests /tmp/bt '*-*Coll*:*Hier*:*Peer*:*Comm*:*Fused*:*Moe*:*Gemm*:*Attn*' 590 300
mv "$GC_L/tests.log.gz" "$GC_L/tests_b2.log.gz"
gc_tar
