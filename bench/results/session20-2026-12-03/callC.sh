#!/usr/bin/env bash
# Session 20 call C (fresh snapshot of the issue-11 code): nccl-tests through LD_PRELOAD with
# one thread per rank (-t 2 -g 1, -t 4 -g 1; issue 11 part 2), with -R 1 / -R 2 and 4 MPI
# processes as 2 virtual nodes x 2 under MPS (part 3), every collective binary; coll_bench
# plain buffers against windows at small sizes, three interleaved rounds (part 3's benchmark).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsC; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsC.tgz -C $OUT logsC; }
B=/tmp/mkc
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 --target mkernel bench_coll_bench > $L/build.log 2>&1; echo "build rc=$? at $(el)s"
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
MK_NT_MPI=1 timeout 120 bash scripts/prepare_nccl_tests.sh $B .nccl-tests > $L/nt-prepare.log 2>&1; echo "nt prepare rc=$? at $(el)s"; tail -1 $L/nt-prepare.log
for i in 1 2 3; do for r in 0 2; do
  timeout 30 $B/bench/bench_coll_bench --no-real-nccl --skip single --ranks 4 -b 8 -e 2M -f 8 --big-bytes 16M --reg $r --out $L/coll_r${i}_reg$r.json > $L/coll_r${i}_reg$r.log 2>&1 || echo "coll round $i reg $r rc=$?"
done; done; echo "coll done at $(el)s"; tarup
ALL="all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf sendrecv_perf alltoall_perf reduce_perf gather_perf scatter_perf"
left=$(( 330 - $(el) ))
MKERNEL_EMULATE_NODES=2 MK_NT_PROCS=4 MK_NT_MODES=0 MK_NT_MAXBYTES=1M MK_NT_ITERS="-n 2 -w 1" MK_NT_BUDGET=$(( left - 15 )) timeout $left bash scripts/run_nccl_tests_reg.sh $B $ALL > $L/nt-vnodes-reg.log 2>&1; echo "nt vnodes reg rc=$? at $(el)s"
grep -E "^(PASS|FAIL|SKIP)|NCCL-TESTS" $L/nt-vnodes-reg.log | cut -c1-110 | tail -24; tarup
echo quit | nvidia-cuda-mps-control 2>/dev/null
left=$(( 585 - $(el) ))
[ $left -gt 40 ] && MK_NT_THREADS="2x1 4x1" MK_NT_MODES=0 MK_NT_MAXBYTES=1M MK_NT_ITERS="-n 2 -w 1" MK_NT_BUDGET=$(( left - 15 )) timeout $left bash scripts/run_nccl_tests.sh $B $ALL > $L/nt-threads.log 2>&1; echo "nt threads rc=$? at $(el)s"
grep -E "^(PASS|FAIL|SKIP)|NCCL-TESTS" $L/nt-threads.log | cut -c1-110 | tail -24; tarup
