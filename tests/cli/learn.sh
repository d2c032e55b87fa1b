#!/usr/bin/env bash
# learn.sh - `hotmoe learn` as a user runs it: a learn file from a prompt file on a forged tiny
# model (schema fields, per-layer hits = tokens x n_expert_used, prompts counted, blank lines
# skipped), identical files for 1 and 2 threads and for repeated runs, the tracer summary with
# --expert-trace-stats, and usage/input errors answered with one line and exit codes 2/1; the
# tracer flags on run, chat, bench and perplexity (summary, JSON/CSV output, bad flag).
#   bash tests/cli/learn.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tmp=$2/learn_sh
rm -rf "$tmp"
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"

"$bin" forge --preset tiny-olmoe --type q8_0 --no-hf -q -o "$tmp/m.gguf" || { echo "FAIL: forge"; exit 1; }
printf 'The ferry left the north bank at seven in the morning.\n\n   \nMost of the passengers were regulars.\r\nA market opened in the square at eight.\n' >"$tmp/p.txt"

"$bin" learn -m "$tmp/m.gguf" -f "$tmp/p.txt" -o "$tmp/a.json" -n 5 -t 1 2>"$tmp/err"
expect "learn: exit 0" test $? -eq 0
expect "learn: says where" grep -q "3 prompts, .* -> $tmp/a.json" "$tmp/err"
expect "learn: format" grep -q '"format": "hotmoe-expert-usage"' "$tmp/a.json"
expect "learn: version" grep -q '"version": 1' "$tmp/a.json"
expect "learn: 3 prompts (blank lines skipped)" grep -q '"prompts": 3,' "$tmp/a.json"
expect "learn: arch" grep -q '"arch": "olmoe"' "$tmp/a.json"
expect "learn: n_expert" grep -q '"n_expert": 8,' "$tmp/a.json"
expect "learn: nothing rejected" grep -q '"rejected": 0,' "$tmp/a.json"
expect "learn: 2 layers" test "$(grep -c '"layer": ' "$tmp/a.json")" -eq 2
# every layer: expert_hits_total = tokens x n_expert_used (2), and the expert array sums to it
awk '/"tokens":/ {gsub(/[^0-9]/, "", $2); t = $2}
     /"expert_hits_total":/ {gsub(/[^0-9]/, "", $2); h = $2; if (h != 2 * t || t == 0) bad = 1}
     /"experts": \[/ {if (inlayer) {sum = 0; arr = 1}; next}
     arr && /\]/ {arr = 0; if (sum != h) bad = 1; n++}
     arr {gsub(/[^0-9]/, "", $1); sum += $1}
     /"layers": \[/ {inlayer = 1}
     END {exit (bad || n != 2)}' "$tmp/a.json"
expect "learn: hits = tokens x 2 and expert arrays sum to them" test $? -eq 0

"$bin" learn -m "$tmp/m.gguf" -f "$tmp/p.txt" -o "$tmp/b.json" -n 5 -t 2 2>/dev/null
expect "learn: same file with 2 threads" cmp -s "$tmp/a.json" "$tmp/b.json"
"$bin" learn -m "$tmp/m.gguf" -f "$tmp/p.txt" -o "$tmp/c.json" -n 5 -t 1 2>/dev/null
expect "learn: same file when repeated" cmp -s "$tmp/a.json" "$tmp/c.json"
"$bin" learn -m "$tmp/m.gguf" -f "$tmp/p.txt" -o "$tmp/d.json" -t 1 2>/dev/null
expect "learn: -n 0 counts fewer tokens" test "$(grep -m1 total_tokens "$tmp/d.json")" != "$(grep -m1 total_tokens "$tmp/a.json")"

"$bin" learn -m "$tmp/m.gguf" -f "$tmp/p.txt" -o "$tmp/e.json" --expert-trace-stats --expert-trace-per-layer 2>"$tmp/err"
expect "learn: stats summary" grep -q "=== Expert Usage Statistics ===" "$tmp/err"
expect "learn: per-layer summary" grep -q "Layer 1: " "$tmp/err"
LLAMA_EXPERT_TRACE_STATS=1 "$bin" learn -m "$tmp/m.gguf" -f "$tmp/p.txt" -o "$tmp/e.json" 2>"$tmp/err"
expect "learn: env LLAMA_EXPERT_TRACE_STATS" grep -q "=== Expert Usage Statistics ===" "$tmp/err"

# errors: one line, exit 2 for usage, 1 for bad input
"$bin" learn -m "$tmp/m.gguf" -f "$tmp/p.txt" 2>"$tmp/err"
expect "no -o: exit 2" test $? -eq 2
expect "no -o: message" grep -q "hotmoe learn: -o FILE is required" "$tmp/err"
expect "no -o: one line" test "$(wc -l <"$tmp/err")" -eq 1
"$bin" learn -m "$tmp/m.gguf" -f "$tmp/p.txt" -o "$tmp/x.json" --expert-trace-bogus 2>"$tmp/err"
expect "bad tracer flag: exit 2" test $? -eq 2
expect "bad tracer flag: named" grep -q "expert-trace-bogus" "$tmp/err"
LLAMA_EXPERT_TRACE_STATS=yes "$bin" learn -m "$tmp/m.gguf" -f "$tmp/p.txt" -o "$tmp/x.json" 2>"$tmp/err"
expect "bad env: exit 2" test $? -eq 2
expect "bad env: named" grep -q "LLAMA_EXPERT_TRACE_STATS must be 0 or 1" "$tmp/err"
"$bin" learn -m "$tmp/m.gguf" -f "$tmp/none.txt" -o "$tmp/x.json" 2>"$tmp/err"
expect "missing prompts: exit 1" test $? -eq 1
expect "missing prompts: one line" test "$(wc -l <"$tmp/err")" -eq 1
printf '\n  \n' >"$tmp/empty.txt"
"$bin" learn -m "$tmp/m.gguf" -f "$tmp/empty.txt" -o "$tmp/x.json" 2>"$tmp/err"
expect "no prompts: exit 1" test $? -eq 1
expect "no prompts: message" grep -q "has no prompts" "$tmp/err"
"$bin" learn -m "$tmp/m.gguf" -f "$tmp/p.txt" -o /nonexistent-dir/x.json 2>"$tmp/err"
expect "unwritable output: exit 1" test $? -eq 1
expect "unwritable output: named" grep -q "/nonexistent-dir/x.json" "$tmp/err"
"$bin" learn -m "$tmp/nomodel.gguf" -f "$tmp/p.txt" -o "$tmp/x.json" 2>"$tmp/err"
expect "missing model: exit 1" test $? -eq 1

# ---- the tracer flags on the other inference commands ----
"$bin" run -m "$tmp/m.gguf" -p "The ferry left" -n 4 -t 1 --expert-trace-stats >/dev/null 2>"$tmp/err"
expect "run --expert-trace-stats: exit 0" test $? -eq 0
expect "run: summary" grep -q "Expert Usage Statistics" "$tmp/err"
printf 'hello\nhow are you\n' | "$bin" chat -m "$tmp/m.gguf" -n 4 -t 1 \
  --expert-trace-output "$tmp/chat.json" >/dev/null 2>"$tmp/err"
expect "chat --expert-trace-output: exit 0" test $? -eq 0
expect "chat: two user turns are two prompts" grep -q '"prompts": 2' "$tmp/chat.json"
"$bin" bench -m "$tmp/m.gguf" -r 1 -p 8 -n 4 -t 1 --expert-trace-output "$tmp/bench.csv" \
  >/dev/null 2>"$tmp/err"
expect "bench --expert-trace-output: exit 0" test $? -eq 0
expect "bench: CSV header" grep -q "^layer,expert,hits,calls,tokens" "$tmp/bench.csv"
LLAMA_EXPERT_TRACE_STATS=1 "$bin" perplexity -m "$tmp/m.gguf" -f "$tmp/p.txt" -c 8 -t 1 \
  >/dev/null 2>"$tmp/err"
expect "perplexity with LLAMA_EXPERT_TRACE_STATS=1: exit 0" test $? -eq 0
expect "perplexity: summary" grep -q "Expert Usage Statistics" "$tmp/err"
"$bin" bench -m "$tmp/m.gguf" --expert-trace-bogus >/dev/null 2>"$tmp/err"
expect "bench bad tracer flag: exit 2" test $? -eq 2
expect "bench bad tracer flag: named" grep -q "expert-trace-bogus" "$tmp/err"

cli_summary learn.sh
