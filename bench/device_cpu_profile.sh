#!/usr/bin/env bash
# Runs on the GPU machine's host (16 cores): where CPU decode time goes. Builds hotmoe and
# bench_matvec without CUDA, forges qwen3-30b-a3b q4_k_m and gpt-oss-20b mxfp4 (or reuses them
# in /tmp/models), and per model and thread count measures the host read bandwidth
# (bench_matvec) and runs tg128 with HOTMOE_POOL_PROF=1: the pool's per-job-kind times (a decode
# layer is the staged front job and the expert FFN job; the output matrix a third kind) and the
# time between jobs. Prints tok/s, the read bandwidth and tok/s over the roofline (weight bytes
# per token / read bandwidth). With TRACE=1 also a third tg128 run with HOTMOE_POOL_TRACE (every
# item of 20 decode steps from the 60th on) summarised by `bench/pool_trace.py --layers PERIOD`
# (env PERIOD, default 4: the stages of a one-job decode layer).
#   bash bench/device_cpu_profile.sh [THREADS...]     (default: 16)
# env: ARGS (more `hotmoe bench` arguments, e.g. --repack), MODELS ("q3 goss").
set -uo pipefail
OUT=${OUT:-/tmp/hotmoe-out}
mkdir -p "$OUT"
b=/tmp/hm-cpu
cmake -S . -B $b -DCMAKE_BUILD_TYPE=Release -DHOTMOE_CUDA=OFF >/dev/null || exit 1
cmake --build $b -j16 --target hotmoe bench_matvec >$OUT/build_cpu.txt 2>&1 ||
  { tail -30 $OUT/build_cpu.txt; exit 1; }
m=/tmp/models
mkdir -p $m
[ -f $m/q3.gguf ] || $b/hotmoe forge --preset qwen3-30b-a3b --type q4_k_m -o $m/q3.gguf 2>&1 | tail -1
[ -f $m/goss.gguf ] || $b/hotmoe forge --preset gpt-oss-20b --type mxfp4 -o $m/goss.gguf 2>&1 | tail -1
gb() { # weight bytes read per decode token (bench/RESULTS.md): qwen3 1.919 GB, gpt-oss 2.574 GB
  [ "$1" = q3 ] && echo 1.919 || echo 2.574
}
for f in ${MODELS:-q3 goss}; do
  for t in ${@:-16}; do
    rd=$($b/bench_matvec -t $t --reps 3 --types q4_K | grep -oE 'bandwidth at the start: [0-9.]+' |
      awk '{print $NF}')
    HOTMOE_POOL_PROF=1 $b/hotmoe bench -m $m/$f.gguf -t $t -r 3 -p 0 -n 128 ${ARGS:-} \
      >$OUT/prof_${f}_$t.txt 2>&1
    ts=$(grep tg128 $OUT/prof_${f}_$t.txt | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
    echo "== $f -t $t: tg128 $ts tok/s, read $rd GB/s, ratio $(awk -v s="$ts" -v r="$rd" -v g="$(gb $f)" \
      'BEGIN {printf "%.3f", s / (r / g)}')"
    grep 'pool profile' $OUT/prof_${f}_$t.txt | sed 's/^hotmoe info: //' | cut -c1-400
    python3 bench/pool_stages.py $OUT/prof_${f}_$t.txt
    if [ -n "${TRACE:-}" ]; then
      HOTMOE_POOL_TRACE_SKIP=${HOTMOE_POOL_TRACE_SKIP:-60} HOTMOE_POOL_TRACE_JOBS=${HOTMOE_POOL_TRACE_JOBS:-20} \
      HOTMOE_POOL_TRACE=$OUT/trace_${f}_$t.csv $b/hotmoe bench -m $m/$f.gguf -t $t -r 1 -p 0 -n 128 ${ARGS:-} \
        >/dev/null 2>&1
      python3 bench/pool_trace.py $OUT/trace_${f}_$t.csv --layers ${PERIOD:-4}
    fi
  done
done
