#!/usr/bin/env bash
# plan.sh - `hotmoe plan` and the hot cache's flags as a user runs them: a learn file of the shipped demo model, the plan at
# a fixed size (one line per RAM layer, within the budget, the same text twice, also on a machine
# with less RAM than the model), the auto size
# from --vram-budget, the placement flags choosing the RAM layers, and errors answered with one
# line and exit codes 2 (usage: auto without --vram-budget, an unknown weighting, a bad curve)
# and 1 (input: a learn file of another model, a malformed file).
#   bash tests/cli/plan.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tmp=$2/plan_sh
rm -rf "$tmp"
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"
m=models/demo-moe.gguf
[ -f "$m" ] || cli_skip "no $m"

printf 'The history of the city\nOnce upon a time there was\nThe function returns\n' >"$tmp/p.txt"
"$bin" learn -m "$m" -f "$tmp/p.txt" -n 16 -t 1 -o "$tmp/l.json" 2>/dev/null
expect "learn: exit 0" test $? -eq 0

"$bin" plan -m "$m" --moe-hot-cache "$tmp/l.json" --moe-hot-cache-max-mib 2 >"$tmp/a.txt" 2>"$tmp/err"
expect "plan: exit 0" test $? -eq 0
expect "plan: header" grep -q "^hot cache plan: weighting flat, layer curve 0.5 .*budget 2.0 MiB, used" "$tmp/a.txt"
expect "plan: one line per layer" test "$(grep -c '^  layer ' "$tmp/a.txt")" -eq 4
used=$(grep -o 'used [0-9.]* MiB' "$tmp/a.txt" | grep -o '[0-9.]*')
expect "plan: within the budget" awk -v u="$used" 'BEGIN { exit !(u > 0 && u <= 2.0) }'
"$bin" plan -m "$m" --moe-hot-cache "$tmp/l.json" --moe-hot-cache-max-mib 2 >"$tmp/b.txt" 2>/dev/null
expect "plan: the same text twice" cmp -s "$tmp/a.txt" "$tmp/b.txt"
HOTMOE_RAM_MIB=1 "$bin" plan -m "$m" --moe-hot-cache "$tmp/l.json" --moe-hot-cache-max-mib 2 >"$tmp/b.txt" 2>/dev/null
expect "plan: a model bigger than the RAM is planned (its weights are never read)" cmp -s "$tmp/a.txt" "$tmp/b.txt"
"$bin" plan -m "$m" --moe-hot-cache "$tmp/l.json" --moe-hot-cache-max-mib 64 >"$tmp/c.txt" 2>/dev/null
expect "plan: a big budget takes every selected expert" grep -q "expected hit rate 100.0 %" "$tmp/c.txt"
"$bin" plan -m "$m" --moe-hot-cache "$tmp/l.json" --vram-budget 1040 --moe-hot-cache-weighting time >"$tmp/d.txt" 2>/dev/null
expect "plan: auto size from --vram-budget" grep -q "^budget: --vram-budget 1040 MiB - the placement's" "$tmp/d.txt"
expect "plan: weighting named" grep -q "weighting time, layer curve 0.5 (no timings in the file)" "$tmp/d.txt"
"$bin" plan -m "$m" --moe-hot-cache "$tmp/l.json" --moe-hot-cache-max-mib 64 -ngl 99 --n-cpu-moe 2 >"$tmp/e.txt" 2>/dev/null
expect "plan: --n-cpu-moe 2: two RAM layers" test "$(grep -c '^  layer ' "$tmp/e.txt")" -eq 2
expect "plan: --n-cpu-moe 2: layers 0 and 1" grep -q "^  layer   1:" "$tmp/e.txt"

"$bin" plan -m "$m" --moe-hot-cache "$tmp/l.json" >/dev/null 2>"$tmp/err"
expect "auto without --vram-budget: exit 2" test $? -eq 2
expect "auto without --vram-budget: says so" grep -q "give --vram-budget MiB" "$tmp/err"
"$bin" plan -m "$m" --moe-hot-cache "$tmp/l.json" --moe-hot-cache-max-mib 2 --moe-hot-cache-weighting hot >/dev/null 2>"$tmp/err"
expect "unknown weighting: exit 2" test $? -eq 2
expect "unknown weighting: names the known" grep -q "unknown weighting 'hot' (known: flat, pressure" "$tmp/err"
"$bin" plan -m "$m" --moe-hot-cache "$tmp/l.json" --moe-hot-cache-max-mib 2 --moe-hot-cache-layer-curve -1 >/dev/null 2>"$tmp/err"
expect "bad curve: exit 2" test $? -eq 2
expect "bad curve: names the flag" grep -q "moe-hot-cache-layer-curve must be a finite number >= 0" "$tmp/err"

"$bin" forge --preset tiny-olmoe --type q8_0 --no-hf -q -o "$tmp/o.gguf" || bad "forge"
"$bin" learn -m "$tmp/o.gguf" -f "$tmp/p.txt" -t 1 -o "$tmp/o.json" 2>/dev/null || bad "learn on tiny-olmoe"
"$bin" plan -m "$m" --moe-hot-cache "$tmp/o.json" --moe-hot-cache-max-mib 2 >/dev/null 2>"$tmp/err"
expect "another model's file: exit 1" test $? -eq 1
expect "another model's file: both shapes named" grep -q "is for a model of 2 layers x 8 experts, this one has 4 x 32" "$tmp/err"
head -c 100 "$tmp/l.json" >"$tmp/cut.json"
"$bin" plan -m "$m" --moe-hot-cache "$tmp/cut.json" --moe-hot-cache-max-mib 2 >/dev/null 2>"$tmp/err"
expect "malformed file: exit 1" test $? -eq 1
expect "malformed file: not valid JSON" grep -q "cut.json:.*not valid JSON" "$tmp/err"
expect "errors are one line" test "$(wc -l <"$tmp/err")" -eq 1

# the hot cache's other flags on a machine that cannot honour them: said, and bad values refused
"$bin" run -m "$m" -p "Hello" -n 2 -t 1 --moe-hot-cache "$tmp/l.json" --moe-layer-perf-out "$tmp/perf.json" >/dev/null 2>"$tmp/err"
expect "run with the cache flags: exit 0" test $? -eq 0
if [ "$(command -v nvidia-smi)" = "" ]; then
  expect "no GPU: the cache is ignored, said" grep -q "hot cache: --moe-hot-cache needs a GPU" "$tmp/err"
  expect "no GPU: no perf file, said" grep -q "moe-layer-perf-out: layer perf: counts the layers" "$tmp/err"
fi
"$bin" run -m "$m" -p "Hello" -n 2 --moe-layer-perf fast >/dev/null 2>"$tmp/err"
expect "unknown perf mode: exit 2" test $? -eq 2
expect "unknown perf mode: known ones named" grep -q "unknown mode 'fast' (known: off, update, full)" "$tmp/err"
"$bin" run -m "$m" -p "Hello" -n 2 --moe-hot-cache-policy lfu >/dev/null 2>"$tmp/err"
expect "unknown policy: exit 2" test $? -eq 2
expect "unknown policy: known ones named" grep -q "unknown policy 'lfu' (known: static, lru, lfru)" "$tmp/err"
"$bin" run -m "$m" -p "Hello" -n 2 --moe-hot-cache-update-rate 1.5 >/dev/null 2>"$tmp/err"
expect "update rate out of range: exit 2" test $? -eq 2

if [ "$(command -v nvidia-smi)" = "" ]; then
  "$bin" bench -m "$m" -p 8 -n 4 -r 1 --moe-routing-profile bench/profiles/demo-moe-heldout.json >/dev/null 2>"$tmp/err"
  expect "bench --moe-routing-profile without a GPU: refused" test $? -ne 0
  expect "bench --moe-routing-profile without a GPU: says why" grep -q "needs a GPU context" "$tmp/err"
fi

cli_summary plan
