#!/usr/bin/env bash
# Host-bound small grouped collectives: which commit added ~4.5 us per 4-rank group?
set -u
X=$(pwd); export PATH=/usr/local/cuda/bin:$PATH; t0=$(date +%s)
NI=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/include
trees=$(ls -d */ | tr -d /)
for t in $trees; do
  inc=(); [ $t = 61d90b7 ] && inc=(-DCMAKE_CXX_FLAGS="-include cstdint -include cstring -include string -include vector -include memory -include utility -include algorithm -include map -include functional -include atomic -include mutex -include thread -include chrono" -DCMAKE_CUDA_FLAGS="--pre-include cstdint --pre-include cstring --pre-include string --pre-include vector --pre-include memory --pre-include utility --pre-include algorithm --pre-include map --pre-include functional --pre-include atomic --pre-include mutex --pre-include thread --pre-include chrono")
  NCCL_HOME=$(dirname $NI) cmake -S $t -B $t/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DMK_BUILD_TESTS=OFF -DMK_BUILD_BENCH=ON -DMK_NCCL_INCLUDE_DIR:PATH=$NI "${inc[@]}" > $t.cfg.log 2>&1 || echo "cfg $t failed"
done
for t in $trees; do (timeout 300 cmake --build $t/b -j8 --target bench_coll_bench > $t.build.log 2>&1 || echo "build $t failed: $(tail -3 $t.build.log)") & done; wait
echo "built at $(( $(date +%s)-t0 ))s"
for r in 1 2 3 4 5 6; do for m in d c32; do for t in $trees; do
  env=(); [ $m = c32 ] && env=(CUDA_DEVICE_MAX_CONNECTIONS=32)
  env "${env[@]}" timeout 60 $t/b/bench/bench_coll_bench --no-real-nccl --skip single,shared -b 16 -e 64K -f 64 -w 50 -n 1000 --colls allreduce,allgather,reducescatter,broadcast --out $X/res-$t@$m-$r.json > $t.$m.run$r.log 2>&1 || echo "run $t $m $r rc=$?"
done; done; done
echo "ran at $(( $(date +%s)-t0 ))s"
python3 - <<'PY'
import json,glob,collections,statistics
def find(o):
    if isinstance(o,dict):
        for k,v in o.items():
            if k=="sweep": return v
            r=find(v)
            if r: return r
    return None
d=collections.defaultdict(list)
for f in sorted(glob.glob("res-*.json")):
    t=f.split("-")[1]
    for row in find(json.load(open(f))) or []:
        d[(t,row["coll"],row["size_bytes"])].append(row["time_us"])
trees=sorted({k[0] for k in d}); keys=sorted({k[1:] for k in d})
print("coll size "+" ".join(trees))
for t in trees:
    ms=[]
    for f in sorted(glob.glob("res-%s-*.json"%t)):
        rows=[x["time_us"] for x in find(json.load(open(f)))]; ms.append(sum(rows)/len(rows))
    print("per-run means", t, " ".join("%.1f"%m for m in ms))
for k in keys: print(k[0],k[1]," ".join("%.2f"%statistics.median(d[(t,)+k]) if d[(t,)+k] else "-" for t in trees))
PY
tar -czf $OUT/bisect.tgz *.log res-*.json
