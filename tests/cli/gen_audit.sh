#!/usr/bin/env bash
# gen_audit.sh - the generation API through the CLI (run/bench on a forged tiny model, CPU
# backend): --audit prints the decode audit line (host loop on the CPU: 0 host syncs, no
# graph), bench --audit adds the audit fields to the JSON tg row (and only then), --host-loop
# changes nothing on the CPU, a full context ends `run` with one line and exactly n_ctx - prompt
# tokens, and a seeded run is reproducible.
#   bash tests/cli/gen_audit.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$1
tmp=$2/gen_audit_sh
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"

m=$tmp/tiny-olmoe.gguf
"$bin" forge --preset tiny-olmoe --type q8_0 --no-hf -q -o "$m" || bad "forge"

"$bin" run -m "$m" -p "the cat" -n 12 --temp 0 -t 1 --audit >"$tmp/a.out" 2>"$tmp/a.err"
expect "run --audit: exit 0" test $? -eq 0
expect "run --audit: audit line" grep -Eq '^audit: backend CPU \(host loop\), 12 tokens, host syncs/token 0\.000 .*graph nodes/token 0 .* cv [0-9.]+ over 12 tokens$' "$tmp/a.err"
"$bin" run -m "$m" -p "the cat" -n 12 --temp 0 -t 1 --host-loop >"$tmp/b.out" 2>/dev/null
expect "run --host-loop: same text on the CPU" cmp -s "$tmp/a.out" "$tmp/b.out"
"$bin" run -m "$m" -p "the cat" -n 12 --temp 0 -t 1 >"$tmp/c.out" 2>"$tmp/c.err"
expect "run without --audit: no audit line" test "$(grep -c '^audit:' "$tmp/c.err")" -eq 0
for i in 1 2; do
  "$bin" run -m "$m" -p "the cat" -n 20 --temp 1.1 --repeat-penalty 1.2 -s 9 -t 1 >"$tmp/s$i.out" 2>/dev/null
done
expect "seeded run reproducible" cmp -s "$tmp/s1.out" "$tmp/s2.out"

# a full context: -c 16, the prompt's tokens + generated = 16
"$bin" run -m "$m" -p "the cat" -n -1 -c 16 --temp 0 -t 1 --no-display-prompt >"$tmp/f.out" 2>"$tmp/f.err"
expect "context full: exit 0" test $? -eq 0
expect "context full: says so" grep -q "context full (16 tokens)" "$tmp/f.err"
np=$("$bin" tokenize -m "$m" -p "the cat" --ids 2>/dev/null | tr -cd ',' | wc -c)
ng=$(grep -Eo '^generation: +[0-9]+' "$tmp/f.err" | grep -Eo '[0-9]+$')
expect "context full: n_ctx - prompt tokens ($ng + $((np + 1)))" test "$((ng + np + 1))" -eq 16

"$bin" bench -m "$m" -p 0 -n 8 -r 1 -t 1 --audit -o json >"$tmp/j" 2>"$tmp/j.err"
expect "bench --audit: exit 0" test $? -eq 0
expect "bench --audit: audit line on stderr" grep -q '^audit: backend CPU (host loop), 1024 tokens' "$tmp/j.err"
check_json() {
  python3 - "$1" "$2" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
tg = [r for r in rows if r["test"].startswith("tg")][0]
keys = ("decode_loop", "audit_tokens", "host_syncs_per_token", "graph_nodes_per_token", "tg_cv")
if sys.argv[2] == "with":
    for k in keys: assert k in tg, k
    assert tg["decode_loop"] == "host" and tg["audit_tokens"] == 1024, tg
    assert tg["host_syncs_per_token"] == 0 and tg["graph_nodes_per_token"] == 0, tg
    assert tg["tg_cv"] >= 0 and tg["backends"] == "CPU"
else:
    for k in keys: assert k not in tg, k
PY
}
expect "bench --audit: JSON audit fields" check_json "$tmp/j" with
"$bin" bench -m "$m" -p 0 -n 8 -r 1 -t 1 -o json >"$tmp/k" 2>/dev/null
expect "bench: no audit fields without --audit on the CPU" check_json "$tmp/k" without

cli_summary gen_audit.sh
