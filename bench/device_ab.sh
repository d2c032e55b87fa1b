#!/usr/bin/env bash
# Runs on the GPU machine: A/B decode speed of several builds in one call, on the H100 or (CPU=1)
# on the host's 16 cores. Each variant is NAME=SRCDIR[:FLAGS][%ARGS]: a source tree (a checkout of
# each commit compared, or a copy with one value of src/base/tune.h changed), FLAGS for the C and
# CUDA compilers, ARGS for `hotmoe bench` (e.g. %--repack); every variant is built
# (hotmoe only, in parallel; CPU=1: -DHOTMOE_CUDA=OFF), then tg128 (`hotmoe bench -p 0 -n 128
# -r 3` with `-ngl 99 --gpu-strict`, or `-t 16`) runs ROUNDS times per model, the variants
# alternated inside each round so that clock, thermal and host-bandwidth drift hit all of them
# alike (CPU=1 also measures the host read bandwidth once per round). Prints every run and the
# mean per variant and model.
#   bash bench/device_ab.sh base=.devrun/a new=.devrun/b newr=.devrun/b%--repack
# env: ROUNDS (2), MODELS ("q3 goss": the forged qwen3-30b-a3b q4_k_m, gpt-oss-20b mxfp4), CPU,
# READ_FROM (the variant whose bench_matvec measures the read bandwidth; default the last one:
# usually the newest tree, whose read test tries the most ways),
# PP (e.g. 512: ppPP instead of tg128), PROF (CPU=1: runs with HOTMOE_POOL_PROF=1 and prints each
# run's mean time per job kind and between jobs, steadier than tok/s for small changes).
set -uo pipefail
OUT=${OUT:-/tmp/hotmoe-out}
mkdir -p "$OUT"
export PATH=$PATH:/usr/local/cuda/bin
rounds=${ROUNDS:-2}
models=${MODELS:-q3 goss}
m=/tmp/models
mkdir -p $m
names=()
j=$((16 / $#))
declare -A vargs
for v in "$@"; do
  name=${v%%=*} rest=${v#*=}
  vargs[$name]=""
  case "$rest" in *%*) vargs[$name]=${rest#*%}; rest=${rest%%%*} ;; esac
  src=${rest%%:*} flags=""
  [ "$rest" != "$src" ] && flags=${rest#*:}
  names+=("$name")
  cuda="-DCMAKE_CUDA_ARCHITECTURES=90"; tg=hotmoe
  [ -n "${CPU:-}" ] && cuda="-DHOTMOE_CUDA=OFF" && tg="hotmoe bench_matvec"
  (cmake -S "$src" -B /tmp/ab-$name -DCMAKE_BUILD_TYPE=Release $cuda \
     "-DCMAKE_CUDA_FLAGS=$flags" "-DCMAKE_C_FLAGS=$flags" >/dev/null &&
   cmake --build /tmp/ab-$name -j$j --target $tg >$OUT/ab_build_$name.txt 2>&1) ||
    { echo "build $name failed"; tail -20 $OUT/ab_build_$name.txt; } &
done
wait
b=/tmp/ab-${names[0]}
rb=/tmp/ab-${READ_FROM:-${names[-1]}} # the read figure from this variant's bench_matvec
[ -f $m/q3.gguf ] || $b/hotmoe forge --preset qwen3-30b-a3b --type q4_k_m -o $m/q3.gguf 2>&1 | tail -1
[ -f $m/goss.gguf ] || $b/hotmoe forge --preset gpt-oss-20b --type mxfp4 -o $m/goss.gguf 2>&1 | tail -1
test="-p 0 -n 128" row=tg128
[ -n "${PP:-}" ] && test="-p $PP -n 0" row="pp$PP "
where="-ngl 99 --gpu-strict"
[ -n "${CPU:-}" ] && where="-t 16"
for f in $models; do
  for r in $(seq $rounds); do
    if [ -n "${CPU:-}" ]; then # the ceiling, and BENCHMARKS.md's plain loop beside it
      $rb/bench_matvec -t 16 --reps 3 --types q4_K >$OUT/ab_read.txt 2>&1
      echo "$f read round $r: $(grep -oE 'bandwidth at the start: [0-9.]+' $OUT/ab_read.txt |
        awk '{print $NF}') (plain loop $(grep -oE 'ceiling\): [0-9.]+' $OUT/ab_read.txt |
        awk '{print $NF}'))" | tee -a $OUT/ab.txt
    fi
    for n in "${names[@]}"; do
      HOTMOE_POOL_PROF=${PROF:-0} /tmp/ab-$n/hotmoe bench -m $m/$f.gguf $where -r 3 $test ${vargs[$n]} \
        >$OUT/ab_run.txt 2>&1
      v=$(grep -E "$row" $OUT/ab_run.txt | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
      echo "$f $n round $r: ${v:-failed}" | tee -a $OUT/ab.txt
      [ -n "${PROF:-}" ] && echo "  $f $n round $r jobs (us): $(grep -oE 'stages\): [0-9]+ calls, [0-9.]+ us' \
        $OUT/ab_run.txt | awk '{printf "%s ", $4}')between $(grep -oE '[0-9.]+ s between' \
        $OUT/ab_run.txt | awk '{print $1}') s" | tee -a $OUT/ab_prof.txt &&
        { echo "$f $n round $r"; grep 'pool profile' $OUT/ab_run.txt; } >>$OUT/ab_prof_full.txt
    done
  done
done
echo "== means (tok/s) =="
awk '{k=$1" "$2; s[k]+=$5; c[k]++} END {for (k in s) printf "%s %.2f\n", k, s[k]/c[k]}' $OUT/ab.txt | sort
