#!/usr/bin/env bash
# Session 19 call E (same snapshot and build as call D; warm): bench/net_vs_nccl.sh full (every
# size, both sides twice, interleaved: issue 11's tables).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsE; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logsE.tgz -C $OUT logsE; }
B=$(pwd)/build
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 --target mkernel bench_net_procs_bench > $L/build.log 2>&1; echo "build rc=$? at $(el)s"
echo "commit $(cat COMMIT_SNAP)"
export LD_LIBRARY_PATH=$B/src:${LD_LIBRARY_PATH:-}
MK_NVN_BUDGET=330 timeout 350 bash bench/net_vs_nccl.sh $B $L/nvn --no-bound --rounds 2 > $L/nvn.log 2>&1; echo "nvn rc=$? at $(el)s"
grep -E "^\| (allreduce|sendrecv) \|" $L/nvn/net_vs_nccl.md | head -40 | cut -d'|' -f2-6,10; grep -A8 "## Verdict" $L/nvn/net_vs_nccl.md
echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
timeout 100 bash scripts/prepare_nccl_tests.sh $B .nccl-tests > $L/nt-prepare.log 2>&1; echo "nt prepare rc=$? at $(el)s"; tail -1 $L/nt-prepare.log
left=$(( 570 - $(el) ))
[ $left -gt 40 ] && MK_NT_THREADS="2x2" MK_NT_MODES=0 MK_NT_BUDGET=$(( left - 20 )) MK_NT_MAXBYTES=1M MK_NT_ITERS="-n 2 -w 1" timeout $left bash scripts/run_nccl_tests.sh $B > $L/nt-threads.log 2>&1; echo "nt threads rc=$? at $(el)s"
grep -E "^(PASS|FAIL|SKIP)|NCCL-TESTS:" $L/nt-threads.log | cut -c1-110 | tail -14; tarup
