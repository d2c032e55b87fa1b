#!/usr/bin/env bash
# hf_crosscheck.sh - the device command of the trained model's cross-check against transformers
# (tools/train/hf_crosscheck.py's docstring says what is compared): builds hotmoe with CUDA
# (Release, HOTMOE_CUDA=ON, sm_90, only the hotmoe target) unless HOTMOE_BIN names a binary,
# then converts HFDIR to an f32 GGUF and compares, for the 3 prompts of tools/train/prompts.txt,
# transformers float32 (CPU, eager, TF32 off) with hotmoe on the CPU and with -ngl 99, both with
# an f32 KV cache (GPU_KV=f16: the GPU's default f16 cache, reported only). Needs PyTorch + transformers (the GPU
# machine; no network). The device has no jansson headers: run scripts/device_deps.sh here first
# and carry build/devdeps (and the HF folder, if it is not on the device already).
# Results under $OUT when OUT is set: crosscheck.json, crosscheck.txt, build.log.
# Last line: "hf_crosscheck: PASS ..." or "hf_crosscheck: FAIL (...)"; exit 0 on PASS.
#   bash tools/train/hf_crosscheck.sh HFDIR                  (from the repository root)
#   REFERENCE=hotmoe bash tools/train/hf_crosscheck.sh HFDIR (no torch: hotmoe stands in for HF)
# Environment: HOTMOE_BIN (use this binary, no build), CMAKE_ARGS (extra configure arguments),
# WORK (scratch folder, default /tmp/hf_crosscheck), THREADS (hotmoe's and torch's, default 4),
# GPU (auto|on|off, default auto: -ngl 99 when nvidia-smi lists a GPU), GPU_KV (f32|f16, default
# f32: the GPU held to the same bar), REFERENCE (hf|hotmoe).
set -u
if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: bash tools/train/hf_crosscheck.sh HFDIR   (HFDIR: config.json, model.safetensors," \
    "tokenizer.json, ...)" >&2
  exit 2
fi
hf=$(cd "$1" && pwd)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${WORK:-/tmp/hf_crosscheck}
ncpu=$(nproc 2>/dev/null || echo 4)
threads=${THREADS:-$((ncpu < 4 ? ncpu : 4))}
mkdir -p "$work"
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
t0=$(date +%s)
bin=${HOTMOE_BIN:-}
if [ -z "$bin" ]; then
  b=$work/build
  blog=${OUT:+$OUT/build.log}
  blog=${blog:-$work/build.log}
  [ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
  # shellcheck disable=SC2086 # CMAKE_ARGS: extra words for the configure step
  configure() {
    cmake -S "$root" -B "$b" -DCMAKE_BUILD_TYPE=Release -DHOTMOE_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 ${CMAKE_ARGS:-} "$@"
  }
  ok=0
  deps=()
  [ -d "$root/build/devdeps/usr" ] && deps=(-DHM_DEPS_PREFIX="$root/build/devdeps/usr")
  configure "${deps[@]}" >"$blog" 2>&1 && ok=1
  if [ $ok = 0 ] && [ ! -d "$root/build/devdeps/usr" ]; then
    # jansson's headers missing (the GPU machine has only its run-time library): unpack them
    echo "configure failed; trying scripts/device_deps.sh (jansson headers)" | tee -a "$blog"
    bash "$root/scripts/device_deps.sh" >>"$blog" 2>&1
    configure -DHM_DEPS_PREFIX="$root/build/devdeps/usr" >>"$blog" 2>&1 && ok=1
  fi
  if [ $ok = 0 ] || ! cmake --build "$b" -j"$ncpu" --target hotmoe >>"$blog" 2>&1; then
    tail -20 "$blog"
    echo "hf_crosscheck: FAIL (build failed, log: $blog)"
    exit 1
  fi
  if ! grep -q "hotmoe: CUDA ON" "$blog"; then
    echo "note: built without CUDA ($(grep -m1 'hotmoe: CUDA' "$blog")): -ngl 99 will not run"
  fi
  bin=$b/hotmoe
  echo "built $bin in $(($(date +%s) - t0)) s"
fi
python3 "$root/tools/train/hf_crosscheck.py" --hotmoe "$bin" --hf "$hf" --work "$work" \
  --reference "${REFERENCE:-hf}" --gpu "${GPU:-auto}" --gpu-kv "${GPU_KV:-f32}" --threads "$threads" ${OUT:+--out "$OUT"}
rc=$?
echo "total $(($(date +%s) - t0)) s"
exit $rc
