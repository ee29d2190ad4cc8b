#!/usr/bin/env bash
# Session 10 call Y: nccl-tests with one thread per rank (-t 2 -g 1, -t 4 -g 1, -t 2 -g 2; issue 11.2)
# at the commit of call Z (library only; nccl-tests source carried as .nccl-tests).
set -u
L=$OUT/logs; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMK_BUILD_TESTS=OFF -DMK_BUILD_BENCH=OFF > $L/build.log 2>&1 && cmake --build build -j16 --target mkernel >> $L/build.log 2>&1; echo "build rc=$? at $(el)s"
timeout 90 bash scripts/prepare_nccl_tests.sh build .nccl-tests > $L/nt-prepare.log 2>&1; echo "prepare rc=$? at $(el)s"; tail -2 $L/nt-prepare.log
left=$(( 330 - $(el) ))
MK_NT_THREADS="2x1 4x1 2x2" MK_NT_MODES=0 MK_NT_BUDGET=$left MK_NT_MAXBYTES=1M MK_NT_ITERS="-n 2 -w 1" MK_NT_GEMM_SIZES="-b 1M -e 1M -f 4" \
  bash scripts/run_nccl_tests.sh build > $L/nt-threads.log 2>&1; echo "nccl-tests threads rc=$? at $(el)s"
tail -45 $L/nt-threads.log
tar -czf $OUT/logs.tgz -C $OUT logs
