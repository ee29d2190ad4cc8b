#!/usr/bin/env bash
# Session 19 call F: bench_coll_bench with 4 ranks sharing the GPU, plain buffers against
# windows (--reg 0 / --reg 2, issue 11 part 3), same build, one call.
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsF; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
B=$(pwd)/build
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 --target bench_coll_bench > $L/build.log 2>&1; echo "build rc=$? at $(el)s"
for r in 0 2; do left=$(( 170 - $(el) )); [ $left -gt 15 ] && timeout $(( left < 60 ? left : 60 )) $B/bench/bench_coll_bench --no-real-nccl --skip single --ranks 4 -b 8 -e 16M -f 8 --reg $r --out $L/coll_reg$r.json > $L/coll_reg$r.log 2>&1; echo "coll_bench --reg $r rc=$? at $(el)s"; done
grep -h -E "allreduce|zero|busbw" $L/coll_reg0.log | head -12; grep -h -E "allreduce|zero|busbw" $L/coll_reg2.log | head -12
