#!/usr/bin/env bash
# kv_f32_check.sh - the device command of the f32 KV cache check: builds hotmoe for the CPU
# (Release, HOTMOE_CUDA=OFF, only the hotmoe target) unless HOTMOE_BIN names a binary, then runs
# tools/reference/kv_f32_check.py (its docstring says what is compared): the five tiny presets
# forged in f32 with their HuggingFace twins, hotmoe logits with f32, f16 and bf16 KV caches on
# the CPU against transformers in float32 and float64. Needs PyTorch + transformers (the GPU
# machine; no network). Results under $OUT (kv_f32_check.json, kv_f32_check.txt, build.log)
# when OUT is set. Last line: "kv_f32_check: PASS" or "kv_f32_check: FAIL (...)"; exit 0 on PASS.
#   bash tools/reference/kv_f32_check.sh                    (from the repository root)
#   REFERENCE=golden bash tools/reference/kv_f32_check.sh   (no torch: the committed goldens)
# Environment: HOTMOE_BIN (use this binary, no build), CMAKE_ARGS (extra configure arguments),
# WORK (scratch folder, default /tmp/kv_f32_check), THREADS (hotmoe's and torch's, default 4).
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${WORK:-/tmp/kv_f32_check}
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
  # shellcheck disable=SC2086 # CMAKE_ARGS: extra words for the configure step
  configure() {
    cmake -S "$root" -B "$b" -DCMAKE_BUILD_TYPE=Release -DHOTMOE_CUDA=OFF ${CMAKE_ARGS:-} "$@"
  }
  ok=0
  configure >"$blog" 2>&1 && ok=1
  if [ $ok = 0 ] && [ -f "$root/scripts/device_deps.sh" ]; then
    # jansson's headers missing (the GPU machine has only its run-time library): unpack them
    echo "configure failed; trying scripts/device_deps.sh (jansson headers)" | tee -a "$blog"
    bash "$root/scripts/device_deps.sh" >>"$blog" 2>&1
    configure -DHM_DEPS_PREFIX="$root/build/devdeps/usr" >>"$blog" 2>&1 && ok=1
  fi
  if [ $ok = 0 ] || ! cmake --build "$b" -j"$ncpu" --target hotmoe >>"$blog" 2>&1; then
    tail -20 "$blog"
    echo "kv_f32_check: FAIL (build failed, log: $blog)"
    exit 1
  fi
  bin=$b/hotmoe
  echo "built $bin in $(($(date +%s) - t0)) s"
fi
python3 "$root/tools/reference/kv_f32_check.py" --hotmoe "$bin" --work "$work" \
  --reference "${REFERENCE:-hf}" --threads "$threads" ${OUT:+--out "$OUT"}
rc=$?
echo "total $(($(date +%s) - t0)) s"
exit $rc
