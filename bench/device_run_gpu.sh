#!/usr/bin/env bash
# Runs on the GPU machine (H100): builds hotmoe with CUDA, runs every test with a GPU expected,
# compute-sanitizer (memcheck, racecheck) on full-GPU runs of the tiny models, the GPU kernel
# benchmarks, then full-GPU `hotmoe bench` (pp512, tg128 with the decode audit) and time to first
# token on the forged qwen3-30b-a3b q4_k_m and gpt-oss-20b mxfp4. Everything lands in $OUT.
#   bash bench/device_run_gpu.sh COMMIT [quick|ttft]
#     quick: build, tests and sanitizer only; ttft: build hotmoe, time to first token only.
# The device has no jansson headers: run scripts/device_deps.sh here first and carry build/devdeps.
# The TTFT prompt (bench/prompts/ttft512.txt) is 512 tokens with the forged presets' vocabularies.
set -uo pipefail
commit=${1:-unknown}
OUT=${OUT:-/tmp/hotmoe-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/device_gpu_log.txt") 2>&1 # (no bare `wait` below: it would wait for tee)
echo "commit $commit, $(date -u +%FT%TZ)"
nproc; grep -m1 'model name' /proc/cpuinfo
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
export PATH=$PATH:/usr/local/cuda/bin
b=/tmp/hm-build
deps="" # jansson's headers and link, unpacked by scripts/device_deps.sh
[ -d build/devdeps/usr ] && deps="-DHM_DEPS_PREFIX=$PWD/build/devdeps/usr"
cmake -S . -B $b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 $deps >/dev/null || exit 1
t0=$(date +%s)
target=""
[ "${2:-}" = ttft ] && target="--target hotmoe"
cmake --build $b -j16 $target >$OUT/build.txt 2>&1 || { tail -40 $OUT/build.txt; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
m=/tmp/models
mkdir -p $m
ttft() { # time to first token: prompt processing of the 512-token prompt, 3 runs per model
  for f in q3 goss; do
    for r in 1 2 3; do
      $b/hotmoe run -m $m/$f.gguf -ngl 99 --gpu-strict -f bench/prompts/ttft512.txt -n 1 --temp 0 \
        2>&1 >/dev/null | grep -E '^(prompt|generation|hotmoe)' | sed "s/^/$f: /"
    done
  done
}
forge_big() {
  [ -f $m/q3.gguf ] || $b/hotmoe forge --preset qwen3-30b-a3b --type q4_k_m -o $m/q3.gguf 2>&1 | tail -1
  [ -f $m/goss.gguf ] || $b/hotmoe forge --preset gpt-oss-20b --type mxfp4 -o $m/goss.gguf 2>&1 | tail -1
}
if [ "${2:-}" = ttft ]; then
  forge_big
  ttft
  exit 0
fi

echo "== tests (HOTMOE_EXPECT_GPU=1) =="
HOTMOE_EXPECT_GPU=1 ctest --test-dir $b -j8 --output-on-failure >$OUT/ctest.txt 2>&1
grep -E 'tests passed|Failed|\*\*\*|Timeout' $OUT/ctest.txt
grep -hE '^(GPU|gpu|max|rms|tolerance)' $OUT/ctest.txt | head -40

echo "== compute-sanitizer =="
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
mkdir -p $OUT/cs
for p in tiny-qwen3moe:q4_k_m tiny-mixtral:q8_0 tiny-olmoe:f32 tiny-gpt-oss:mxfp4 tiny-qwen2moe:q4_k_m; do
  pre=${p%%:*} ty=${p##*:}
  $b/hotmoe forge --preset $pre --type $ty --no-hf -q -o $m/$pre.gguf >/dev/null 2>&1
  for tool in memcheck racecheck; do
    $cs --tool $tool --error-exitcode 3 $b/hotmoe run -m $m/$pre.gguf -ngl 99 --gpu-strict \
      -p "the quick brown fox" -n 24 --temp 0 >$OUT/cs/${tool}_$pre.txt 2>&1
    echo "$tool $pre $ty: exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/cs/${tool}_$pre.txt | tr '\n' ' '))"
  done
done
tar czf $OUT/sanitizer_logs.tgz -C $OUT cs && rm -rf $OUT/cs # (few files come back from the device)
[ "${2:-}" = quick ] && exit 0

echo "== GPU kernels =="
$b/bench_cuda_matvec 2>&1 | tee $OUT/bench_cuda_matvec.txt
$b/bench_cuda_gemm --iters 20 2>&1 | tee $OUT/bench_cuda_gemm.txt

echo "== full-GPU hotmoe bench =="
forge_big
for f in q3 goss; do
  $b/hotmoe bench -m $m/$f.gguf -ngl 99 --gpu-strict -r 3 -o json >$OUT/bench_gpu_$f.json 2>$OUT/bench_gpu_$f.err
  $b/hotmoe bench -m $m/$f.gguf -ngl 99 --gpu-strict -r 3 --audit 2>&1
done
ttft
$b/bench_cuda_matvec 2>&1 | grep -iE 'copy|device-to-device' | head -3
