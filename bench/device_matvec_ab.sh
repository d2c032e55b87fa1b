#!/usr/bin/env bash
# Runs on the GPU machine's host: A/B of bench_matvec (streaming CPU matvec ÷ read bandwidth)
# across builds of different source trees (e.g. src/base/tune.h with another prefetch distance)
# or compile flags. Each variant is NAME=SRCDIR[:FLAGS]; all are built (CPU only, in parallel),
# then `bench_matvec -t 16 $ARGS` runs ROUNDS times per variant, the variants alternated inside
# each round (a shared host's bandwidth drifts). Prints each run's table rows and ratio column.
#   ARGS="--types q4_K,q6_K --x8" ROUNDS=2 bash bench/device_matvec_ab.sh base=.devrun/a new=.
set -uo pipefail
OUT=${OUT:-/tmp/hotmoe-out}
mkdir -p "$OUT"
rounds=${ROUNDS:-2}
args=${ARGS:---types q4_K,q6_K --x8}
names=()
j=$((16 / $#))
for v in "$@"; do
  name=${v%%=*} rest=${v#*=} src=${rest%%:*} flags=""
  [ "$rest" != "$src" ] && flags=${rest#*:}
  names+=("$name")
  (cmake -S "$src" -B /tmp/mv-$name -DCMAKE_BUILD_TYPE=Release -DHOTMOE_CUDA=OFF \
     "-DCMAKE_C_FLAGS=$flags" >/dev/null &&
   cmake --build /tmp/mv-$name -j$j --target bench_matvec >$OUT/mv_build_$name.txt 2>&1) ||
    { echo "build $name failed"; tail -20 $OUT/mv_build_$name.txt; } &
done
wait
for r in $(seq $rounds); do
  for n in "${names[@]}"; do
    echo "== $n round $r" | tee -a $OUT/mv_ab.txt
    /tmp/mv-$n/bench_matvec -t 16 --reps 3 $args 2>&1 | grep -E '^\||bandwidth' | tee -a $OUT/mv_ab.txt
  done
done
