#!/usr/bin/env bash
# The main job on its embedded default: forge a tiny qwen3moe model (q4_k_m mix), inspect it, then
# generate text from it with the CPU engine (random weights: the text is noise; speeds are real).
# Extra arguments go to `hotmoe forge` (e.g. --preset tiny-gpt-oss --type mxfp4).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
bin=$(bash scripts/build.sh | tail -n 1)
out=build/demo
mkdir -p "$out"
"$bin" forge --preset tiny-qwen3moe --type q4_k_m --seed 1 -o "$out/tiny-qwen3moe.gguf" "$@"
"$bin" inspect "$out/tiny-qwen3moe.gguf"
"$bin" run -m "$out/tiny-qwen3moe.gguf" -p "The ferry left the north bank" -n 32 --seed 1
