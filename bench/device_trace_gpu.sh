#!/usr/bin/env bash
# Runs on the GPU machine: where a decode step's time goes inside the replayed graph. Builds
# hotmoe (or reuses $b) and the CUPTI tracer bench/hm_trace.c, runs full-GPU tg128 under it,
# and summarises the graph's kernels: per kernel name, the mean time from the previous kernel's
# end to this one's end (the kernels complete in stream order, so these add up to the step) and
# the mean start-to-end span (longer than that under programmatic dependent launch: a kernel
# starts, and waits, while its predecessor runs).
# Kernels outside the graph (prompt processing, e.g. PP=512 for a pp512 run first) are listed
# after, end to end per kernel name.
#   [PP=512] [ARGS="..."] [FIRST=N] bash bench/device_trace_gpu.sh [preset:type] [STEPS]
# STEPS: decode steps summarised (64): the last ones (those of the bench's 1024-token audit
# generation, at contexts ~960-1024), or with FIRST=N the steps N .. N + STEPS - 1 counted from
# the first traced step (the warm-up and tg128 generations come first, then the audit: e.g.
# FIRST=40 for tg128-like contexts). A smaller -c in ARGS shortens the audit but also caps the
# decode attention's splits (n_ctx / 128), which slows attention: prefer FIRST.
set -uo pipefail
spec=${1:-qwen3-30b-a3b:q4_k_m}
steps=${2:-64}
OUT=${OUT:-/tmp/hotmoe-out}
mkdir -p "$OUT"
export PATH=$PATH:/usr/local/cuda/bin
b=${b:-/tmp/hm-build}
if [ ! -x $b/hotmoe ]; then
  cmake -S . -B $b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null || exit 1
  cmake --build $b -j16 --target hotmoe >$OUT/build_trace.txt 2>&1 || { tail -30 $OUT/build_trace.txt; exit 1; }
fi
cu=$(dirname "$(dirname "$(command -v nvcc)")")
lib=$(ls -d $cu/lib64 $cu/lib $cu/extras/CUPTI/lib64 2>/dev/null | head -1)
gcc -O2 -shared -fPIC -I$cu/include -I$cu/extras/CUPTI/include bench/hm_trace.c \
  -L$lib -L$cu/extras/CUPTI/lib64 -lcupti -Wl,-rpath,$lib:$cu/extras/CUPTI/lib64 \
  -o /tmp/libhm_trace.so || exit 1
m=/tmp/models; mkdir -p $m
pre=${spec%%:*} ty=${spec##*:}
f=$m/$pre-$ty.gguf
[ -f $f ] || $b/hotmoe forge --preset $pre --type $ty -o $f 2>&1 | tail -1
csv=$OUT/trace_$pre.csv
CUDA_INJECTION64_PATH=/tmp/libhm_trace.so HM_TRACE_OUT=$csv \
  $b/hotmoe bench -m $f -ngl 99 --gpu-strict -r 1 -p ${PP:-0} -n 128 ${ARGS:-} 2>&1 | grep -E 'pp|tg128|hm_trace'
python3 - "$csv" "$steps" "${FIRST:--1}" <<'PY'
import csv, sys, collections
rows = [r for r in csv.DictReader(open(sys.argv[1]))]
g = [r for r in rows if r['graph_id'] != '0']
g.sort(key=lambda r: int(r['end_ns']))
if not g: sys.exit("no graph kernels traced")
# a step starts with the sampler; take STEPS steps (the last ones, or from FIRST)
first = g[0]['name']
starts = [i for i, r in enumerate(g) if r['name'] == first]
steps, from_step = int(sys.argv[2]), int(sys.argv[3])
if from_step >= 0 and from_step + steps < len(starts):
    lo, hi = starts[from_step], starts[from_step + steps]
else:
    lo = starts[-steps - 1] if len(starts) > steps else starts[0]
    hi = starts[-1]
sel = g[lo:hi]
n_steps = sum(1 for r in sel if r['name'] == first)
crit = collections.defaultdict(float); span = collections.defaultdict(float); cnt = collections.Counter()
prev_end = int(g[lo - 1]['end_ns']) if lo > 0 else int(sel[0]['start_ns'])
for r in sel:
    s, e = int(r['start_ns']), int(r['end_ns'])
    name = r['name'].split('(')[0][:60]
    crit[name] += e - prev_end; span[name] += e - s; cnt[name] += 1
    prev_end = e
tot = sum(crit.values())
print(f"{n_steps} decode steps, {len(sel)} kernels, {tot / n_steps / 1e3:.1f} us per step")
print(f"{'share':>6} {'us/step':>8} {'n/step':>6} {'end-to-end us':>13} {'span us':>8}  kernel")
for name, c in sorted(crit.items(), key=lambda x: -x[1]):
    print(f"{100 * c / tot:5.1f}% {c / n_steps / 1e3:8.1f} {cnt[name] / n_steps:6.1f} "
          f"{c / cnt[name] / 1e3:13.2f} {span[name] / cnt[name] / 1e3:8.2f}  {name}")
# kernels outside the graph (prompt processing, first step): time per name, end to end as above
p = sorted((r for r in rows if r['graph_id'] == '0'), key=lambda r: int(r['end_ns']))
if p:
    pc = collections.defaultdict(float); pn = collections.Counter()
    prev = int(p[0]['start_ns'])
    for r in p:
        e = int(r['end_ns']); name = r['name'].split('(')[0][:60]
        pc[name] += max(e - prev, 0); pn[name] += 1; prev = e
    pt = sum(pc.values())
    print(f"\noutside the graph: {len(p)} kernels, {pt / 1e3:.1f} us end to end")
    for name, c in sorted(pc.items(), key=lambda x: -x[1])[:25]:
        print(f"{100 * c / pt:5.1f}% {c / 1e3:10.1f} us {pn[name]:6d} x  {name}")
PY
