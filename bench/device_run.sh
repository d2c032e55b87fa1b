#!/usr/bin/env bash
# Runs on the GPU machine (16 cores, H100): builds hotmoe with CUDA, runs the whole test suite
# with a GPU expected, then the benchmarks of bench/RESULTS.md. Everything lands in $OUT.
#   bash bench/device_run.sh COMMIT [quick]
# The device has no jansson headers: run scripts/device_deps.sh here first and carry build/devdeps.
set -uo pipefail
commit=${1:-unknown}
OUT=${OUT:-/tmp/hotmoe-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/device_log.txt") 2>&1
echo "commit $commit, $(date -u +%FT%TZ)"
nproc; grep -m1 'model name' /proc/cpuinfo; free -g | head -2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
b=/tmp/hm-build
deps="" # jansson's headers and link, unpacked by scripts/device_deps.sh
[ -d build/devdeps/usr ] && deps="-DHM_DEPS_PREFIX=$PWD/build/devdeps/usr"
cmake -S . -B $b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 $deps >/dev/null || exit 1
cmake --build $b -j16 >$OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
echo "== tests (HOTMOE_EXPECT_GPU=1) =="
HOTMOE_EXPECT_GPU=1 ctest --test-dir $b -j16 --output-on-failure >$OUT/ctest.txt 2>&1
grep -E 'tests passed|Failed|\*\*\*' $OUT/ctest.txt
echo "== bench_matvec, 16 threads =="
$b/bench_matvec -t 16 --reps 5
$b/bench_matvec -t 16 --reps 5 --json >$OUT/matvec16.json
[ "${2:-}" = quick ] && exit 0
echo "== forge throughput =="
m=/tmp/models; mkdir -p $m
tv=""; [ -x /usr/bin/time ] && tv="/usr/bin/time -v"
TIMEFORMAT='wall %R s'
time $tv $b/hotmoe forge --preset qwen3-30b-a3b --type q4_k_m -o $m/q3.gguf 2>&1 | grep -E 'wrote|Elapsed|Maximum resident'
time $tv $b/hotmoe forge --preset gpt-oss-20b --type mxfp4 -o $m/goss.gguf 2>&1 | grep -E 'wrote|Elapsed|Maximum resident'
echo "== hotmoe bench, CPU, 16 threads =="
for f in q3 goss; do
  $b/hotmoe inspect $m/$f.gguf | sed -n '/^tensors:/,/^routed/p'
  $b/hotmoe bench -m $m/$f.gguf -t 16 -r 3 -o json >$OUT/bench_$f.json
  $b/hotmoe bench -m $m/$f.gguf -t 16 -r 3
done
$b/bench_matvec -t 16 --reps 3 --types q4_K,mxfp4,q8_0
