#!/usr/bin/env bash
# Session 13 call 3: nccl-tests -R 1 / -R 2 with 4 processes (issue 11 part 3, never run),
# net_vs_nccl --quick with the fast paths (issue 11 part 1), fused_vs_nccl --quick (issue 12 (b);
# its mkernel side is 2 virtual nodes, so still the sequential path, now with full-grid GEMMs).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logs3; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
tarup() { tar -czf $OUT/logs3.tgz -C $OUT logs3; }
B=$(cd .. && pwd)/build-dev
echo "commit $(cat COMMIT_SNAP)"; mpicc --showme:incdirs; command -v mpirun nvidia-cuda-mps-control
[ -x $B/src/libmkernel.so ] || { cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1 && cmake --build $B -j16 > $L/build.log 2>&1; echo "build rc=$? at $(el)s"; }
MK_NT_MPI=1 timeout 150 bash scripts/prepare_nccl_tests.sh $B .nccl-tests > $L/nt-prepare.log 2>&1; echo "prepare rc=$? at $(el)s"; tail -3 $L/nt-prepare.log
MK_NT_PROCS=4 MK_NT_MODES=0 MK_NT_MAXBYTES=1M MK_NT_ITERS="-n 2 -w 1" MK_NT_BUDGET=150 timeout 200 bash scripts/run_nccl_tests_reg.sh $B \
  all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf alltoall_perf sendrecv_perf gather_perf scatter_perf > $L/nt-reg.log 2>&1; echo "nt reg rc=$? at $(el)s"
grep -E "NCCL-TESTS|PASS|FAIL" $L/nt-reg.log | tail -24; tarup
left=$(( 330 - $(el) )); echo "nvn budget ${left}s"
[ $left -gt 100 ] && MK_NVN_BUDGET=$(( left - 20 )) timeout $left bash bench/net_vs_nccl.sh $B $L/nvn --quick --no-bound > $L/nvn.log 2>&1; echo "nvn rc=$? at $(el)s"
grep -E "^\| " $L/nvn/net_vs_nccl.md 2>/dev/null | head -30; tail -3 $L/nvn.log; echo quit | nvidia-cuda-mps-control 2>/dev/null; tarup
# The README's demo command (builds into ./build: library and demo only).
timeout 120 bash scripts/demo.sh > $L/demo.log 2>&1; echo "demo rc=$? at $(el)s"; tail -4 $L/demo.log; tarup
left=$(( 570 - $(el) )); echo "fvn budget ${left}s"
[ $left -gt 90 ] && MK_FVN_BUDGET=$(( left - 30 )) timeout $left bash bench/fused_vs_nccl.sh $B $L/fvn --quick > $L/fvn.log 2>&1; echo "fvn rc=$? at $(el)s"
grep -E "^\| " $L/fvn/fused_vs_nccl.md 2>/dev/null | cut -d'|' -f1-11 | head -14; tarup
