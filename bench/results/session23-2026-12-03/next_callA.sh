#!/usr/bin/env bash
# For the next session, first call: scripts/test.sh split in two calls (whole, it no longer
# fits one 600 s call: session 23's call 1 was cut with mk_gpu_tests still running).
# A: the build of scripts/test.sh into /tmp/bt, then every ctest entry but mk_gpu_tests.
# Run next_callB.sh right after (the machine stays warm ~30 s and keeps /tmp/bt).
export PATH=/usr/local/cuda/bin:$PATH
set -u
L=$OUT/logsA; mkdir -p $L; t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
echo "commit $(cat COMMIT_SNAP)"
bash scripts/install_deps.sh > $L/deps.log 2>&1
cmake -S . -B /tmp/bt -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/cfg.log 2>&1
timeout 400 cmake --build /tmp/bt -j16 > $L/build.log 2>&1
echo "build rc=$? at $(el)s"; tail -1 $L/build.log; grep -m5 -E "error" $L/build.log
R=$PWD; (cd /tmp/bt && bash $R/tests/fault/netns_test.sh /tmp/bt/tests/mk_mp_tests) > $L/netns.log 2>&1 || true
left=$(( 585 - $(el) ))
(cd /tmp/bt && timeout $left ctest -E '^mk_gpu_tests$' -j4 --timeout 300 --output-on-failure) > $L/ctest.log 2>&1
echo "ctest rc=$? at $(el)s"; grep -E "tests passed|tests failed" $L/ctest.log
grep -E "\*\*\*Failed|\*\*\*Timeout" $L/ctest.log | head
gzip -f $L/ctest.log
