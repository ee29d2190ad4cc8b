#!/usr/bin/env bash
# Session 9 call E: MoE FFN fix + ring abort naming verified; ncu full + SASS hot spots of the attention kernel.
export PATH=/usr/local/cuda/bin:$PATH
L=$OUT/logs; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/build.log 2>&1 && cmake --build build-gpu -j16 >> $L/build.log 2>&1; echo "build rc=$? at $(el)s"; grep -E "error" $L/build.log | head
B=build-gpu/tests/mk_gpu_tests
export LD_LIBRARY_PATH=$PWD/build-gpu/src:${LD_LIBRARY_PATH:-}
timeout 200 $B --gtest_filter='Moe*:*Moe*:*RingAttnAbort*' > $L/moe.log 2>&1; echo "moe+abort rc=$? at $(el)s"
grep -E "FAILED  \]|PASSED|Failure|Which is" $L/moe.log | head -20; grep -cE "OK \]" $L/moe.log
timeout 150 ncu --target-processes all -k regex:attnKernel --launch-skip 1 --launch-count 1 --set full -o $L/attn_d128 -f \
  python3 bench/attn_bench.py single --lib build-gpu/src/libmkernel.so --out $L --seqs 8192 --head-dims 128 --causal no --backends cudnn --torch-layouts bshd --reps 1 --warmup 1 --eager --budget 20 > $L/ncu_run.log 2>&1
echo "ncu rc=$? at $(el)s"
ncu -i $L/attn_d128.ncu-rep --page details > $L/details.txt 2>&1
ncu -i $L/attn_d128.ncu-rep --page source --print-source sass --csv > $L/sass.csv 2>&1
sed -n '/Warp State Statistics/,/Section: /p' $L/details.txt | head -60
grep -iE "stall|Warp Cycles" $L/details.txt | head -40
wc -l $L/sass.csv; head -2 $L/sass.csv | cut -c1-600
tar -czf $OUT/logs.tgz -C $OUT logs; rm -f $L/attn_d128.ncu-rep
