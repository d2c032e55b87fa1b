#!/usr/bin/env bash
# batched_bench.sh - `hotmoe batched-bench` on a forged tiny model: one row per -npl with
# llama-batched-bench's columns and N_KV = B x (PP + TG), also for more sequences than each has
# positions (the batch is all sequences' room, not one's); bad lists refused (2); -npl larger
# than the batch and a sequence longer than -c refused with the reason (1).
#   bash tests/cli/batched_bench.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$1
tmp=$2/batched_bench_sh
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"

m=$tmp/q.gguf
"$bin" forge --preset tiny-qwen3moe --type q8_0 --no-hf -q -o "$m" || bad "forge"
"$bin" batched-bench -m "$m" -t 2 -npp 12 -ntg 6 -npl 1,2,4 >"$tmp/out.txt" 2>"$tmp/err.txt"
expect "runs (0)" test $? -eq 0
expect "the header" grep -q "|    PP |     TG |    B |   N_KV |" "$tmp/out.txt"
for b in 1 2 4; do
  expect "a row for B=$b with N_KV $((b * 18))" \
    grep -Eq "^\|    12 \|      6 \|    $b \| +$((b * 18)) \|" "$tmp/out.txt"
done
expect "S_TG positive" awk -F'|' '/^\|    12/ { if ($9 + 0 <= 0) exit 1 }' "$tmp/out.txt"
# more sequences than positions each: the default batch holds every sequence's token of a step
"$bin" batched-bench -m "$m" -t 2 -npp 4 -ntg 4 -npl 64 >"$tmp/many.txt" 2>"$tmp/many.err"
expect "-npl 64 of 8 positions each runs (0)" test $? -eq 0
expect "... its row, N_KV 512" grep -Eq "^\|     4 \|      4 \|   64 \| +512 \|" "$tmp/many.txt"
"$bin" batched-bench -m "$m" -npl 0 >/dev/null 2>"$tmp/e1.txt"
expect "-npl 0: usage error (2)" test $? -eq 2
"$bin" batched-bench -m "$m" -npl 2,x >/dev/null 2>"$tmp/e2.txt"
expect "-npl 2,x: usage error (2)" test $? -eq 2
"$bin" batched-bench -m "$m" -t 2 -npp 4 -ntg 4 -npl 8 -b 4 >/dev/null 2>"$tmp/e3.txt"
expect "-npl above -b: refused (1)" test $? -eq 1
expect "-npl above -b: says why" grep -q "larger than the batch" "$tmp/e3.txt"
"$bin" batched-bench -m "$m" -t 2 -npp 30 -ntg 4 -npl 2 -c 40 >/dev/null 2>"$tmp/e4.txt"
expect "a sequence longer than its share of -c: refused (1)" test $? -eq 1
expect "... says why" grep -q "does not fit" "$tmp/e4.txt"
cli_summary batched_bench
