#!/usr/bin/env bash
# bench.sh - `hotmoe bench` on a forged tiny model: the llama-bench style markdown table (header,
# alignment row, one ppN and one tgN row with "mean ± sd", size/params columns), the JSON array
# (fields, sample counts = repetitions, mean and sd recomputed from the samples), and bad flags.
#   bash tests/cli/bench.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$1
tmp=$2/bench_sh
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"

m=$tmp/tiny-olmoe.gguf
"$bin" forge --preset tiny-olmoe --type q8_0 --no-hf -q -o "$m" || bad "forge"

"$bin" bench -m "$m" -p 32 -n 8 -r 3 -t 2 >"$tmp/md" 2>"$tmp/md.err"
expect "md: exit 0" test $? -eq 0
expect "md: 4 lines" test "$(wc -l <"$tmp/md")" -eq 4
expect "md: header" grep -q '^| model  *| *size | *params | backend  *| threads | *test | *t/s |$' "$tmp/md"
expect "md: pp row" grep -Eq '^\| olmoe 1\.18 M q8_0 +\| +1\.21 MiB \| +1\.18 M \| CPU +\| +2 \| +pp32 \| +[0-9]+\.[0-9]{2} ± [0-9]+\.[0-9]{2} \|$' "$tmp/md"
expect "md: tg row" grep -Eq '^\| olmoe .*\| +tg8 \| +[0-9]+\.[0-9]{2} ± [0-9]+\.[0-9]{2} \|$' "$tmp/md"

"$bin" bench -m "$m" -p 16 -n 4 -r 4 -t 1 -o json >"$tmp/json" 2>"$tmp/json.err"
expect "json: exit 0" test $? -eq 0
check_json() {
  python3 - "$1" <<'EOF'
import json, math, statistics, sys
rows = json.load(open(sys.argv[1]))
assert [r["test"] for r in rows] == ["pp16", "tg4"], rows
for r in rows:
    for k in ("model_filename", "model_type", "model_size", "model_n_params", "n_batch", "n_ubatch",
              "n_threads", "type_k", "type_v", "n_prompt", "n_gen", "avg_ns", "stddev_ns",
              "avg_ts", "stddev_ts", "samples_ns", "samples_ts"):
        assert k in r, k
    assert r["n_threads"] == 1
    assert len(r["samples_ts"]) == 4 and len(r["samples_ns"]) == 4
    n = r["n_prompt"] + r["n_gen"]
    for ts, ns in zip(r["samples_ts"], r["samples_ns"]):
        assert abs(ts - n / (ns * 1e-9)) <= 1e-3 * ts, (ts, ns)
    assert math.isclose(r["avg_ts"], statistics.mean(r["samples_ts"]), rel_tol=1e-9)
    assert math.isclose(r["stddev_ts"], statistics.stdev(r["samples_ts"]), rel_tol=1e-9)
assert rows[0]["n_prompt"] == 16 and rows[0]["n_gen"] == 0
assert rows[1]["n_prompt"] == 0 and rows[1]["n_gen"] == 4
assert rows[0]["model_size"] == 1266176 and rows[0]["model_n_params"] == 1182848
EOF
}
# model_size/model_n_params: the sum of tensor bytes / elements of tiny-olmoe q8_0, as
# `hotmoe inspect` reports them (forge --list: 1.18M params, 1.21 MiB of q8_0 tensor data).
expect "json: fields and statistics" check_json "$tmp/json"

"$bin" bench -m "$m" -p 0 -n 2 -r 1 >"$tmp/tg" 2>/dev/null
expect "-p 0: only tg" test "$(grep -c '| *tg2 |' "$tmp/tg")" -eq 1 -a "$(grep -c 'pp' "$tmp/tg")" -eq 0

# sweeps as llama-bench: comma lists and repeated flags, every combination, rows as they finish
"$bin" bench -m "$m" -m "$m" -p 8,16 -n 4 -t 1,2 -r 1 -o jsonl >"$tmp/sweep" 2>"$tmp/sweep.err"
expect "sweep: exit 0" test $? -eq 0
check_sweep() {
  python3 - "$1" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 2 * 2 * 3, len(rows)  # 2 models x 2 thread counts x (pp8, pp16, tg4)
assert [r["test"] for r in rows[:3]] == ["pp8", "pp16", "tg4"], rows[:3]
assert [r["n_threads"] for r in rows] == [1] * 3 + [2] * 3 + [1] * 3 + [2] * 3
assert all(r["n_depth"] == 0 for r in rows)
EOF
}
expect "sweep: 12 rows in llama-bench's order (jsonl)" check_sweep "$tmp/sweep"
"$bin" bench -m "$m" -p 0 -n 0 -pg 8,4 -d 0,16 -r 2 -o csv >"$tmp/csv" 2>/dev/null
expect "-pg -d csv: exit 0" test $? -eq 0
check_csv() {
  python3 - "$1" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [r["test"] for r in rows] == ["pp8+tg4", "pp8+tg4 @ d16"], rows
assert rows[1]["n_depth"] == "16" and rows[0]["n_prompt"] == "8" and rows[0]["n_gen"] == "4"
assert float(rows[0]["avg_ts"]) > 0
EOF
}
expect "-pg -d: a pp+tg test at each depth (csv)" check_csv "$tmp/csv"
"$bin" bench -m "$m" -p 8 -n 0 -ub 4,8 -r 1 >"$tmp/ub" 2>/dev/null
expect "-ub list: an n_ubatch column, one row each" test "$(grep -c '| *[48] | *pp8 |' "$tmp/ub")" -eq 2
"$bin" bench -m "$m" -pg 8 >/dev/null 2>"$tmp/e6"
expect "-pg needs PP,TG: exit 2" test $? -eq 2

one_line() { test "$(wc -l <"$1")" -eq 1; }
"$bin" bench -m "$m" -o xml >/dev/null 2>"$tmp/e1"
expect "bad -o: exit 2" test $? -eq 2
expect "bad -o: one line" one_line "$tmp/e1"
"$bin" bench -m "$m" -r 0 >/dev/null 2>"$tmp/e2"
expect "-r 0: exit 2" test $? -eq 2
"$bin" bench -m "$m" --temp 1 >/dev/null 2>"$tmp/e3"
expect "sampling flag refused: exit 2" test $? -eq 2
expect "sampling flag refused: one line" one_line "$tmp/e3"
"$bin" bench -m "$m" -p 64 -n 0 -c 32 >/dev/null 2>"$tmp/e4"
expect "test longer than -c: exit 1" test $? -eq 1
"$bin" bench -m "$tmp/none.gguf" >/dev/null 2>"$tmp/e5"
expect "missing model: exit 1" test $? -eq 1
expect "missing model: one line" one_line "$tmp/e5"

cli_summary bench.sh
