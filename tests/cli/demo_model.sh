#!/usr/bin/env bash
# demo_model.sh - the shipped trained model (models/demo-moe.gguf, docs/TRAINED_MODEL.md) writes
# readable English: scripts/demo.sh runs it with this build's binary (exit 0, the file summary,
# the prompt echoed, speeds), then demo.sh continues each prompt of tools/train/prompts.txt
# (its own sampling settings and seed) and at least 70 % of the generated words must be
# dictionary words (tools/train/wordrate.py, Debian's wamerican), each continuation having at
# least 10 words; the same seed gives the same text twice. Skipped (exit 77) while the model
# file does not exist, or without python3 or the dictionary.
#   bash tests/cli/demo_model.sh HOTMOE_BIN TMPDIR      (run from the repository root)
# DEMO_MODEL=PATH tests another GGUF (e.g. a forged one, to test this test: it fails the bar).
set -u
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tmp=$2/demo_model_sh
rm -rf "$tmp"
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"
model=${DEMO_MODEL:-models/demo-moe.gguf}
dict=/usr/share/dict/american-english
[ -s "$model" ] || cli_skip "$model does not exist yet"
command -v python3 >/dev/null || cli_skip "no python3"
[ -r "$dict" ] || cli_skip "no $dict (Debian package wamerican)"
export HOTMOE_BIN=$bin DEMO_MODEL=$model

# ---- the demo as a user runs it ----
bash scripts/demo.sh >"$tmp/demo.out" 2>"$tmp/demo.err"
expect "demo.sh: exit 0" test $? -eq 0
expect "demo.sh: file summary" grep -q "GGUF version" "$tmp/demo.out"
expect "demo.sh: prompt echoed" grep -q "^The Debian package manager" "$tmp/demo.out"
expect "demo.sh: generation speed" grep -q "^generation: " "$tmp/demo.err"
sed -n '1,/^$/p' "$tmp/demo.out"
sed '1,/^$/d' "$tmp/demo.out"

# ---- the fixed prompts: generated words only (the prompt not echoed) ----
# stdout of demo.sh: summary lines, a blank line, then the generated text
gen() { DEMO_PROMPT=$1 bash scripts/demo.sh --no-display-prompt 2>/dev/null | sed '1,/^$/d'; }
k=0
: >"$tmp/all.txt"
while IFS= read -r p; do
  [ -n "$p" ] || continue
  k=$((k + 1))
  gen "$p" >"$tmp/gen$k.txt"
  expect "prompt $k: generated text" test -s "$tmp/gen$k.txt"
  n=$(python3 tools/train/wordrate.py --json "$tmp/gen$k.txt" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["words"])')
  expect "prompt $k: at least 10 words (got $n)" test "${n:-0}" -ge 10
  echo "--- $p"
  cat "$tmp/gen$k.txt"
  python3 tools/train/wordrate.py "$tmp/gen$k.txt"
  cat "$tmp/gen$k.txt" >>"$tmp/all.txt"
done <tools/train/prompts.txt
expect "three prompts" test "$k" -eq 3
echo "--- all three"
python3 tools/train/wordrate.py --min 0.70 "$tmp/all.txt"
expect "at least 70% dictionary words" test $? -eq 0

first=$(sed -n '1p' tools/train/prompts.txt)
gen "$first" >"$tmp/again.txt"
expect "same seed, same text" cmp -s "$tmp/gen1.txt" "$tmp/again.txt"
cli_summary demo_model
