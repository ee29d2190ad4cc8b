#!/usr/bin/env bash
# Session 9 call A: build, ring attention (plain schedule, then all), MoE tests.
export MK_STAGE_TIMEOUT_build=200 MK_STAGE_TIMEOUT_attn_plain=70 MK_STAGE_TIMEOUT_attn=170 MK_STAGE_TIMEOUT_moe=140
export MK_STAGE_TIMEOUT_attn_bench=1
export MKERNEL_TIMEOUT_MS=${MKERNEL_TIMEOUT_MS:-10000}
echo "commit $(cat COMMIT_SNAP)"
t0=$(date +%s)
bash scripts/gpu_check.sh build attn moe
echo "total $(( $(date +%s) - t0 ))s"
out=build-gpu/gpu_check_out
for f in attn_plain attn moe; do echo "=== $f"; grep -E "^\[  FAILED|\[RingAttn\]|^\[ RUN|OK \]|Skipped|error|mismatch|worst" $out/$f.log | grep -v "^\[ RUN" | head -80; done
mkdir -p $OUT && cp $out/*.log $OUT/ 2>/dev/null
