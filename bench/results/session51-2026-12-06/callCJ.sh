#!/usr/bin/env bash
# Session 51, call CJ: the automatic L2 choices of plain GEMMs (groupM 32 at 1024 <= K <= 2048,
# D's stores evict-first at K <= 1024) against session 50's (bands of 8, no policy: --legacy)
# and each alone, over small-K shapes of several M and N; the default list (K >= 4096: the rule
# leaves it as it was); then the three tests call CA-CC failed (two stale tests, fixed; the MoE
# processes case with CB's seed).
set -u
source scripts/gpu_call.sh
gc_init CJ
GC_BUILD_S=240 gc_build /tmp/bj "gpu/*.cc;gpu/*.cu" mk_gpu_tests bench_gemm_bench
gc_tests /tmp/bj 'Gemm*:CollWindow.ArgumentErrors' 260 30
mv "$GC_L/tests.log.gz" "$GC_L/tests_gemm.log.gz"
B=/tmp/bj/bench/bench_gemm_bench
PAT="x.*(engine  |hint|groupM|rror)|geomean"
SMALL=8192x8192x1024,8192x8192x512,8192x8192x2048,8192x8192x4096,16384x8192x1024,4096x4096x1024,8192x28672x1024,2048x8192x1024,8192x4096x1024
gc_run small32_1 295 35 10 1 "$PAT" $B --shapes "$SMALL" --reps 20 --legacy --hint \
  --groupm 32 --commit "$(cat COMMIT_SNAP)"
gc_run list_legacy 320 25 10 1 "$PAT" $B --reps 20 --legacy --commit "$(cat COMMIT_SNAP)"
gc_run small32_2 355 35 10 1 "$PAT" $B --shapes "$SMALL" --reps 20 --legacy --hint \
  --groupm 32 --commit "$(cat COMMIT_SNAP)"
export MKTEST_SEED=22858993639497
gc_tests /tmp/bj 'MoeProcsFused.TwoAndFourProcesses' 400 45
mv "$GC_L/tests.log.gz" "$GC_L/tests_moe_seed.log.gz"
gc_tar
