#!/usr/bin/env bash
# qwen3next_check.sh - the device command of the Qwen3-Next check: builds hotmoe for the CPU
# (Release, HOTMOE_CUDA=OFF, only the hotmoe target) unless HOTMOE_BIN names a binary, then runs
# tools/reference/qwen3next_check.py (its docstring says what is compared): tiny-qwen3next forged
# in f32 with its HuggingFace twin, hotmoe's logits (f32 KV cache) and greedy continuations on
# the CPU against transformers' Qwen3NextForCausalLM. Needs PyTorch + transformers (the GPU
# machine; no network); without them the last line says SKIPPED and the exit status is 77.
# Results under $OUT (qwen3next_check.json, build.log) when OUT is set. Last line:
# "qwen3next_check: PASS", "... FAIL (...)" or "... SKIPPED (...)"; exit 0 on PASS.
#   bash tools/reference/qwen3next_check.sh                 (from the repository root)
# Environment: HOTMOE_BIN (use this binary, no build), CMAKE_ARGS (extra configure arguments),
# WORK (scratch folder, default /tmp/qwen3next_check), THREADS (hotmoe's and torch's, default 4).
# qwen35moe_check.sh runs this with HYBRID_CHECK (the check's name and Python script) and
# HYBRID_CLASS (the transformers class) set for Qwen3.5-MoE.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
name=${HYBRID_CHECK:-qwen3next_check}
cls=${HYBRID_CLASS:-Qwen3NextForCausalLM}
work=${WORK:-/tmp/$name}
ncpu=$(nproc 2>/dev/null || echo 4)
threads=${THREADS:-$((ncpu < 4 ? ncpu : 4))}
mkdir -p "$work"
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
t0=$(date +%s)
if ! python3 -c "import torch, transformers; transformers.$cls" 2>/dev/null; then
  echo "$name: SKIPPED (needs PyTorch and transformers with $cls)"
  exit 77
fi
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
    echo "$name: FAIL (build failed, log: $blog)"
    exit 1
  fi
  bin=$b/hotmoe
  echo "built $bin in $(($(date +%s) - t0)) s"
fi
python3 "$root/tools/reference/$name.py" --hotmoe "$bin" --work "$work" \
  --threads "$threads" ${OUT:+--out "$OUT"}
rc=$?
echo "total $(($(date +%s) - t0)) s"
exit $rc
