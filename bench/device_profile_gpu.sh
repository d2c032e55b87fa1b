#!/usr/bin/env bash
# Runs on the GPU machine: time and DRAM bytes of every kernel of full-GPU decode steps, with
# Nsight Compute (graph kernel nodes profiled one by one). Builds hotmoe (or reuses $b), forges
# the preset, generates N tokens, skips the first SKIP kernels (prompt, first steps) and
# profiles COUNT kernels (about two decode steps), then sums time and bytes per kernel name.
#   bash bench/device_profile_gpu.sh [preset:type] [SKIP] [COUNT]
# DETAIL=regex adds ncu's speed-of-light, warp-state, launch, occupancy and source-counter
# sections for those kernels (build with LINEINFO=1 for source lines in the stall table).
# NCU_EXTRA adds ncu flags, e.g. "--cache-control none --clock-control none": no cache flush
# and free clocks between kernels, closer to the times inside the replayed graph.
set -uo pipefail
spec=${1:-qwen3-30b-a3b:q4_k_m}
skip=${2:-8000}
count=${3:-1216}
OUT=${OUT:-/tmp/hotmoe-out}
mkdir -p "$OUT"
export PATH=$PATH:/usr/local/cuda/bin
b=${b:-/tmp/hm-build}
if [ ! -x $b/hotmoe ]; then
  li=""; [ -n "${LINEINFO:-}" ] && li="-DCMAKE_CUDA_FLAGS=-lineinfo"
  cmake -S . -B $b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 $li >/dev/null || exit 1
  cmake --build $b -j16 --target hotmoe >$OUT/build_prof.txt 2>&1 || { tail -30 $OUT/build_prof.txt; exit 1; }
fi
m=/tmp/models; mkdir -p $m
pre=${spec%%:*} ty=${spec##*:}
f=$m/$pre-$ty.gguf
[ -f $f ] || $b/hotmoe forge --preset $pre --type $ty -o $f 2>&1 | tail -1
csv=$OUT/ncu_$pre.csv
ncu --graph-profiling node --launch-skip $skip --launch-count $count ${NCU_EXTRA:-} \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
  $b/hotmoe run -m $f -ngl 99 --gpu-strict -p "the quick brown fox" -n 40 --temp 0 \
  >$csv 2>$OUT/ncu_err_$pre.txt
echo "ncu exit $?; $(grep -c '"' $csv) csv lines"
python3 - "$csv" "$count" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
h = rows[0]; data = [dict(zip(h, r)) for r in rows[2:]]
print("units:", dict((k, u) for k, u in zip(h, rows[1]) if k.startswith(('gpu__', 'dram__'))))
def num(d, k):
    try: return float(d[k].replace(',', ''))
    except Exception: return 0.0
agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
for d in data:
    name = d.get('Kernel Name', '?').split('(')[0][:60]
    a = agg[name]; a[0] += 1
    a[1] += num(d, 'gpu__time_duration.sum')
    a[2] += num(d, 'dram__bytes_read.sum') + num(d, 'dram__bytes_write.sum')
tt = sum(a[1] for a in agg.values()); tb = sum(a[2] for a in agg.values())
print(f"{len(data)} kernels, {tt/1e3:.1f} us total, {tb/1e6:.1f} MB DRAM, {tb/tt:.1f} GB/s overall")
for name, a in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"{100*a[1]/tt:5.1f}% {a[1]/1e3:9.1f} us {a[0]:5d} x {a[1]/a[0]/1e3:7.2f} us {a[2]/1e6:8.2f} MB {a[2]/max(a[1],1):7.1f} GB/s  {name}")
PY
head -3 $OUT/ncu_err_$pre.txt
# stall reasons of the named kernels (DETAIL: a regex of kernel names), one launch each
if [ -n "${DETAIL:-}" ]; then
  ncu --graph-profiling node -k "regex:$DETAIL" --launch-skip 200 --launch-count ${DETAIL_N:-2} \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
    --section SourceCounters \
    $b/hotmoe run -m $f -ngl 99 --gpu-strict -p "the quick brown fox" -n 40 --temp 0 2>/dev/null \
    | grep -vE "^==PROF==|^\s*$|----" | grep -E "k_|Duration|Throughput|Stall|stall|Warp Cycles|Issued|Occupancy|Registers|Block Size|Grid Size|cycles|Achieved|\.cu:|\.cuh:" | head -${DETAIL_LINES:-80}
fi
