#!/usr/bin/env bash
# The main job: builds hotmoe, then runs the small qwen3moe model that the repository ships
# (models/demo-moe.gguf, trained on Debian's documentation: docs/TRAINED_MODEL.md) on the CPU:
# a summary of the file, then one prompt continued for 64 tokens, then the speeds. Forges
# nothing. Sampling as the model's generation_config.json says (temperature 0.7, top-p 0.9;
# top-k 50 and no min-p, as transformers samples it) and a repetition penalty of 1.15 over the
# last 64 tokens (a 17 M-parameter model loops without one), with a fixed seed, so a run repeats.
# Extra arguments go to `hotmoe run` and override the ones here (e.g. --temp 0, -p "TEXT",
# -n 128, --seed 7, -ngl 99 for the GPU): hotmoe takes the last value of a repeated flag.
#   bash scripts/demo.sh [hotmoe run options]
# Environment: DEMO_MODEL (another GGUF; default models/demo-moe.gguf), DEMO_PROMPT (default
# "The Debian package manager"), HOTMOE_BIN (run this binary instead of building one).
set -euo pipefail
model=models/demo-moe.gguf
[ -n "${DEMO_MODEL:-}" ] && model=$(realpath -m -- "$DEMO_MODEL")
bin=${HOTMOE_BIN:+$(realpath -m -- "$HOTMOE_BIN")}
cd "$(dirname "$0")/.."
prompt=${DEMO_PROMPT:-The Debian package manager}
if [ ! -s "$model" ]; then
  echo "demo: the model file $model is missing (the repository ships it as models/demo-moe.gguf;" \
    "docs/TRAINED_MODEL.md says how it is made). Set DEMO_MODEL=PATH to run another GGUF." >&2
  exit 1
fi
if [ -z "$bin" ]; then
  mkdir -p build
  bin=$(bash scripts/build.sh | tail -n 1)
fi
"$bin" inspect "$model" | sed -n '1,2p; /^routed experts:/p'
echo
# a prompt among the extra arguments replaces DEMO_PROMPT (hotmoe refuses two)
use_prompt=(-p "$prompt")
for a in "$@"; do
  case $a in -p | --prompt | -f | --file) use_prompt=() ;; esac
done
"$bin" run -m "$model" "${use_prompt[@]}" -n 64 --seed 42 \
  --temp 0.7 --top-p 0.9 --top-k 50 --min-p 0 --repeat-penalty 1.15 "$@"
