#!/usr/bin/env bash
set -u
echo "after $(cat COMMIT_SNAP) before $(cat ../.snapb/COMMIT_SNAP)"
MK_CMP_DEADLINE=330 bash scripts/bench_compare.sh ../.snapb . $OUT/cmp > $OUT/cmp.log 2>&1; echo "bench_compare rc=$?"
tail -5 $OUT/cmp.log; cat $OUT/cmp/compare.md | head -120
