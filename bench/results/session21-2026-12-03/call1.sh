#!/usr/bin/env bash
# Session 21 call 1: session 20's final-call script, unchanged, run from the snapshot's root
# at b27c367 (README commands, GemmStreamK tests, bench_gemm_bench --streamk, coll_bench).
exec bash bench/results/session20-2026-12-03/callF.sh "$@"
