#!/usr/bin/env bash
# Functions for one-off GPU call scripts (bench/results/session*/call*.sh), sourced from the
# root of a `git archive` snapshot on the device machine. Every call script repeated the same
# preamble (logs under $OUT, a clock, the README's Release configure with a subset of GPU test
# files, builds and runs bounded by the call's time limit, logs tarred after each step so a
# cut call still returns them); this is that preamble once.
#
#   source scripts/gpu_call.sh
#   gc_init F                                   # logs in $OUT/logsF, tar in $OUT/logsF.tgz
#   gc_nvcc bench/l2_feed.cu /tmp/l2_feed               # one stand-alone bench, nvcc alone
#   gc_build /tmp/b "gpu/test_fused_*.cu" mk_gpu_tests bench_fused_bench
#   gc_reuse /tmp/b "gpu/test_fused_*.cu" mk_gpu_tests  # a later call: reuse or rebuild
#   gc_tests /tmp/b '*Fused*:*GemmColl*' 500 150  # stop by 500 s into the call, 150 s at most
#   gc_fused_bench /tmp/b pf1 585 "--ranks 4 --reps 10 --shapes ar:8192x8192x8192" \
#       MKERNEL_FUSED_DEBUG=0                   # env assignments after the arguments
#   gc_moe_bench /tmp/b ffn4 450 90 --ffn --ranks 4 --warmup 1 --shapes 7168:2048:256:8:4096
#   gc_run grouped 530 80 30 0 "^\|" python3 bench/grouped_bench.py --build /tmp/b
#   gc_mps_start; ...; gc_mps_stop              # CUDA MPS for the processes layouts only
#   gc_tar
#
# Times are seconds since gc_init. Nothing here waits without a bound (timeout on every step).

gc_init() {  # NAME
  export PATH=/usr/local/cuda/bin:$PATH
  GC_NAME=logs$1
  GC_L=$OUT/$GC_NAME
  GC_T0=$(date +%s)
  mkdir -p "$GC_L"
  echo "commit $(cat COMMIT_SNAP 2>/dev/null || echo unknown)"
}

gc_el() { echo $(($(date +%s) - GC_T0)); }

gc_tar() { tar -czf "$OUT/$GC_NAME.tgz" -C "$OUT" "$GC_NAME"; }

# CUDA MPS for steps whose ranks are processes. Never around steps with several ranks in one
# process: under MPS such ranks waited for each other until the timeout in session 32 (cause
# not established: session 33's probe ran 16 streams side by side with and without MPS).
gc_mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  timeout 30 nvidia-cuda-mps-control -d && echo "MPS started"
}

gc_mps_stop() { echo quit | timeout 30 nvidia-cuda-mps-control; }

# Seconds left before `until` (seconds since gc_init), at most `cap`; prints 0 when none.
gc_left() {  # UNTIL CAP
  local left=$(($1 - $(gc_el)))
  [ "$left" -gt "$2" ] && left=$2
  [ "$left" -lt 0 ] && left=0
  echo "$left"
}

# A single-file benchmark (no library) built with nvcc alone, in seconds where the README's
# build takes minutes; a wgmma that ptxas serialises (its warning names it) is echoed, since it
# would invalidate a rate.
gc_nvcc() {  # SOURCE OUTPUT
  local log
  log=$GC_L/nvcc_$(basename "$2").log
  timeout 150 nvcc -Iinclude -Isrc -I. -Ibench -gencode=arch=compute_90a,code=sm_90a \
    --expt-relaxed-constexpr -O3 -DNDEBUG -std=c++17 "$1" -o "$2" >"$log" 2>&1
  local rc=$?
  echo "$(basename "$2") build rc=$rc at $(gc_el)s"
  grep -m5 -iE "error|serializ" "$log"
  return $rc
}

# GC_CMAKE_ARGS adds configure options (e.g. -DMK_BUILD_F16=OFF for bf16-only calls: half the CPU
# time, but on the GPU machine's 16 cores the slowest units bound the wall time: 161 s against
# 162 s in session 62). The slowest units' compile times go to build_times.log (from this build
# directory's whole ninja log), to see what a call's build pays for.
gc_build() {  # DIR MK_GPU_TESTS TARGET...
  local dir=$1 tests=$2
  shift 2
  # shellcheck disable=SC2086  # GC_CMAKE_ARGS is a list of options
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMK_GPU_TESTS="$tests" \
    ${GC_CMAKE_ARGS:-} >"$GC_L/cfg.log" 2>&1
  timeout "${GC_BUILD_S:-330}" cmake --build "$dir" -j"$(nproc)" --target "$@" \
    >"$GC_L/build.log" 2>&1
  local rc=$?
  echo "build rc=$rc at $(gc_el)s"
  awk 'NR > 1 { print ($2 - $1) / 1000, $4 }' "$dir/.ninja_log" 2>/dev/null | sort -rn |
    head -20 >"$GC_L/build_times.log"
  tail -1 "$GC_L/build.log"
  grep -m5 -E "error" "$GC_L/build.log"
  export LD_LIBRARY_PATH=$dir/src MKERNEL_TIMEOUT_MS=${MKERNEL_TIMEOUT_MS:-20000}
  return $rc
}

# A later call on the same warm machine: reuses DIR's build when its test binary is there
# (the machine was kept), else builds it as gc_build does.
gc_reuse() {  # DIR MK_GPU_TESTS TARGET...
  if [ -x "$1/tests/mk_gpu_tests" ]; then
    export LD_LIBRARY_PATH=$1/src MKERNEL_TIMEOUT_MS=${MKERNEL_TIMEOUT_MS:-20000}
    echo "reusing $1"
  else
    echo "no $1: the machine was not kept; building"
    GC_BUILD_S=${GC_BUILD_S:-450} gc_build "$@"
  fi
}

gc_tests() {  # DIR FILTER UNTIL CAP
  local left
  left=$(gc_left "$3" "$4")
  [ "$left" -lt 10 ] && { echo "tests skipped: no time left"; return 1; }
  timeout "$left" "$1/tests/mk_gpu_tests" --gtest_filter="$2" >"$GC_L/tests.log" 2>&1
  local rc=$?
  echo "tests rc=$rc at $(gc_el)s"
  grep -E "^\[  (PASSED|FAILED) |tests? ran" "$GC_L/tests.log" | tail -3
  grep -E "^\[  FAILED  \] [A-Za-z]" "$GC_L/tests.log" | head -20
  gzip -f "$GC_L/tests.log"
  gc_tar
  return $rc
}

# One bounded step: COMMAND... (with `--out $GC_L/NAME.json` appended when JSON is 1), output
# in $GC_L/NAME.log, the lines matching PATTERN echoed; skipped with fewer than MIN seconds left.
gc_run() {  # NAME UNTIL CAP MIN JSON PATTERN COMMAND...
  local name=$1 until=$2 cap=$3 min=$4 json=$5 pat=$6 left
  shift 6
  left=$(gc_left "$until" "$cap")
  [ "$left" -lt "$min" ] && { echo "$name skipped: no time left"; return 1; }
  if [ "$json" = 1 ]; then
    timeout "$left" "$@" --out "$GC_L/$name.json" >"$GC_L/$name.log" 2>&1
  else
    timeout "$left" "$@" >"$GC_L/$name.log" 2>&1
  fi
  local rc=$?
  echo "$name rc=$rc at $(gc_el)s"
  grep -E "$pat" "$GC_L/$name.log"
  gc_tar
  return $rc
}

gc_fused_bench() {  # DIR NAME UNTIL "ARGS" [ENV=VALUE...]
  local dir=$1 name=$2 until=$3 args=$4
  shift 4
  # shellcheck disable=SC2086  # ARGS is a list of options
  gc_run "$name" "$until" 60 20 1 "^\| gemm_|gates expired|FAIL|differs" \
    env "$@" "$dir/bench/bench_fused_bench" $args
}

# bench_moe_threads_bench (needs --warmup >= 1) with its table lines echoed.
gc_moe_bench() {  # DIR NAME UNTIL CAP ARGS...
  local dir=$1 name=$2 until=$3 cap=$4
  shift 4
  gc_run "$name" "$until" "$cap" 15 1 "^H=|FAIL" "$dir/bench/bench_moe_threads_bench" "$@"
}
